"""Fading models behind one seam (wireless.fading): Nakagami-m, Rician-K, shadowing.

Each model's P_err against (a) the packet-level Monte Carlo of the law it assumes (log-normal
interference, the model's fading), over distances, interferer counts and SINR thresholds;
(b) the scipy quad reference (wireless.reference, written from scipy.stats' laws); the limit
cases (m = 1, K = 0: Rayleigh, in P_err and in the draws of one key; shadowing 0: none); the
draws' mean and variance against the distributions'. MC tolerances are 5 binomial / sample
standard deviations (false-failure odds ~1e-6 each).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from pfedwn_jax import ExperimentConfig
from pfedwn_jax.experiment.federation import channel_params, single_target_federation
from pfedwn_jax.wireless import (
    MOMENT_MODES,
    ChannelParams,
    Fading,
    draw_power,
    error_probability,
    interferer_moments,
    perr_ceiling,
    physical_received,
    shadowing_db,
    simulate_links,
)
from pfedwn_jax.wireless import fading as fd
from pfedwn_jax.wireless import reference as ref
from pfedwn_jax.wireless.links import physical_sinr

MODELS = [("nakagami", 0.6), ("nakagami", 2.5), ("rician", 1.0), ("rician", 8.0)]
RAYLEIGH_LIMITS = [("nakagami", 1.0), ("rician", 0.0)]
QUICK_POINTS = [(1, 5.0), (4, 1.0), (10, 20.0), (4, 5.0)]  # (interferers, threshold) per model


def _params(kind, p, **kw):
    return ChannelParams(fading=Fading.of(kind, p), **kw)


def _layout(n, seed=3):
    """A target and n neighbors, the first at ~2-20 m (so P_err spans its range)."""
    rng = np.random.default_rng(seed)
    t, nb = rng.uniform(0, 50, 2), rng.uniform(0, 50, (n, 2))
    nb[0] = t + rng.uniform(1.5, 14.0, 2)
    return t, nb


def _assert_rate(successes, p_fail, draws):
    rate = 1.0 - np.asarray(successes).mean(0)
    sd = np.sqrt(np.maximum(p_fail * (1 - p_fail), 1.0 / draws) / draws)
    assert np.all(np.abs(rate - p_fail) <= 5 * sd), (rate, p_fail, sd)


# ------------------------------------------------------------------ P_err vs Monte Carlo
def _check_formula_against_mc(kind, p, n, gamma_th, draws, seed):
    params = _params(kind, p)
    t, nb = _layout(n, seed)
    for moments in ("paper", "physical"):
        perr = np.asarray(error_probability(t, nb, gamma_th, params, moments=moments), float)
        key = jax.random.key(seed)
        ok = simulate_links(
            key, t, nb, gamma_th, draws, params, interference="lognormal", moments=moments
        )
        _assert_rate(ok, perr, draws)


@pytest.mark.parametrize(
    "kind,p,n,gamma_th",
    [
        (*m, *g) if i in (0, 3) else pytest.param(*m, *g, marks=pytest.mark.slow)
        for i, (m, g) in enumerate(zip(MODELS, QUICK_POINTS, strict=True))
    ],
)
def test_perr_within_monte_carlo_error(kind, p, n, gamma_th):
    """Quick tier: a Nakagami and a Rician model at one (interferers, threshold) point of the
    grid, 20,000 draws (5 sigma <= 0.018 at P_err 0.5, 0.005 at 0.03); the other two points
    and the whole grid at 400,000 draws in the slow tier (each model is also checked against
    scipy's quadrature in the quick tier)."""
    _check_formula_against_mc(kind, p, n, gamma_th, 20_000, seed=n)


@pytest.mark.slow
@pytest.mark.parametrize("kind,p", MODELS + RAYLEIGH_LIMITS)
@pytest.mark.parametrize("n", [1, 3, 10, 30])
@pytest.mark.parametrize("gamma_th", [0.5, 5.0, 50.0])
def test_perr_within_monte_carlo_error_with_400k_draws(kind, p, n, gamma_th):
    _check_formula_against_mc(kind, p, n, gamma_th, 400_000, seed=7 * n + 1)


@pytest.mark.parametrize("kind,p", [*MODELS, ("rayleigh", 1.0)])
def test_packet_level_draws_match_the_survival_function(kind, p):
    """One link, no interferer: the packet-level simulator fails iff the best of F
    sub-channels has u < max(b, kappa), probability P(u < max(b, kappa))^F from
    `fading.survival`: the draws and the law agree."""
    params = _params(kind, p, num_subchannels=3)
    t, nb = np.zeros(2), np.array([[9.0, 0.0], [30.0, 0.0]])
    draws = 40_000
    ok = simulate_links(jax.random.key(1), t, nb, 5.0, draws, params, valid=np.array([1, 0], bool))
    c = float(ref.received_power_scale(np.array(9.0), params))
    kappa = 5.0 * params.noise_w / (c * params.fading.gamma)
    u_min = max(params.fading_threshold**2 / params.fading.gamma, kappa)
    fail = float(1.0 - fd.survival(params.fading, np.float32(u_min))) ** 3
    _assert_rate(np.asarray(ok)[:, :1], np.array([fail]), draws)


# --------------------------------------------------------------------- scipy reference
@pytest.mark.parametrize("kind,p", [*MODELS, ("nakagami", 12.0), ("rician", 25.0)])
@pytest.mark.parametrize("moments", MOMENT_MODES)
def test_perr_matches_scipy_quad(kind, p, moments):
    params = _params(kind, p)
    t, nb = _layout(12, seed=5)
    for gamma_th in (0.5, 5.0, 60.0):
        got = np.asarray(error_probability(t, nb, gamma_th, params, moments=moments), float)
        want = ref.error_probability_reference(t, nb, gamma_th, params, moments)
        np.testing.assert_allclose(got, want, atol=2e-6, err_msg=f"gamma_th={gamma_th}")


@pytest.mark.parametrize("kind,p", MODELS)
def test_survival_and_interferer_moments_match_scipy(kind, p):
    params = _params(kind, p)
    u = np.array([0.0, 0.05, 0.5, 1.0, 2.0, 4.0, 9.0])
    law = ref.amplitude_law(params)  # amplitude h: P(u >= x) = P(h >= sqrt(x Gamma))
    np.testing.assert_allclose(
        np.asarray(fd.survival(params.fading, u), float),
        law.sf(np.sqrt(u * float(params.fading.gamma))),
        rtol=2e-5,
        atol=1e-7,
    )
    for moments in MOMENT_MODES:
        got = np.asarray(interferer_moments(params, moments), float)
        np.testing.assert_allclose(got, ref.moment_coefficients(params, moments), rtol=2e-5)
    assert perr_ceiling(params) == pytest.approx(law.sf(float(params.fading_threshold)), 1e-5)


# ------------------------------------------------------------------------- limit cases
@pytest.mark.parametrize(  # Nakagami's quadrature compiles slowly: its limit in the slow tier
    "kind,p", [pytest.param(*RAYLEIGH_LIMITS[0], marks=pytest.mark.slow), RAYLEIGH_LIMITS[1]]
)
def test_rayleigh_limits_equal_rayleigh(kind, p):
    ray, other = ChannelParams(), _params(kind, p)
    t, nb = _layout(10)
    for moments in MOMENT_MODES:
        a = error_probability(t, nb, 5.0, ray, moments=moments)
        b = error_probability(t, nb, 5.0, other, moments=moments)
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)
    key = jax.random.key(4)
    np.testing.assert_array_equal(
        draw_power(other.fading, key, (1000, 14), np.float32),
        draw_power(ray.fading, key, (1000, 14), np.float32),
    )
    np.testing.assert_array_equal(
        simulate_links(key, t, nb, 5.0, 200, other), simulate_links(key, t, nb, 5.0, 200, ray)
    )
    pos = np.concatenate([t[None], nb])
    rx, tx = np.zeros(10, np.int32), np.arange(1, 11, dtype=np.int32)
    on = np.ones(11, bool)
    np.testing.assert_array_equal(
        physical_received(key, pos, rx, tx, on, 5.0, other),
        physical_received(key, pos, rx, tx, on, 5.0, ray),
    )


