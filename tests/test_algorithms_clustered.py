"""Clustered methods against plain per-node loops written from their papers, and their limits."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import TINY_RUN
from test_algorithms_decentralized import (
    COUNTS,
    assert_close,
    ce,
    dense,
    gd,
    lossy,
    make_ctx,
    node_data,
    rounds,
    stack,
)

import pfedwn_jax
from pfedwn_jax.algorithms import get_algorithm, make_hparams
from pfedwn_jax.experiment import ExperimentConfig


@pytest.mark.parametrize("lost", [False, True])
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
        algorithms=("ifca",),
        mode="network",
        link_model="bernoulli",
        link_failure=0.3,
        stale=True,
    )
    res = pfedwn_jax.run(config, progress=False)
    rec = res.methods["ifca"]["records"]
    assert np.isfinite(res.methods["ifca"]["target_accuracy"]).all()
    assert np.asarray(rec["cluster"]).shape[0] == 2
