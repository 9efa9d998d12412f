"""Shadowing beyond the selection: the per-round physical draws and a moving network's P_err
see the same per-pair shadowing (dB) as the P_err the neighbors were selected by.

References: the packet-level Monte Carlo (`wireless.simulate_links`, physical interference,
written separately from the runner's draw) fed the host's shadowing matrix; the host's
`slot_perr` (NumPy shadowing matrix, `network_perr`). Both fail if the runner keys a slot's
shadowing by its slot index instead of its network node.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import VARIED_RUN, sweep_equals_runs

from pfedwn_jax import ExperimentConfig
from pfedwn_jax.algorithms import neighbor_lists
from pfedwn_jax.experiment.federation import shadow_matrix, single_target_federation
from pfedwn_jax.experiment.link_setup import build_links, mobile_federation, slot_perr
from pfedwn_jax.runner.links import sample_received, slot_perr_matrix
from pfedwn_jax.wireless import simulate_links

DRAWS = 3000


def _config(**kw):
    base = {**VARIED_RUN, "num_neighbors": 8, "eps": 0.5, "gamma_th": 5.0}
    return ExperimentConfig(**{**base, "algorithms": ("local",), **kw})


def _rates(links, fed, keys):
    """Per-round draws of the runner: `[S]` success rate of each slot -> slot 0 link."""
    nbr, mask = neighbor_lists(np.asarray(fed.adjacency, bool))
    got = jax.vmap(lambda k: sample_received(k, links, nbr, mask))(keys)
    rate = np.zeros(fed.num_slots)
    rate[nbr[0][mask[0]]] = np.asarray(got[:, 0, :], float).mean(0)[mask[0]]
    return rate


def test_physical_draws_see_the_selections_shadowing():
    config = _config(link_model="physical", shadowing_db=8.0, topology_seed=3)
    fed = single_target_federation(config)
    links = build_links(fed, config)
    assert links is not None and links.shadow is not None
    dc = fed.data_client
    full = shadow_matrix(config, len(fed.positions))
    np.testing.assert_allclose(
        np.asarray(links.shadow.pairs(np.arange(len(dc))[:, None], np.arange(len(dc)))),
        full[np.ix_(dc, dc)],
        atol=1e-4,
    )
    assert fed.num_slots >= 3  # a target and at least two neighbors interfering
    keys = jax.random.split(jax.random.key(0), DRAWS)
    rate = _rates(links, fed, keys)[1:]
    xy = fed.positions[dc]
    params = links.channel()

    def reference(shadow):
        ok = simulate_links(
            jax.random.key(1), xy[0], xy[1:], config.gamma_th, DRAWS, params, shadow_db=shadow
        )
        return np.asarray(ok, float).mean(0)

    want = reference(full[dc[0], dc[1:]])
    sd = np.sqrt(2 * np.maximum(want * (1 - want), 1 / DRAWS) / DRAWS)
    np.testing.assert_array_less(np.abs(rate - want), 5 * sd)
    # the check can fail: without the shadowing the rates are elsewhere
    unshadowed = reference(np.zeros(len(dc) - 1))
    assert np.any(np.abs(rate - unshadowed) > 5 * sd)


def test_moving_network_perr_keeps_each_pairs_shadowing():
    """Before the nodes move, the round's P_err of every slot pair (`slot_perr_matrix`, the
    slots' own shadowing) is the host's P_err of the same network (all clients are slots)."""
    config = _config(link_model="bernoulli", shadowing_db=6.0, mobility="waypoint", speed=2.0)
    fed = mobile_federation(single_target_federation(config), config)
    links = build_links(fed, config)
    assert links is not None and links.shadow is not None
    got = slot_perr_matrix(
        links.positions, links.gamma_th, links.channel(), config.moments, links.shadow
    )
    want = slot_perr(fed, config)
    np.testing.assert_allclose(np.asarray(got, float), want, atol=2e-5, rtol=1e-3)
    plain = slot_perr_matrix(links.positions, links.gamma_th, links.channel(), config.moments)
    assert np.max(np.abs(np.asarray(plain, float) - want)) > 0.01


def test_shadowing_deviations_share_one_program():
    """A sweep over the deviation with physical links is one program, each run equal to its
    own `run()`."""
    config = _config(link_model="physical", rounds=2, num_neighbors=5)
    result = sweep_equals_runs(config, {"shadowing_db": [4.0, 10.0]}, "link_received")
    assert result.num_runs == 2


@pytest.mark.slow
def test_moving_shadowed_network_sweeps_like_its_runs():
    """Mobility with shadowing and re-selection every round: each run of a sweep over the
    deviation equals its own `run()` (lists and P_err recomputed inside the round)."""
    config = _config(
        link_model="bernoulli", rounds=2, num_neighbors=5, mobility="waypoint", speed=3.0,
        reselect_every=1,
    )  # fmt: skip
    sweep_equals_runs(config, {"shadowing_db": [3.0, 9.0]}, "neighbor_mask")


# ------------------------------------------------------------------ candidate lists
def _placed(n, seed, side=150.0):
    return np.random.default_rng(seed).uniform(0, side, (n, 2))


def test_sparse_perr_with_every_interferer_equals_the_dense_shadowed_perr():
    from pfedwn_jax.experiment.federation import network_perr
    from pfedwn_jax.wireless import ChannelParams, shadowing_db, sparse_error_probability
    from pfedwn_jax.wireless.neighbors import candidate_neighbors

    xy = _placed(40, 2)
    params = ChannelParams(shadowing_db=7.0)
    key = jax.random.key(5)
    i, j = np.meshgrid(np.arange(40), np.arange(40), indexing="ij")
    shadow = np.asarray(shadowing_db(key, i, j, 7.0), np.float64)
    dense = network_perr(xy, 5.0, params, "paper", shadow=shadow)
    idx, mask = candidate_neighbors(xy, k=6)
    got = np.asarray(sparse_error_probability(xy, idx, mask, 5.0, params, shadow_key=key))
    want = np.take_along_axis(dense, np.asarray(idx), 1)
    np.testing.assert_allclose(got[mask], want[mask], atol=2e-5, rtol=1e-4)
    plain = np.asarray(sparse_error_probability(xy, idx, mask, 5.0, params))
    assert np.max(np.abs(plain - want)[mask]) > 0.01


def test_shadowed_tail_factors_are_the_moments_of_a_shadowed_interferer():
    """E[e^Y u] = g1 E[u] and Var[e^Y u] = g2 Var[u], Y ~ N(0, (sigma ln10/10)^2) independent
    of u (a gamma law with mean m1, variance var1), by Monte Carlo."""
    from pfedwn_jax.wireless.sparse_perr import _shadowed_tail

    rng = np.random.default_rng(0)
    n, m1, var1 = 2_000_000, 1.7, 0.9
    for sigma in (0.0, 3.0, 6.0):
        u = rng.gamma(m1 * m1 / var1, var1 / m1, n)
        x = np.exp(rng.normal(0.0, sigma * np.log(10) / 10, n)) * u
        g1, g2 = (float(g) for g in _shadowed_tail(m1, var1, sigma))
        assert abs(x.mean() / m1 - g1) < 5 * x.std() / np.sqrt(n) / m1
        assert abs(x.var() / var1 / g2 - 1.0) < 0.05, (sigma, x.var() / var1, g2)


def test_mean_field_tail_with_shadowing_reduces_truncation_error():
    from pfedwn_jax.wireless import ChannelParams, sparse_error_probability
    from pfedwn_jax.wireless.neighbors import candidate_neighbors

    xy = _placed(300, 5, side=260.0)
    params = ChannelParams(shadowing_db=6.0)
    key = jax.random.key(1)
    idx, mask = candidate_neighbors(xy, k=10)
    run = lambda **kw: np.asarray(
        sparse_error_probability(xy, idx, mask, 5.0, params, shadow_key=key, **kw)
    )
    full = run()
    mode = {"interference": "radius", "cutoff": 60.0}
    e_cut = np.abs(run(**mode) - full)[mask]
    e_mean = np.abs(run(tail="mean", **mode) - full)[mask]
    assert e_mean.mean() < 0.3 * e_cut.mean(), (e_mean.mean(), e_cut.mean())