def test_zero_shadowing_equals_none():
    t, nb = _layout(8)
    key = jax.random.key(2)
    zero = shadowing_db(key, np.zeros(8, np.int32), np.arange(1, 9), 0.0)
    assert np.all(np.asarray(zero) == 0.0)
    np.testing.assert_array_equal(
        error_probability(t, nb, 5.0, shadow_db=zero), error_probability(t, nb, 5.0)
    )
    pos = np.concatenate([t[None], nb])
    rx, tx, on = np.zeros(8, np.int32), np.arange(1, 9, dtype=np.int32), np.ones(9, bool)
    zero_params = ChannelParams(shadowing_db=0.0)
    np.testing.assert_array_equal(
        physical_received(key, pos, rx, tx, on, 5.0, zero_params, shadow_key=jax.random.key(9)),
        physical_received(key, pos, rx, tx, on, 5.0),
    )
    none = ExperimentConfig(algorithms=("local",))
    fed0 = single_target_federation(ExperimentConfig(algorithms=("local",), shadowing_db=0.0))
    np.testing.assert_array_equal(fed0.perr, single_target_federation(none).perr)


def test_shadowing_is_symmetric_normal_and_moves_perr():
    key = jax.random.key(0)
    i, j = np.meshgrid(np.arange(60), np.arange(60), indexing="ij")
    x = np.asarray(shadowing_db(key, i, j, 6.0))
    np.testing.assert_array_equal(x, x.T)
    off = x[np.triu_indices(60, 1)]
    assert abs(off.mean()) < 5 * 6.0 / np.sqrt(off.size)
    assert abs(off.std() / 6.0 - 1.0) < 5 / np.sqrt(2 * off.size)
    t, nb = _layout(6)
    shadow = np.array([6.0, 0, 0, 0, 0, 0])  # the first link 6 dB stronger
    params = ChannelParams(shadowing_db=6.0)
    got = np.asarray(error_probability(t, nb, 5.0, params, shadow_db=shadow), float)
    want = ref.error_probability_reference(t, nb, 5.0, params, "paper", shadow_db=shadow)
    np.testing.assert_allclose(got, want, atol=2e-6)
    assert got[0] < np.asarray(error_probability(t, nb, 5.0))[0]
    fed = single_target_federation(ExperimentConfig(algorithms=("local",), shadowing_db=8.0))
    assert not np.allclose(fed.perr, single_target_federation(ExperimentConfig()).perr)


