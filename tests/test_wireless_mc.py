"""Monte Carlo checks: the packet-level simulator against exact results, the log-normal
simulator against the P_err formula, and the interference moments against sampled models.

Tolerances are 5 binomial / sample standard deviations (false-failure odds ~1e-6 each).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate

from pfedwn_jax.wireless import (
    MOMENT_MODES,
    ChannelParams,
    error_probability,
    interferer_moments,
    path_gain,
    simulate_links,
)

P = ChannelParams()


def _assert_rate(successes, p_fail, draws):
    """Empirical failure rate within 5 sigma of p_fail (sigma floored at one draw)."""
    rate = 1.0 - np.asarray(successes).mean(0)
    sd = np.sqrt(np.maximum(p_fail * (1 - p_fail), 1.0 / draws) / draws)
    assert np.all(np.abs(rate - p_fail) <= 5 * sd), (rate, p_fail)


@pytest.mark.parametrize("moments", MOMENT_MODES)
def test_lognormal_simulation_reproduces_formula(moments):
    rng = np.random.default_rng(3)
    t, nb = rng.uniform(0, 50, 2), rng.uniform(0, 50, (10, 2))
    nb[0] = t + np.array([2.0, 1.0])
    draws = 40_000
    perr = np.asarray(error_probability(t, nb, 5.0, moments=moments), float)
    ok = simulate_links(
        jax.random.key(0), t, nb, 5.0, draws, interference="lognormal", moments=moments
    )
    assert ok.shape == (draws, 10)
    _assert_rate(ok, perr, draws)


@pytest.mark.parametrize("params", [P, ChannelParams(tx_power_w=3e-4)])
def test_physical_without_interferers_matches_closed_form(params):
    # One neighbor: failure iff max of F amplitudes^2/Gamma < max(b, kappa).
    t, nb = np.zeros(2), np.array([[24.0, 18.0]])  # 30 m
    gamma_th, draws = 10.0, 40_000
    c = params.tx_power_w * float(path_gain(30.0, params))
    kappa = gamma_th * params.noise_w / (c * params.fading.gamma)
    b = params.fading_threshold**2 / params.fading.gamma
    p_fail = (1 - math.exp(-max(b, kappa))) ** params.num_subchannels
    ok = simulate_links(jax.random.key(1), t, nb, gamma_th, draws, params)
    _assert_rate(ok, np.array([p_fail]), draws)


def _one_interferer_failure(c_s, c_r, gamma_th, params):
    """Exact failure probability of link s with a single interferer r (scipy quad)."""
    f, g = params.num_subchannels, params.fading.gamma
    b = params.fading_threshold**2 / g
    q = (1 - (1 - math.exp(-b)) ** f) / f

    def interferer_exceeds(y):  # P(W > y), W = (interferer's power on f*) / (c_r Gamma)
        if y < 0:
            return 1.0
        return q if y < b else (1 - (1 - math.exp(-y)) ** f) / f

    def integrand(u):  # signal max^2/Gamma = u has density F(1-e^-u)^(F-1) e^-u
        y = (c_s * u / gamma_th - params.noise_w / g) / c_r
        return f * (1 - math.exp(-u)) ** (f - 1) * math.exp(-u) * interferer_exceeds(y)

    u_kink = b * c_r / c_s * gamma_th  # where y crosses b (plus a negligible noise shift)
    val = integrate.quad(
        integrand, b, b + 60, points=[u_kink] if b < u_kink < b + 60 else None, limit=200
    )[0]
    return (1 - math.exp(-b)) ** f + val


def test_physical_with_one_interferer_matches_exact_integral():
    t = np.zeros(2)
    # the third slot is padding right next to the target: it must neither interfere nor succeed
    nb = np.array([[10.0, 0.0], [0.0, 13.0], [0.5, 0.0]])
    valid = np.array([True, True, False])
    gamma_th, draws = 5.0, 40_000
    c = P.tx_power_w * np.asarray(path_gain(jnp.array([10.0, 13.0]), P), float)
    expected = np.array(
        [
            _one_interferer_failure(c[0], c[1], gamma_th, P),
            _one_interferer_failure(c[1], c[0], gamma_th, P),
        ]
    )
    assert expected.min() > 0.13  # interference matters beyond the non-transmission floor
    ok = simulate_links(jax.random.key(2), t, nb, gamma_th, draws, valid=valid)
    assert not np.any(np.asarray(ok)[:, 2])
    _assert_rate(ok[:, :2], expected, draws)


def test_interference_moments_match_sampled_models():
    rng = np.random.default_rng(5)
    n, f, g, beta = 400_000, P.num_subchannels, P.fading.gamma, P.fading_threshold
    h2 = rng.exponential(g, size=(n, f))  # squared Rayleigh amplitudes on each sub-channel
    # physical: power on sub-channel 0 if it is the argmax and the amplitude >= beta
    z = np.where((h2.argmax(1) == 0) & (h2[:, 0] >= beta**2), h2[:, 0], 0.0)
    # exact: A ~ Bernoulli(q) independent of Y = h^2 1{h >= beta}
    q = (1 - (1 - math.exp(-(beta**2) / g)) ** f) / f
    y = np.where(h2[:, 1] >= beta**2, h2[:, 1], 0.0) * (rng.random(n) < q)
    for samples, mode in ((z, "physical"), (y, "exact")):
        mean, var = (float(v) for v in interferer_moments(P, mode))
        assert abs(samples.mean() - mean) < 5 * samples.std() / math.sqrt(n)
        # the sample variance's sd is sqrt((m4 - var^2) / n)
        m4 = np.mean((samples - samples.mean()) ** 4)
        assert abs(samples.var() - var) < 5 * math.sqrt((m4 - var**2) / n)
    # the printed App. A variance is smaller than the exact one (q^2 M5 instead of q M5)
    assert float(interferer_moments(P, "paper")[1]) < float(interferer_moments(P, "exact")[1])


def test_simulation_shapes_padding_and_reproducibility():
    rng = np.random.default_rng(9)
    t, nb = rng.uniform(0, 50, (3, 2)), rng.uniform(0, 50, (3, 5, 2))
    valid = np.ones((3, 5), bool)
    valid[1, 2] = valid[2, 4] = False
    out = simulate_links(jax.random.key(4), t, nb, jnp.array([5.0, 10.0, 15.0]), 500, valid=valid)
    assert out.shape == (500, 3, 5) and out.dtype == jnp.bool_
    assert not np.any(np.asarray(out)[:, ~valid])
    again = simulate_links(jax.random.key(4), t, nb, jnp.array([5.0, 10.0, 15.0]), 500, valid=valid)
    np.testing.assert_array_equal(out, again)
    # another key gives other outcomes
    other = simulate_links(jax.random.key(5), t, nb, 5.0, 500, valid=valid)
    assert not np.array_equal(np.asarray(other), np.asarray(out))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_draws": 0}, "num_draws"),
        ({"interference": "bogus"}, "interference must be one of"),
        ({"gamma_th": -1.0}, "gamma_th"),
        ({"target_xy": [np.inf, 0.0]}, "target_xy must be finite"),
    ],
)
def test_simulate_links_rejects_bad_input(kwargs, match):
    args = {
        "key": jax.random.key(0),
        "target_xy": [1.0, 1.0],
        "neighbor_xy": [[5.0, 5.0], [9.0, 1.0]],
        "gamma_th": 5.0,
        "num_draws": 10,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        simulate_links(**args)


def test_simulate_links_needs_concrete_subchannels():
    with pytest.raises(ValueError, match="num_subchannels"):
        jax.vmap(
            lambda f: simulate_links(
                jax.random.key(0),
                [1.0, 1.0],
                [[5.0, 5.0]],
                5.0,
                10,
                ChannelParams(num_subchannels=f),
            )
        )(jnp.arange(8, 10))


# --------------------------------------------------------------------------- slow: 1M draws


def _success_rate(draw, batches: int):
    """Mean over `batches` independent keys of `draw(key) -> [draws, ...] bool`; and the total
    number of draws."""
    ok = np.concatenate([np.asarray(draw(jax.random.key(1000 + b))) for b in range(batches)])
    return ok.mean(0), ok.shape[0]


@pytest.mark.slow
@pytest.mark.parametrize("moments", MOMENT_MODES)
def test_lognormal_simulation_reproduces_formula_with_a_million_draws(moments):
    """25x the quick test's draws: the 5-sigma band is 5x narrower (at most +-0.0025)."""
    rng = np.random.default_rng(3)
    t, nb = rng.uniform(0, 50, 2), rng.uniform(0, 50, (10, 2))
    nb[0] = t + np.array([2.0, 1.0])
    perr = np.asarray(error_probability(t, nb, 5.0, moments=moments), float)
    assert 0.05 < np.median(perr) < 0.95  # not a degenerate case
    rate, draws = _success_rate(
        lambda k: simulate_links(k, t, nb, 5.0, 40_000, interference="lognormal", moments=moments),
        batches=25,
    )
    _assert_rate(rate[None], perr, draws)


@pytest.mark.slow
def test_physical_with_one_interferer_matches_exact_integral_with_a_million_draws():
    t = np.zeros(2)
    nb = np.array([[10.0, 0.0], [0.0, 13.0]])
    gamma_th = 5.0
    c = P.tx_power_w * np.asarray(path_gain(jnp.array([10.0, 13.0]), P), float)
    expected = np.array(
        [
            _one_interferer_failure(c[0], c[1], gamma_th, P),
            _one_interferer_failure(c[1], c[0], gamma_th, P),
        ]
    )
    rate, draws = _success_rate(lambda k: simulate_links(k, t, nb, gamma_th, 40_000), batches=25)
    _assert_rate(rate[None], expected, draws)
