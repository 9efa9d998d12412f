"""Ditto, APFL and pFedMe against plain per-client references written from their papers,
at their limit cases, and through run / sweep / network mode / stale lossy links."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from algo_reference import (
    NETWORK,
    SINGLE,
    assert_close,
    evaluated,
    init_model,
    loss,
    make_ctx,
    max_diff,
    rounds,
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


@pytest.mark.parametrize("adjacency", [SINGLE, NETWORK])
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


# ------------------------------------------------------------------------------- APFL
def apfl_reference(ctx, n_rounds, alpha0, adaptive=True):
    lr, tau, s = float(ctx.lr), steps(ctx), ctx.num_slots
    w = [init_model(ctx)] * s
    v = [init_model(ctx)] * s
    alpha = [alpha0] * s
    for _ in range(n_rounds):
        trained = []
        for i in range(s):
            f, wi, vi, a = loss(ctx, i), w[i], v[i], alpha[i]
            for _ in range(tau[i]):
                vbar = tmap(lambda p, q, a=a: a * p + (1 - a) * q, vi, wi)
                g = jax.grad(f)(vbar)
                ga = sum(
                    float(np.sum((p - q) * r))
                    for p, q, r in zip(*map(jax.tree.leaves, (vi, wi, g)))
                )
                gw = jax.grad(f)(wi)
                wi = tmap(lambda p, d: p - lr * d, wi, gw)
                vi = tmap(lambda p, d, a=a: p - lr * a * d, vi, g)
                a = float(np.clip(a - lr * ga, 0, 1)) if adaptive else a
            trained.append(wi)
            v[i], alpha[i] = vi, a
        w = [wsum((weights(ctx, i)[j], trained[j]) for j in rows(ctx)[i]) for i in range(s)]
    return [tmap(lambda p, q, a=alpha[i]: a * p + (1 - a) * q, v[i], w[i]) for i in range(s)], alpha


@pytest.mark.parametrize("adjacency", [SINGLE, NETWORK])
def test_apfl_matches_a_per_client_loop(adjacency):
    ctx = make_ctx([*COUNTS, 4] if adjacency else COUNTS, adjacency, lr=0.5)
    alg, hp, state = rounds("apfl", ctx, 2, {"alpha": 0.6})
    want, alpha = apfl_reference(ctx, 2, 0.6)
    got = alg.eval_params(state, ctx, hp)
    np.testing.assert_allclose(alg.records(state, ctx, hp)["alpha"], alpha, rtol=1e-4, atol=1e-5)
    for i in range(ctx.num_slots):
        assert_close(tmap(lambda a, i=i: a[i], got), want[i])
    assert np.ptp(alpha) > 1e-3  # the weights moved, each its own way


def test_apfl_fixed_alpha_0_is_fedavg_and_1_is_local():
    ctx = make_ctx(COUNTS, repeat=False)
    fixed = lambda a: {"alpha": a, "adaptive": False}
    assert_close(evaluated("apfl", ctx, 2, fixed(0.0)), evaluated("fedavg", ctx, 2), 1e-5, 1e-6)
    assert_close(evaluated("apfl", ctx, 2, fixed(1.0)), evaluated("local", ctx, 2), 1e-5, 1e-6)


def test_apfl_runs_everywhere():
    smoke("pfedme")


# ------------------------------------------------------------------------------ pFedMe
def pfedme_reference(ctx, n_rounds, lam, plr, beta, k):
    lr, tau, s = float(ctx.lr), steps(ctx), ctx.num_slots
    w = [init_model(ctx)] * s
    theta = list(w)
    for _ in range(n_rounds):
        local = []
        for i in range(s):
            f, wi, t = loss(ctx, i), w[i], w[i]
            for _ in range(tau[i]):
                for _ in range(k):
                    t = tmap(
                        lambda a, g, c, wi=wi: a - plr * (g + lam * (a - c)), t, jax.grad(f)(t), wi
                    )
                wi = tmap(lambda a, b: a - lr * lam * (a - b), wi, t)
            local.append(wi)
            theta[i] = t
        means = [wsum((weights(ctx, i)[j], local[j]) for j in rows(ctx)[i]) for i in range(s)]
        w = [tmap(lambda a, m: (1 - beta) * a + beta * m, w[i], means[i]) for i in range(s)]
    return theta


@pytest.mark.parametrize("adjacency", [SINGLE, NETWORK])
def test_pfedme_matches_a_per_client_loop(adjacency):
    ctx = make_ctx([*COUNTS, 4] if adjacency else COUNTS, adjacency, lr=0.05)
    hp = {"lam": 3.0, "personal_lr": 0.05, "beta": 1.5, "inner_steps": 3}
    got = evaluated("pfedme", ctx, 2, hp)
    want = pfedme_reference(ctx, 2, 3.0, 0.05, 1.5, 3)
    for i in range(ctx.num_slots):
        assert_close(tmap(lambda a, i=i: a[i], got), want[i])


def test_pfedme_runs_everywhere():
    smoke("pfedme")


@pytest.mark.slow
def test_ditto_and_pfedme_beat_fedavg_on_disjoint_labels():
    """The family's claim where it is cheap to check: three of ten classes per client
    (pathological partition), the personalized models ahead of FedAvg's in every seed."""
    from helpers import TINY_RUN

    import pfedwn_jax
    from pfedwn_jax import ExperimentConfig

    config = ExperimentConfig(
        **{**TINY_RUN, "rounds": 8},
        partition="pathological",
        classes_per_client=3,
        algorithms=("fedavg", "ditto", "pfedme"),
    )
    result = pfedwn_jax.sweep(config, seeds=[0, 1, 2], progress=False)
    rows = result.rows
    last = rows["round"] == rows["round"].max()
    acc = {
        m: rows["target_accuracy"][last & (rows["method"] == m)]
        for m in ("fedavg", "ditto", "pfedme")
    }
    assert np.all(acc["ditto"] > acc["fedavg"] + 0.05), acc
    assert np.all(acc["pfedme"] > acc["fedavg"] + 0.05), acc
