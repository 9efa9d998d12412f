"""Ditto, APFL and pFedMe against plain per-client references written from their papers,
at their limit cases, and through run / sweep / network mode / stale lossy links."""

from __future__ import annotations

import pytest
from algo_reference import (
    NETWORK,
    assert_close,
    evaluated,
    init_model,
    loss,
    make_ctx,
    max_diff,
    rows,
    sgd,
    smoke,
    steps,
    tmap,
    weights,
    wsum,
)

from pfedwn_jax.algorithms import get_algorithm, make_hparams
from pfedwn_jax.algorithms.common import sq_norm_diff

COUNTS = [4, 8, 12]  # batch 4: 1, 2 and 3 local steps


def _fedavg(ctx, trained):
    return [
        wsum((weights(ctx, s)[j], trained[j]) for j in rows(ctx)[s]) for s in range(len(trained))
    ]


# ------------------------------------------------------------------------------ Ditto
def ditto_reference(ctx, lam, n_rounds):
    lr, tau, s = float(ctx.lr), steps(ctx), ctx.num_slots
    w = [init_model(ctx)] * s
    v = [init_model(ctx)] * s
    for _ in range(n_rounds):
        for i in range(s):
            f, anchor = loss(ctx, i), w[i]
            v[i] = sgd(
                lambda p, f=f, a=anchor: f(p) + 0.5 * lam * sq_norm_diff(p, a), v[i], lr, tau[i]
            )
        w = _fedavg(ctx, [sgd(loss(ctx, i), w[i], lr, tau[i]) for i in range(s)])
    return v


@pytest.mark.parametrize("adjacency", [None, NETWORK])
def test_ditto_matches_a_per_client_loop(adjacency):
    ctx = make_ctx([*COUNTS, 4] if adjacency else COUNTS, adjacency)
    got = evaluated("ditto", ctx, 2, {"lam": 0.5})
    want = ditto_reference(ctx, 0.5, 2)
    for i in range(ctx.num_slots):
        assert_close(tmap(lambda a, i=i: a[i], got), want[i])
    assert max_diff(tmap(lambda a: a[0], got), ditto_reference(ctx, 0.0, 2)[0]) > 1e-4


def test_ditto_lam_0_is_local():
    ctx = make_ctx(COUNTS, repeat=False)
    assert_close(evaluated("ditto", ctx, 2, {"lam": 0.0}), evaluated("local", ctx, 2), 1e-5, 1e-6)


def test_ditto_runs_everywhere():
    smoke("ditto")
    with pytest.raises(ValueError, match=r"hparams\.ditto\.lam"):
        make_hparams(get_algorithm("ditto"), {"lam": -1.0})
