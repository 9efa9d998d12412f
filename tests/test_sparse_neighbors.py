"""Sparse training state: neighbor lists `[S, K]` give what the dense `[S, S]` path gave.

References: plain loops, the dense matrices (`group_average_matrix`, `attention_matrix`,
`aggregation_matrix` with `mix`), a dense EM written out here, and results of every method
recorded by the dense code (main at 5c75bef, `tests/data/record_sparse_reference.py`) on a
network with uneven degrees.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import CLASSES, SHAPE, make_data
from toy_groups import ADJ

from pfedwn_jax import run
from pfedwn_jax.algorithms import (
    RoundContext,
    dense_adjacency,
    get_algorithm,
    group_average_matrix,
    make_hparams,
    neighbor_lists,
)
from pfedwn_jax.algorithms.common import average_in_groups
from pfedwn_jax.algorithms.fedamp import attention_matrix, cloud_models
from pfedwn_jax.algorithms.pfedwn import em_pairs, estimate_pi
from pfedwn_jax.em import estimate_weights, m_step, responsibilities
from pfedwn_jax.engine import (
    ClientState,
    cross_evaluate,
    local_train,
    mix,
    mix_sparse,
    neighbor_sq_dist,
    sq_dist,
    take_slots,
)
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.models import get_model
from pfedwn_jax.runner.batch import pad_lists

REFERENCE = Path(__file__).parent / "data" / "sparse_reference.json"


def random_params(s: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "a": jnp.asarray(rng.normal(size=(s, 3, 2)), jnp.float32),
        "b": {"c": jnp.asarray(rng.normal(size=(s, 5)), jnp.float32)},
    }


def make_ctx(adjacency=ADJ, is_target=None, counts=None) -> RoundContext:
    s = adjacency.shape[0]
    counts = [11, 5, 9, 3, 7, 10][:s] if counts is None else counts
    neighbors, mask = neighbor_lists(adjacency)
    return RoundContext(
        model=get_model("logreg", CLASSES, SHAPE),
        optimizer=optax.sgd(0.1),
        train=make_data(counts),
        data_client=jnp.arange(s, dtype=jnp.int32),
        neighbors=jnp.asarray(neighbors),
        neighbor_mask=jnp.asarray(mask),
        is_target=jnp.ones(s, bool) if is_target is None else jnp.asarray(is_target),
        num_samples=jnp.asarray(counts, jnp.float32),
        batch_size=4,
    )


def to_dense(values: np.ndarray, neighbors: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`[..., S, K]` list values -> `[..., S, S]` (0 off the lists)."""
    s = neighbors.shape[0]
    out = np.zeros((*values.shape[:-1], s))
    rows = np.arange(s)[:, None]
    np.add.at(out, (..., rows, neighbors), np.where(mask, values, 0.0))
    return out


# --- lists ---------------------------------------------------------------------------------


def test_neighbor_lists_layout_and_round_trip():
    nbr, mask = neighbor_lists(ADJ)
    assert nbr.dtype == np.int32 and mask.dtype == bool and nbr.shape == (6, 4)  # K = 3 + 1
    np.testing.assert_array_equal(nbr[:, 0], np.arange(6))  # column 0: the slot itself
    assert mask[:, 0].all()
    np.testing.assert_array_equal(nbr[1], [1, 0, 2, 5])  # neighbors in increasing order
    np.testing.assert_array_equal(nbr[3], [3, 0, 2, 3])  # then padding: the slot itself
    np.testing.assert_array_equal(mask[3], [True, True, True, False])
    np.testing.assert_array_equal(dense_adjacency(nbr, mask, 6), ADJ)
    rng = np.random.default_rng(0)
    for s, p in [(1, 0.5), (7, 0.0), (7, 1.0), (30, 0.2)]:
        adj = (rng.uniform(size=(s, s)) < p) | np.eye(s, dtype=bool)
        nbr, mask = neighbor_lists(adj)
        assert nbr.shape[1] == int((adj & ~np.eye(s, dtype=bool)).sum(1).max(initial=0)) + 1
        for i in range(s):  # a plain loop: the row's real entries are i, then its neighbors
            listed = [i] + [j for j in range(s) if adj[i, j] and j != i]
            assert nbr[i, mask[i]].tolist() == listed
            assert mask[i].tolist() == sorted(mask[i].tolist(), reverse=True)
        np.testing.assert_array_equal(dense_adjacency(nbr, mask, s), adj)
    with pytest.raises(ValueError, match="adjacency must be a bool"):
        neighbor_lists(np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"adjacency must have shape \(2, 2\)"):
        neighbor_lists(np.ones((2, 3), bool))


def test_pad_lists_for_sweeps():
    nbr, mask = neighbor_lists(ADJ[:3, :3])
    out, out_mask = pad_lists(nbr, mask, 5, 4)
    np.testing.assert_array_equal(out[:3, : nbr.shape[1]], nbr)
    np.testing.assert_array_equal(out[3:], [[3] * 4, [4] * 4])  # padded slots: only themselves
    np.testing.assert_array_equal(out_mask[3:], [[True, False, False, False]] * 2)
    assert not out_mask[:, nbr.shape[1] :].any()  # new columns masked
    np.testing.assert_array_equal(dense_adjacency(out, out_mask, 5)[:3, :3], ADJ[:3, :3])


