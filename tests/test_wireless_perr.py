"""error_probability against an adaptive scipy quad of the same integrand (float64, 1e-10)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from pfedwn_jax.wireless import MOMENT_MODES, ChannelParams, error_probability, interferer_moments
from pfedwn_jax.wireless.reference import error_probability_reference, moment_coefficients


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _topologies():
    rng = np.random.default_rng(1234)
    t = rng.uniform(0, 50, 2)
    ten = rng.uniform(0, 50, (10, 2))
    ten[0] = t + np.array([0.3, 0.2])  # below d0 = 1 m: path loss clamped
    ten[1] = t + np.array([0.0, 0.8])
    yield "10 incl. d<d0", t, ten, 5.0, ChannelParams(), None
    yield "single", t, t + np.array([[21.0, 9.0]]), 10.0, ChannelParams(tx_power_w=3e-4), None
    yield "30", rng.uniform(0, 50, 2), rng.uniform(0, 50, (30, 2)), 15.0, ChannelParams(), None
    valid = np.array([True, False, True, True, False, True])
    yield (
        "padded, F=8, beta=1",
        t,
        rng.uniform(0, 50, (6, 2)),
        2.0,
        ChannelParams(num_subchannels=8, fading_threshold=1.0),
        valid,
    )
    yield (
        "noise-limited",
        t,
        rng.uniform(0, 50, (5, 2)),
        10.0,
        ChannelParams(tx_power_w=3e-4),
        None,
    )


CASES = list(_topologies())
PAD = 30  # multi-neighbor cases are padded to one shape: one compilation per moment mode


def _padded(nb, valid):
    n = len(nb)
    if n in (1, PAD):
        return nb, valid
    ok = np.ones(n, bool) if valid is None else valid
    fill = np.full((PAD - n, 2), 25.0)  # padded slots sit mid-area: they must not interfere
    return np.concatenate([nb, fill]), np.concatenate([ok, np.zeros(PAD - n, bool)])


@pytest.mark.parametrize("moments", MOMENT_MODES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_scipy_quad_to_1e_10(x64, moments, case):
    _, t, nb, gamma_th, params, valid = case
    pnb, pvalid = _padded(nb, valid)
    got = np.asarray(error_probability(t, pnb, gamma_th, params, moments, pvalid))[: len(nb)]
    assert got.dtype == np.float64
    ref = error_probability_reference(t, nb, gamma_th, params, moments, valid)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-10)
    assert np.ptp(ref) > 1e-3 or len(ref) == 1  # the cases are not degenerate


@pytest.mark.parametrize("moments", MOMENT_MODES)
@pytest.mark.parametrize(
    "params", [ChannelParams(), ChannelParams(num_subchannels=3, fading_threshold=0.7)]
)
def test_interferer_moments_match_quad_definitions(x64, moments, params):
    mean, var = (float(v) for v in interferer_moments(params, moments))
    ref_mean, ref_var = moment_coefficients(params, moments)
    assert mean == pytest.approx(ref_mean, rel=1e-11)
    assert var == pytest.approx(ref_var, rel=1e-11)


def test_float32_close_to_float64_reference():
    rng = np.random.default_rng(7)
    t, nb = rng.uniform(0, 50, 2), rng.uniform(0, 50, (12, 2))
    got = np.asarray(error_probability(t, nb, 10.0, moments="physical"))
    assert got.dtype == np.float32
    ref = error_probability_reference(t, nb, 10.0, moments="physical")
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6)
