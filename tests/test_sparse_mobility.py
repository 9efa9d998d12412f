"""Mobility over candidate lists: the nearest found again in the compiled round, equal to
dense mobility where every node is a candidate, and a large network's rounds."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import TINY_RUN

import pfedwn_jax
from pfedwn_jax import ExperimentConfig
from pfedwn_jax.experiment.setup import setup
from pfedwn_jax.runner.links import begin_round, end_round, init_track, reselect_sparse
from pfedwn_jax.wireless import grid
from pfedwn_jax.wireless.neighbors import candidate_neighbors

MOBILE = dict(
    TINY_RUN,
    mode="network",
    gamma_th=2.0,
    eps=0.1,
    link_model="bernoulli",  # P_err of the listed links tracked every round
    mobility="gaussian",
    speed=30.0,
    reselect_every=2,
)


def _rounds(config: ExperimentConfig, n: int):
    """`n` rounds of the runner's link halves alone (no algorithm): the per-round records."""
    exp = setup(config)
    params = {"w": np.zeros((exp.ctx.num_slots, 1), np.float32)}
    track = init_track(jax.random.wrap_key_data(exp.init_key), exp.ctx, params)
    root = jax.random.wrap_key_data(exp.round_root)
    step = jax.jit(lambda t, k: _round(exp.ctx, t, k))
    out = []
    for r in range(n):
        track, rec, perr = step(track, jax.random.fold_in(root, r))
        out.append(jax.tree.map(np.asarray, {**rec, "perr": perr}))
    return out


def _round(ctx, track, key):
    ctx, rec, drawn = begin_round(ctx, track, key)
    track, _ = end_round(ctx, track, drawn, None, key)
    return track, rec, ctx.links.perr


@pytest.mark.parametrize("rng_seed", [0, 1])
def test_grid_queries_equal_the_host_search(rng_seed):
    rng = np.random.default_rng(rng_seed)
    n, k, area = 600, 10, 370.0
    xy = rng.uniform(0, area, (n, 2))
    g = grid.make_grid(n, area, grid.knn_radius(n, area, k))
    idx, mask, overflow = jax.jit(lambda p: grid.nearest(p, k, g))(xy.astype(np.float32))
    want, _ = candidate_neighbors(xy, k=k)
    assert not overflow and np.asarray(mask).all()
    np.testing.assert_array_equal(np.sort(np.asarray(idx), 1), np.sort(want, 1))
    far = grid.make_grid(n, area, 60.0)
    idx, mask, _ = jax.jit(lambda p: grid.within(p, 60.0, far))(xy.astype(np.float32))
    ref, ref_mask = candidate_neighbors(xy, radius=60.0)
    for i in range(0, n, 7):
        got = set(np.asarray(idx[i])[np.asarray(mask[i])].tolist())
        assert got == set(ref[i][ref_mask[i]].tolist())


def test_a_crowded_cell_is_reported():
    xy = np.zeros((40, 2), np.float32) + 5.0  # every node in one cell of capacity < 40
    g = grid.Grid(cells=4, side=25.0, capacity=10)
    assert bool(jax.jit(lambda p: grid.nearest(p, 3, g)[2])(xy))


def test_reselect_sparse_keeps_the_lowest_perr_ties_by_index():
    cand = np.array([[4, 2, 1, 3], [0, 2, 3, 4]], np.int32)
    cmask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
    cperr = np.array([[0.01, 0.2, 0.01, 0.0], [0.5, 0.02, 0.5, 0.0]], np.float32)
    nbr, mask, perr = reselect_sparse(cand, cmask, cperr, 3, 0.05)
    # row 0: 3 (0.0), then 1 and 4 tie at 0.01: the lower index, 1; row 1: only 2 (4 masked)
    np.testing.assert_array_equal(nbr, [[0, 1, 3], [1, 2, 1]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [1, 1, 0]])
    np.testing.assert_allclose(perr, [[0, 0.01, 0.0], [0, 0.02, 0]])


@pytest.mark.slow
@pytest.mark.parametrize("shadowing_db", [0.0, 6.0])
def test_every_node_a_candidate_moves_as_the_dense_network(shadowing_db):
    cfg = dict(MOBILE, num_neighbors=49, shadowing_db=shadowing_db)
    dense = _rounds(ExperimentConfig(**cfg), 5)
    sparse = _rounds(ExperimentConfig(**cfg, candidates=49), 5)
    assert any(r["reselected"] for r in dense[1:])  # the lists do change
    for d, s in zip(dense, sparse, strict=True):
        np.testing.assert_array_equal(s["positions"], d["positions"])
        width = d["neighbors"].shape[1]  # the sparse lists are as wide as their first round's
        np.testing.assert_array_equal(s["neighbors"][:, :width], d["neighbors"])
        np.testing.assert_array_equal(s["neighbor_mask"][:, :width], d["neighbor_mask"])
        assert not s["neighbor_mask"][:, width:].any()
        np.testing.assert_allclose(s["perr"][:, :width], d["perr"], atol=2e-5)
        assert s["reselected"] == d["reselected"]


@pytest.mark.slow
def test_a_mobile_sparse_network_trains_with_reselection():
    config = ExperimentConfig(
        **{**MOBILE, "num_neighbors": 1999, "rounds": 5, "speed": 20.0},
        candidates=8,
        interference_cutoff=100.0,
        node_density=11 / 2500,
        min_samples=3,  # the embedded 7,000 samples over 2,000 clients
        algorithms=("fedavg",),
    )
    res = pfedwn_jax.run(config, progress=False)
    rec = res.methods["fedavg"]["records"]
    assert len(rec["reselected"]) == 5 and any(rec["reselected"])
    assert np.isfinite(res.methods["fedavg"]["target_accuracy"]).all()