# --- engine --------------------------------------------------------------------------------


def test_mix_sparse_against_a_loop_and_dense_mix():
    params = random_params(6)
    nbr, mask = neighbor_lists(ADJ)
    w = np.random.default_rng(1).uniform(size=nbr.shape).astype(np.float32) * mask
    got = mix_sparse(params, nbr, w)
    for leaf, out in [(params["a"], got["a"]), (params["b"]["c"], got["b"]["c"])]:
        x = np.asarray(leaf, np.float64)
        ref = np.stack([sum(w[s, k] * x[nbr[s, k]] for k in range(4)) for s in range(6)])
        np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    dense = mix(params, to_dense(w, nbr, mask).astype(np.float32))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), got, dense)
    with pytest.raises(ValueError, match=r"neighbors must be in \[0, 5\]; got 6"):
        mix_sparse(params, np.full((6, 2), 6), np.ones((6, 2)))
    with pytest.raises(ValueError, match="weights must have the shape of neighbors"):
        mix_sparse(params, nbr, w[:, :2])


def test_neighbor_sq_dist_is_the_dense_distances_at_the_lists():
    params = random_params(6, seed=2)
    nbr, _ = neighbor_lists(ADJ)
    got = np.asarray(neighbor_sq_dist(params, nbr))
    dense = np.asarray(sq_dist(params))
    np.testing.assert_array_equal(got, dense[np.arange(6)[:, None], nbr])  # same differences
    assert np.all(got[:, 0] == 0)


# --- algorithms against the dense computation -------------------------------------------


def test_group_average_equals_the_dense_matrix():
    """FedAvg, FedProx and Per-FedAvg aggregate with `average_in_groups`."""
    ctx = make_ctx()
    params = random_params(6, seed=3)
    clients = ClientState(params, jax.tree.map(jnp.zeros_like, params))
    got = average_in_groups(clients, ctx).params
    want = mix(params, group_average_matrix(jnp.asarray(ADJ), ctx.num_samples))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), got, want)
    assert not np.allclose(got["a"][1], params["a"][1])  # it did average


def test_fedamp_cloud_models_equal_the_dense_attention():
    ctx = make_ctx()
    params = jax.tree.map(lambda a: 0.3 * a, random_params(6, seed=4))
    for alpha_k, sigma in [(0.1, 1.0), (4.0, 0.5)]:  # the second rescales rows
        hp = make_hparams(get_algorithm("fedamp"), {"alpha_k": alpha_k, "sigma": sigma})
        got = cloud_models(params, ctx, hp)
        xi = attention_matrix(sq_dist(params), jnp.asarray(ADJ), alpha_k, sigma)
        want = mix(params, xi)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)


@pytest.mark.parametrize("pi_from", ["received", "components"])
def test_pfedwn_em_equals_a_dense_em(pi_from):
    """`estimate_pi` over the lists equals EM over `[S, S, N]` written out here, on uneven
    rows (a non-target row too), on the received models (the default) and on the components
    after the responsibility-weighted training."""
    is_target = np.array([True, True, True, False, True, True])
    ctx = make_ctx(is_target=is_target)
    s = 6
    local = get_algorithm("local")
    state = local.init(jax.random.PRNGKey(0), ctx, make_hparams(local))
    params = local.round(state, jax.random.PRNGKey(1), ctx, None)[0].clients.params
    hp = make_hparams(get_algorithm("pfedwn"), {"em_steps": 1, "pi_from": pi_from})
    key = jax.random.PRNGKey(5)
    pi, trace = jax.jit(lambda p: estimate_pi(p, key, ctx, hp))(params)

    adj = ADJ & ~np.eye(s, dtype=bool) & is_target[:, None]
    pt, pn = np.nonzero(adj)  # the dense code's pairs: row-major
    nmask = jnp.asarray(adj)
    smask = ctx.train.mask[ctx.data_client]
    dc = ctx.data_client[pt]

    def dense(comp):
        per = cross_evaluate(ctx.model, comp, ctx.train, np.arange(len(pt)), dc)["loss"]
        return jnp.zeros((s, s, per.shape[1])).at[pt, pn].set(per)

    comp = take_slots(params, jnp.asarray(pn))
    prior = nmask / jnp.maximum(nmask.sum(1, keepdims=True), 1)
    lam = responsibilities(dense(comp), prior, smask, nmask)
    pi1 = m_step(lam, smask, nmask, hp.floor)
    if pi_from == "components":
        state = ClientState(comp, jax.vmap(ctx.optimizer.init)(comp))
        state, _ = local_train(
            ctx.model, ctx.optimizer, state, ctx.train, dc, jax.random.fold_in(key, 0),
            batch_size=4, sample_weight=lam[pt, pn],
        )  # fmt: skip
        comp = state.params
    ref = estimate_weights(
        dense(comp), smask, nmask, pi1, num_iters=hp.em_iters, tol=hp.em_tol, floor=hp.floor
    )
    nbr, mask = np.asarray(ctx.neighbors), np.asarray(ctx.neighbor_mask)
    np.testing.assert_allclose(to_dense(np.asarray(trace[1]), nbr, mask), pi1, atol=1e-6)
    np.testing.assert_allclose(to_dense(np.asarray(pi), nbr, mask), ref, atol=1e-6)
    assert np.all(np.asarray(pi)[:, 0] == 0) and np.all(np.asarray(pi)[~mask] == 0)
    pairs = em_pairs(ctx)
    assert pairs.slot.shape == (s * 3,) and int(pairs.valid.sum()) == len(pt)


