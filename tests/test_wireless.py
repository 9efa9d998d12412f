"""Wireless model: parameters, building blocks, shapes, validation, jit caching (float32)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from pfedwn_jax.wireless import (
    ChannelParams,
    error_probability,
    interference_ccdf,
    lognormal_from_moments,
    lognormal_params,
    path_gain,
    place_uniform,
    rayleigh_pdf,
    sample_ppp,
    select_neighbors,
    simulate_links,
    threshold_moments,
    transmit_probability,
)
from pfedwn_jax.wireless.perr import _perr_jit

P = ChannelParams()


def test_table_one_defaults_and_derived_quantities():
    assert (P.area_m, P.num_subchannels, P.fading.gamma, P.pathloss_exp, P.d0_m) == (
        50.0,
        14,
        2.0,
        3.0,
        1.0,
    )
    assert (
        P.tx_power_w,
        P.freq_hz,
        P.boltzmann,
        P.noise_temp_k,
        P.bandwidth_hz,
        P.fading_threshold,
    ) == (0.2, 2.4e9, 1.38e-23, 290.0, 100e6, 2.0)
    assert P.wavelength_m == pytest.approx(299792458.0 / 2.4e9)
    assert P.noise_w == pytest.approx(1.38e-23 * 290.0 * 100e6)


@pytest.mark.parametrize(
    "field,bad",
    [
        ("area_m", 0.0),
        ("area_m", -5.0),
        ("num_subchannels", 0),
        ("num_subchannels", 2.5),
        ("shadowing_db", -1.0),
        ("pathloss_exp", -1.0),
        ("d0_m", 0.0),
        ("tx_power_w", -0.1),
        ("freq_hz", 0.0),
        ("boltzmann", 0.0),
        ("noise_temp_k", -1.0),
        ("bandwidth_hz", 0.0),
        ("fading_threshold", -0.5),
        ("area_m", math.nan),
        ("tx_power_w", math.inf),
    ],
)
def test_channel_params_rejects_bad_values(field, bad):
    with pytest.raises(ValueError, match=f"ChannelParams.{field}"):
        ChannelParams(**{field: bad})


def test_channel_params_rejects_bad_array_entries():
    with pytest.raises(ValueError, match="num_subchannels"):
        ChannelParams(num_subchannels=np.array([8, 0, 12]))


def test_path_gain_hand_values_and_d0_clamp():
    lam = 299792458.0 / 2.4e9
    k = (lam / (4 * math.pi)) ** 2
    d = jnp.array([0.2, 1.0, 10.0, 35.0])
    expected = k * np.array([1.0, 1.0, 1e-3, 35.0**-3])
    np.testing.assert_allclose(path_gain(d, P), expected, rtol=1e-5)


def test_rayleigh_pdf_normalised_with_mean_square_gamma():
    x = np.linspace(0, 20, 200001)
    pdf = np.asarray(rayleigh_pdf(jnp.asarray(x), 2.0), float)
    assert integrate.trapezoid(pdf, x) == pytest.approx(1.0, abs=1e-5)
    assert integrate.trapezoid(x**2 * pdf, x) == pytest.approx(2.0, rel=1e-4)
    assert float(rayleigh_pdf(-1.0, 2.0)) == 0.0


@pytest.mark.parametrize("f,beta", [(14, 2.0), (3, 1.0), (1, 0.5)])
def test_transmit_probability_matches_monte_carlo(f, beta):
    rng = np.random.default_rng(0)
    n = 200_000
    h = rng.rayleigh(scale=1.0, size=(n, f))  # E[h^2] = 2 = Gamma
    chosen0 = (h.argmax(1) == 0) & (h.max(1) >= beta)
    q = float(transmit_probability(ChannelParams(num_subchannels=f, fading_threshold=beta)))
    assert abs(chosen0.mean() - q) < 5 * math.sqrt(q * (1 - q) / n)


def test_threshold_moments_match_quad():
    m3, m5 = threshold_moments(P)
    pdf = lambda x: x / 1.0 * math.exp(-x * x / 2.0)
    ref3 = integrate.quad(lambda x: x**2 * pdf(x), 2.0, math.inf)[0]
    ref5 = integrate.quad(lambda x: x**4 * pdf(x), 2.0, math.inf)[0]
    assert float(m3) == pytest.approx(ref3, rel=1e-6)
    assert float(m5) == pytest.approx(ref5, rel=1e-6)


def test_lognormal_params_reproduce_mean_and_variance():
    mean, var = np.array([1e-9, 3.0, 0.5]), np.array([4e-18, 0.1, 7.0])
    mu, sig = (np.asarray(v, float) for v in lognormal_params(jnp.asarray(mean), jnp.asarray(var)))
    np.testing.assert_allclose(np.exp(mu + sig**2 / 2), mean, rtol=1e-5)
    np.testing.assert_allclose((np.exp(sig**2) - 1) * np.exp(2 * mu + sig**2), var, rtol=1e-4)


def test_lognormal_from_moments_guards_links_without_interferer():
    mean, var = jnp.array([0.0, 3.0, 0.5]), jnp.array([0.0, 0.1, 7.0])
    mu, s2, has = lognormal_from_moments(mean, var)
    assert has.tolist() == [False, True, True]
    assert np.all(np.isfinite(mu)) and np.all(np.isfinite(s2))
    p_mu, p_sig = lognormal_params(mean, var)
    np.testing.assert_array_equal(np.asarray(p_mu)[1:], np.asarray(mu)[1:])
    np.testing.assert_array_equal(np.asarray(p_sig)[1:], np.sqrt(np.asarray(s2))[1:])
    assert np.isnan(p_mu[0]) and np.isnan(p_sig[0])
    grads = jax.grad(lambda m: jnp.sum(lognormal_from_moments(m, var)[0]))(mean)
    assert np.all(np.isfinite(grads))


def test_interference_ccdf_matches_scipy_and_is_one_below_zero():
    x = np.array([-1.0, 0.0, 1e-3, 0.5, 2.0, 9.0])
    got = np.asarray(interference_ccdf(jnp.asarray(x), 0.3, 0.8))
    ref = stats.lognorm.sf(np.maximum(x, 1e-300), s=0.8, scale=math.exp(0.3))
    ref[x <= 0] = 1.0
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)


def test_perr_bounded_by_threshold_probability_and_monotone_in_gamma():
    keys = jax.random.split(jax.random.key(3), 64)
    t, nb = jax.jit(jax.vmap(place_uniform, (0, None)), static_argnums=1)(keys, 10)
    gam = jnp.array([1.0, 5.0, 10.0, 15.0, 50.0])[:, None]
    perr = np.asarray(error_probability(t[None], nb[None], gam))  # [5, 64, 10]
    assert perr.shape == (5, 64, 10)
    assert np.all(perr >= 0) and np.all(perr <= math.exp(-2.0) + 1e-6)
    assert np.all(np.diff(perr, axis=0) >= -1e-6)


def test_padded_slots_do_not_interfere_and_have_perr_one():
    t, nb = place_uniform(jax.random.key(5), 6)
    valid = jnp.array([True, True, False, True, False, True])
    full = np.asarray(error_probability(t, nb, 5.0, valid=valid))
    kept = np.asarray(error_probability(t, nb[np.asarray(valid)], 5.0))
    np.testing.assert_array_equal(full[~np.asarray(valid)], 1.0)
    np.testing.assert_allclose(full[np.asarray(valid)], kept, rtol=1e-6, atol=1e-7)
    assert not np.any(np.asarray(select_neighbors(full, 0.99, valid))[~np.asarray(valid)])


def test_single_neighbor_is_noise_only_closed_form():
    # No interferer: P_err = P(beta <= h <= sqrt(gamma_th sigma^2 / c_s)) = max(0, e^-b - e^-k).
    params = ChannelParams(tx_power_w=1e-9)
    t, nb = jnp.zeros(2), jnp.array([[30.0, 40.0]])
    lam = 299792458.0 / 2.4e9
    c = 1e-9 * (lam / (4 * math.pi)) ** 2 * 50.0**-3
    kappa = 5.0 * params.noise_w / (c * 2.0)
    expected = max(0.0, math.exp(-2.0) - math.exp(-kappa))
    assert expected > 0.01
    got = float(error_probability(t, nb, 5.0, params)[0])
    assert got == pytest.approx(expected, rel=1e-4)
    assert float(error_probability(t, nb, 5.0)[0]) == 0.0  # default power: never noise-limited


def test_batched_call_equals_per_item_calls():
    keys = jax.random.split(jax.random.key(7), 4)
    t, nb = jax.jit(jax.vmap(place_uniform, (0, None)), static_argnums=1)(keys, 5)
    gam = jnp.array([3.0, 5.0, 10.0, 15.0])
    batch = np.asarray(error_probability(t, nb, gam, moments="exact"))
    for i in range(4):
        one = np.asarray(error_probability(t[i], nb[i], gam[i], moments="exact"))
        np.testing.assert_allclose(batch[i], one, rtol=1e-6, atol=1e-8)


def test_vmap_over_subchannels_matches_separate_params():
    t, nb = place_uniform(jax.random.key(11), 8)
    fs = jnp.arange(8, 21, 4)
    sweep = jax.vmap(
        lambda f: error_probability(
            t, nb, 10.0, dataclasses.replace(P, num_subchannels=f), moments="physical"
        )
    )(fs)
    for i, f in enumerate(np.asarray(fs)):
        ref = error_probability(
            t, nb, 10.0, ChannelParams(num_subchannels=int(f)), moments="physical"
        )
        np.testing.assert_allclose(sweep[i], ref, rtol=1e-5, atol=1e-7)


def test_no_recompilation_for_repeated_shapes():
    t, nb = place_uniform(jax.random.key(0), 9)
    error_probability(t, nb, 5.0)
    before = _perr_jit._cache_size()
    for g in (7.0, 9.0):
        error_probability(t + 1.0, nb * 0.5, g, ChannelParams(tx_power_w=0.1))
    assert _perr_jit._cache_size() == before


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"target_xy": [np.nan, 1.0]}, "target_xy must be finite"),
        ({"neighbor_xy": [[1.0, np.inf], [2.0, 3.0]]}, "neighbor_xy must be finite"),
        ({"gamma_th": -5.0}, "gamma_th must be in"),
        ({"gamma_th": 0.0}, "gamma_th must be in"),
        ({"gamma_th": np.nan}, "gamma_th must be finite"),
        ({"target_xy": [1.0, 2.0, 3.0]}, r"target_xy must have shape \[..., 2\]"),
        ({"neighbor_xy": [[1.0, 2.0, 3.0]]}, r"neighbor_xy must have shape"),
        ({"neighbor_xy": [1.0, 2.0]}, r"neighbor_xy must have shape"),
        ({"neighbor_xy": np.zeros((0, 2))}, r"n >= 1"),
        ({"target_xy": np.zeros((3, 2)), "neighbor_xy": np.zeros((4, 5, 2))}, "do not broadcast"),
        ({"valid": [True, False, True]}, r"valid must have shape \[..., n\]"),
        ({"target_xy": np.zeros((3, 2)), "valid": np.ones((4, 2), bool)}, "do not broadcast"),
        ({"valid": [1, 0]}, "boolean mask"),
        ({"moments": "bogus"}, "moments must be one of"),
        ({"params": {"area_m": 50}}, "params must be a ChannelParams"),
        ({"num_nodes": 1}, "num_nodes"),
    ],
)
def test_error_probability_rejects_bad_input(kwargs, match):
    args = {"target_xy": [10.0, 10.0], "neighbor_xy": [[1.0, 2.0], [30.0, 3.0]], "gamma_th": 5.0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        error_probability(**args)


def test_select_neighbors_threshold_and_validation():
    perr = jnp.array([0.01, 0.05, 0.2, 0.0])
    np.testing.assert_array_equal(select_neighbors(perr, 0.05), [True, False, False, True])
    np.testing.assert_array_equal(
        select_neighbors(perr, 0.3, jnp.array([True, True, False, False])),
        [True, True, False, False],
    )
    for eps in (0.0, 1.0, -0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="eps"):
            select_neighbors(perr, eps)
    with pytest.raises(ValueError, match="perr"):
        select_neighbors(jnp.array([0.1, math.nan]), 0.05)
    # under jit the threshold still works (checks apply to concrete values only)
    out = jax.jit(lambda p: select_neighbors(p, 0.05))(perr)
    np.testing.assert_array_equal(out, [True, False, False, True])


def test_place_uniform_shapes_and_range():
    keys = jax.random.split(jax.random.key(1), 100)
    t, nb = jax.jit(jax.vmap(place_uniform, (0, None)), static_argnums=1)(keys, 10)
    assert t.shape == (100, 2) and nb.shape == (100, 10, 2)
    allxy = np.concatenate([np.asarray(t), np.asarray(nb).reshape(-1, 2)])
    assert allxy.min() >= 0 and allxy.max() <= 50.0
    assert abs(allxy.mean() - 25.0) < 5 * 50 / math.sqrt(12 * allxy.size)
    with pytest.raises(ValueError, match="num_neighbors"):
        place_uniform(jax.random.key(0), 0)


def test_sample_ppp_count_is_poisson_and_mask_is_prefix():
    density, draws = 4e-3, 2000
    keys = jax.random.split(jax.random.key(2), draws)
    xy, valid = jax.jit(jax.vmap(lambda k: sample_ppp(k, density, P, 48)))(keys)
    counts = np.asarray(valid).sum(1)
    lam = density * 50.0**2  # 10
    assert abs(counts.mean() - lam) < 5 * math.sqrt(lam / draws)
    assert abs(counts.var() - lam) < 5 * lam * math.sqrt(2.0 / draws) + 0.5
    v = np.asarray(valid)
    assert np.all(v == (np.arange(48) < counts[:, None]))
    assert np.asarray(xy).min() >= 0 and np.asarray(xy).max() <= 50.0
    with pytest.raises(ValueError, match="density"):
        sample_ppp(jax.random.key(0), -1e-3, P, 10)


def test_node_count_rule_easy_for_table_one_robust_otherwise():
    from pfedwn_jax.wireless.perr import EASY_NODES, ROBUST_NODES, default_num_nodes

    t, nb = np.zeros(2), np.array([[50.0, 50.0], [3.0, 1.0]])
    assert default_num_nodes(t, nb, 15.0, P, "float32") == EASY_NODES["float32"]
    assert default_num_nodes(t, nb, 15.0, P, "float64") == EASY_NODES["float64"]
    # beta small, or links noise-limited at x = beta, or traced inputs: the robust rule
    for params in (ChannelParams(fading_threshold=0.5), ChannelParams(tx_power_w=3e-4)):
        assert default_num_nodes(t, nb, 15.0, params, "float64") == ROBUST_NODES
    assert jax.jit(lambda g: default_num_nodes(t, nb, g, P, "float32"))(5.0) == ROBUST_NODES


def test_callable_inside_a_callers_jit():
    # Other modules call the API from their own jitted code: value checks are skipped there
    # and the node count falls back to the robust rule, giving the same values.
    t, nb = place_uniform(jax.random.key(8), 7)
    eager = np.asarray(error_probability(t, nb, 5.0))
    traced = jax.jit(lambda a, b, g: error_probability(a, b, g))(t, nb, 5.0)
    np.testing.assert_allclose(traced, eager, atol=1e-6)
    ok = jax.jit(lambda k, a, b: simulate_links(k, a, b, 5.0, 4))(jax.random.key(0), t, nb)
    assert ok.shape == (4, 7)
