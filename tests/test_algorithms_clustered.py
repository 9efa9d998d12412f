"""Clustered methods against plain per-node loops written from their papers, and their limits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY_RUN
from test_algorithms_decentralized import (
    ADJ,
    COUNTS,
    assert_close,
    ce,
    dense,
    gd,
    lossy,
    make_ctx,
    node,
    node_data,
    rounds,
    stack,
)

import pfedwn_jax
from pfedwn_jax.algorithms import get_algorithm, make_hparams
from pfedwn_jax.experiment import ExperimentConfig


@pytest.mark.parametrize("lost", [pytest.param(False, marks=pytest.mark.slow), True])
def test_ifca_two_rounds_match_a_per_node_loop(lost):
    ctx = make_ctx()
    ctxs = [lossy(ctx, seed=r) if lost else ctx for r in range(2)]
    state, got = rounds("ifca", ctx, 2, {"clusters": 3}, ctxs=ctxs)
    alg = get_algorithm("ifca")
    models0 = alg.init(jax.random.PRNGKey(0), ctx, make_hparams(alg, {"clusters": 3})).models
    theta = [
        [jax.tree.map(lambda a, s=s, j=j: a[s, j], models0) for j in range(3)] for s in range(5)
    ]
    n = np.asarray(COUNTS, np.float64)
    for c in ctxs:
        choice = [
            int(
                np.argmin([float(ce(ctx.model, theta[s][j], *node_data(ctx, s))) for j in range(3)])
            )
            for s in range(5)
        ]
        trained = [gd(ctx, theta[s][choice[s]], s, 2, 0.3) for s in range(5)]
        heard = dense(ctx, c.neighbor_mask) | np.eye(5, dtype=bool)
        new = []
        for s in range(5):
            row = []
            for j in range(3):
                members = [i for i in range(5) if heard[s, i] and choice[i] == j]
                if not members:
                    row.append(theta[s][j])
                    continue
                total = n[members].sum()
                row.append(
                    jax.tree.map(
                        lambda *a: sum(n[i] / total * a[k] for k, i in enumerate(members)),
                        *[trained[i] for i in members],
                    )
                )
            new.append(row)
        theta = new
    assert_close(got, stack([theta[s][choice[s]] for s in range(5)]))
    np.testing.assert_array_equal(state.cluster, choice)
    assert len(set(choice)) > 1  # the clusters really split the nodes here


def test_ifca_with_one_cluster_is_fedavg():
    ctx = make_ctx()
    assert_close(rounds("ifca", ctx, 2, {"clusters": 1})[1], rounds("fedavg", ctx, 2)[1], 1e-6)
    with pytest.raises(ValueError, match=r"hparams\.ifca\.clusters"):
        make_hparams(get_algorithm("ifca"), {"clusters": 0})


def test_clustered_methods_run_networked_with_lossy_stale_links():
    config = ExperimentConfig(
        **{**TINY_RUN, "rounds": 2},
        algorithms=("ifca", "cfl"),
        mode="network",
        link_model="bernoulli",
        link_failure=0.3,
        stale=True,
    )
    res = pfedwn_jax.run(config, progress=False)
    for name in ("ifca", "cfl"):
        rec = res.methods[name]["records"]
        assert np.isfinite(res.methods[name]["target_accuracy"]).all()
        assert np.asarray(rec["cluster"]).shape[0] == 2


# ----------------------------------------------------------------------- CFL
def _flat(tree) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in jax.tree.leaves(tree)])


def test_bipartition_is_complete_linkage():
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    from pfedwn_jax.algorithms.cfl import bipartition

    rng = np.random.default_rng(0)
    u = rng.normal(size=(9, 4))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    sim = u @ u.T
    members = np.array([1, 1, 0, 1, 1, 1, 0, 1, 1], bool)
    got = np.asarray(jax.jit(bipartition)(jnp.asarray(sim, jnp.float32), jnp.asarray(members)))
    idx = np.nonzero(members)[0]
    dist = 1 - sim[np.ix_(idx, idx)]
    np.fill_diagonal(dist, 0)
    parts = fcluster(linkage(squareform(dist, checks=False), "complete"), 2, "maxclust")
    want = np.zeros(9, bool)
    want[idx] = parts != parts[0]
    np.testing.assert_array_equal(got, want)


def test_cfl_two_rounds_match_a_per_node_loop():
    """Complete graph (the server's view), splits from round 1: each round, the eligible
    cluster of largest update norm splits by complete linkage on the cosine similarities."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    s = 7
    counts = [6, 9, 4, 7, 5, 8, 6]
    ctx = make_ctx(np.ones((s, s), bool), counts)
    hp = {"eps1": 1e9, "eps2": 0.0, "warmup": 0}
    state, got = rounds("cfl", ctx, 2, hp)
    alg = get_algorithm("cfl")
    theta = [node(alg.init(jax.random.PRNGKey(0), ctx, None).clients.params, i) for i in range(s)]
    cluster = np.zeros(s, int)
    for _ in range(2):
        trained = [gd(ctx, theta[i], i, 2, 0.3) for i in range(s)]
        delta = np.stack([_flat(trained[i]) - _flat(theta[i]) for i in range(s)])
        norms = np.linalg.norm(delta, axis=1)
        eligible = [c for c in set(cluster) if (cluster == c).sum() > 2]
        if eligible:
            c = max(eligible, key=lambda c: norms[cluster == c].max())
            idx = np.nonzero(cluster == c)[0]
            unit = delta[idx] / norms[idx, None]
            dist = 1 - unit @ unit.T
            np.fill_diagonal(dist, 0)
            parts = fcluster(linkage(squareform(dist, checks=False), "complete"), 2, "maxclust")
            second = idx[parts != parts[0]]
            cluster[second] = second.min()
        theta = [
            jax.tree.map(
                lambda *a, i=i: (
                    sum(a[j] for j in range(s) if cluster[j] == cluster[i])
                    / (cluster == cluster[i]).sum()
                ),
                *trained,
            )
            for i in range(s)
        ]
    np.testing.assert_array_equal(state.cluster, cluster)
    assert len(set(cluster)) == 3  # two splits happened
    assert_close(got, stack(theta))


def test_cfl_without_a_split_is_fedavg_with_equal_counts():
    ctx = make_ctx(ADJ, [6] * 5)
    never = {"eps2": 1e9}
    assert_close(rounds("cfl", ctx, 2, never)[1], rounds("fedavg", ctx, 2)[1], 1e-6)