@pytest.mark.slow
def test_every_method_equals_the_recorded_dense_results():
    """Every method in network mode, degrees 1-7 of 8 nodes, logreg, 3 rounds (pFedWN
    re-estimates pi every round): the results recorded by the dense code (main 5c75bef)."""
    ref = json.loads(REFERENCE.read_text())
    got = run(ExperimentConfig.from_dict(ref["config"]), progress=False).to_dict()
    degrees = np.asarray(ref["adjacency"]).sum(1)
    assert degrees.min() < degrees.max()
    nbr = np.asarray(got["network"]["slot_neighbors"])
    mask = np.asarray(got["network"]["slot_neighbor_mask"])
    np.testing.assert_array_equal(dense_adjacency(nbr, mask, len(nbr)), ref["adjacency"])
    for name, want in ref["methods"].items():
        have = got["methods"][name]
        for key in ("target_accuracy", "client_accuracy"):
            np.testing.assert_array_equal(have[key], want[key], err_msg=f"{name}/{key}")
        for key in ("target_loss", "client_loss"):
            np.testing.assert_allclose(have[key], want[key], rtol=1e-5, err_msg=f"{name}/{key}")
        for rec, values in want["records"].items():
            values = np.asarray(values, float)
            have_rec = np.asarray(have["records"][rec], float)
            if rec in ("pi", "pi_trace"):  # dense [.., S, S] then; [.., S, K] now
                have_rec = to_dense(have_rec, nbr, mask)
            np.testing.assert_allclose(have_rec, values, atol=1e-6, err_msg=f"{name}/{rec}")


# --- scale ---------------------------------------------------------------------------------


def random_network_ctx(s: int, degree: int, samples: int = 8, seed: int = 0) -> RoundContext:
    """`s` slots, each hearing `degree` random others (in-degrees vary: K = max + 1)."""
    rng = np.random.default_rng(seed)
    nbr = np.zeros((s, degree + 1), np.int32)
    mask = np.ones((s, degree + 1), bool)
    for i in range(s):
        d = rng.integers(0, degree + 1)
        others = np.sort(rng.choice(np.delete(np.arange(s), i), size=d, replace=False))
        nbr[i] = np.concatenate([[i], others, np.full(degree - d, i)])
        mask[i, 1 + d :] = False
    counts = rng.integers(1, samples + 1, size=s)
    return RoundContext(
        model=get_model("logreg", CLASSES, SHAPE),
        optimizer=None,
        train=make_data(counts, max_samples=samples),
        data_client=jnp.arange(s, dtype=jnp.int32),
        neighbors=jnp.asarray(nbr),
        neighbor_mask=jnp.asarray(mask),
        is_target=jnp.ones(s, bool),
        num_samples=jnp.asarray(counts, jnp.float32),
        batch_size=4,
        lr=jnp.float32(0.1),
    )


def test_a_thousand_nodes_in_network_mode():
    """1,000 slots, up to 6 neighbors each: a FedAvg and a pFedWN round (with EM) run, pi is
    `[S, K]` and on the simplex over each target's neighbors; nothing is `[S, S]`."""
    s, degree = 1000, 6
    ctx = random_network_ctx(s, degree)
    mask = np.asarray(ctx.neighbor_mask)
    t0 = time.perf_counter()
    for name in ("fedavg", "pfedwn"):
        alg = get_algorithm(name)
        hp = make_hparams(alg, {"em_steps": 1, "warmup_rounds": 0} if name == "pfedwn" else None)
        step = jax.jit(lambda st, k, c, alg=alg, hp=hp: alg.round(st, k, c, hp)[0])
        state = step(alg.init(jax.random.PRNGKey(0), ctx, hp), jax.random.PRNGKey(1), ctx)
        leaves = jax.tree.leaves(state)
        assert all(np.all(np.isfinite(np.asarray(a))) for a in leaves)
        assert all(s * s not in np.shape(a) and np.size(a) < s * s for a in leaves)
    pi = np.asarray(state.pi)
    assert pi.shape == (s, degree + 1)
    has = mask[:, 1:].any(1)
    np.testing.assert_allclose(pi[has].sum(1), 1.0, atol=1e-5)
    assert np.all(pi[~mask] == 0) and np.all(pi[:, 0] == 0) and np.all(pi[~has] == 0)
    assert time.perf_counter() - t0 < 60