# ------------------------------------------------------------------------------ draws
@pytest.mark.parametrize("kind,p", [*MODELS, ("nakagami", 0.5), ("nakagami", 1.0), ("rician", 0.0)])
def test_draws_have_the_distributions_mean_and_variance(kind, p):
    fading = Fading.of(kind, p, gamma=2.0)
    u = np.asarray(draw_power(fading, jax.random.key(11), (200_000,), np.float32), np.float64)
    mean, var = (float(v) for v in fd.power_moments(fading))
    n = u.size
    assert abs(u.mean() - mean) <= 5 * np.sqrt(u.var() / n)
    m4 = np.mean((u - u.mean()) ** 4)
    assert abs(u.var() - var) <= 5 * np.sqrt((m4 - u.var() ** 2) / n), (u.var(), var)
    # and the whole law: Kolmogorov-Smirnov against the survival function
    grid = np.quantile(u, np.linspace(0.01, 0.99, 25))
    sf = np.asarray(fd.survival(fading, grid.astype(np.float32)), float)
    assert np.max(np.abs((u[:, None] >= grid).mean(0) - sf)) < 5 * 0.5 / np.sqrt(n)


def test_sinr_draw_is_the_success_draw():
    t, nb = _layout(10)
    pos = np.concatenate([t[None], nb])
    rx, tx, on = np.zeros(10, np.int32), np.arange(1, 11, dtype=np.int32), np.ones(11, bool)
    params = _params("rician", 3.0)
    for seed in range(3):
        key = jax.random.key(seed)
        sinr = np.asarray(physical_sinr(key, pos, rx, tx, on, 5.0, params))
        got = np.asarray(physical_received(key, pos, rx, tx, on, 5.0, params))
        near = np.abs(sinr / 5.0 - 1.0) < 1e-5  # rounding at the threshold
        np.testing.assert_array_equal(got[~near], (sinr >= 5.0)[~near])


# ------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "kw,match",
    [
        ({"fading": "weibull"}, "fading must be one of"),
        ({"fading": "nakagami", "fading_param": 0.3}, "fading_param"),
        ({"fading": "rician", "fading_param": 40.0}, "fading_param"),
        ({"shadowing_db": -2.0}, "shadowing_db"),
        ({"channel": {"shadowing_db": 4.0}}, "channel.shadowing_db"),
    ],
)
def test_bad_fading_settings_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        ExperimentConfig(**kw)


def test_config_builds_the_channel():
    params = channel_params(
        ExperimentConfig(fading="rician", fading_param=4, channel={"fading_gamma": 3.0})
    )
    assert params.fading == Fading("rician", 4.0, 3.0)
    assert channel_params(ExperimentConfig(fading="nakagami")).fading.param == 1.0


# ---------------------------------------------------------------------------- sweeps
def test_runs_differing_in_the_fading_parameter_share_one_program():
    """The fading parameter is a dynamic leaf of the link model: a sweep over Rician K with
    physical links per round is one program, and each run's link draws are those of its own
    `run()` (its own K)."""
    from helpers import VARIED_RUN, sweep_equals_runs

    config = ExperimentConfig(
        **{**VARIED_RUN, "rounds": 3, "eps": 0.02}, algorithms=("local",),
        link_model="physical", fading="rician",
    )  # fmt: skip
    grid = {"fading_param": [0.0, 8.0]}
    result = sweep_equals_runs(config, grid, "link_received", skip=1)  # K = 8 (0: Rayleigh)
    assert result.num_runs == 2


@pytest.mark.slow
def test_moving_nodes_under_nakagami_fading_sweep_in_one_program():
    """Mobility re-computes P_err and re-selects inside the compiled round with the run's own
    (traced) Nakagami m: a sweep over m is one program, each run equal to its own `run()`."""
    from helpers import VARIED_RUN, sweep_equals_runs

    config = ExperimentConfig(
        **{**VARIED_RUN, "rounds": 2}, algorithms=("local",), mobility="waypoint", speed=3.0,
        reselect_every=1, link_model="bernoulli", fading="nakagami",
    )  # fmt: skip
    result = sweep_equals_runs(config, {"fading_param": [0.7, 3.0]}, "neighbor_mask")
    assert result.num_runs == 2
