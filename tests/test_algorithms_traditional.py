"""SCAFFOLD, the server optimizers (FedAvgM, FedAdam), FedDyn and FedNova against plain
per-client references written from their papers, at their limit cases, and through run /
sweep / network mode / stale lossy links."""

from __future__ import annotations

import jax
import jax.numpy as jnp
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
    rows,
    sgd,
    smoke,
    steps,
    tmap,
    trajectory,
    weights,
    wsum,
)

from pfedwn_jax.algorithms import get_algorithm, make_hparams
from pfedwn_jax.algorithms.common import sq_norm_diff

COUNTS = [4, 8, 12]  # batch 4: 1, 2 and 3 local steps


def _ctx(adjacency, **kw):
    return make_ctx([*COUNTS, 4] if adjacency else COUNTS, adjacency, **kw)


def _mean(ctx, trees, s):
    return wsum((weights(ctx, s)[j], trees[j]) for j in rows(ctx)[s])


def _sgd_corrected(f, w, corr, lr, n):
    for _ in range(n):
        w = tmap(lambda p, g, c: p - lr * (g + c), w, jax.grad(f)(w), corr)
    return w


# --------------------------------------------------------------------------- SCAFFOLD
def scaffold_reference(ctx, n_rounds, server_lr=1.0):
    lr, tau, s = float(ctx.lr), steps(ctx), ctx.num_slots
    x = [init_model(ctx)] * s
    zero = tmap(np.zeros_like, x[0])
    ci, c = [zero] * s, [zero] * s
    for _ in range(n_rounds):
        y = [
            _sgd_corrected(loss(ctx, i), x[i], tmap(np.subtract, c[i], ci[i]), lr, tau[i])
            for i in range(s)
        ]
        ci = [
            tmap(
                lambda a, b, xs, ys, i=i: a - b + (xs - ys) / (tau[i] * lr), ci[i], c[i], x[i], y[i]
            )
            for i in range(s)
        ]
        means = [_mean(ctx, y, i) for i in range(s)]
        x = [tmap(lambda m, xs: m + (server_lr - 1) * (m - xs), means[i], x[i]) for i in range(s)]
        c = [_mean(ctx, ci, i) for i in range(s)]
    return x


@pytest.mark.parametrize("adjacency", [SINGLE, NETWORK])
def test_scaffold_matches_a_per_client_loop(adjacency):
    ctx = _ctx(adjacency)
    got = evaluated("scaffold", ctx, 2, {"server_lr": 0.7})
    want = scaffold_reference(ctx, 2, 0.7)
    for i in range(ctx.num_slots):
        assert_close(tmap(lambda a, i=i: a[i], got), want[i])


def test_scaffold_zero_controls_and_one_step_is_fedavg():
    ctx = make_ctx(COUNTS, repeat=False, num_steps=1)
    # and one step from a common model stays FedAvg (every corrected gradient is the mean
    # one); with two steps the controls correct the drift and the second round departs
    for got, want in zip(trajectory("scaffold", ctx, 2), trajectory("fedavg", ctx, 2), strict=True):
        assert_close(got, want, 1e-5, 1e-6)
    ctx = ctx.replace(num_steps=2)
    assert max_diff(evaluated("scaffold", ctx, 2), evaluated("fedavg", ctx, 2)) > 1e-4


def test_scaffold_runs_everywhere_and_needs_sgd():
    smoke("scaffold")
    alg = get_algorithm("scaffold")
    ctx = make_ctx(COUNTS)
    with pytest.raises(ValueError, match="scaffold needs the context's SGD"):
        import optax

        alg.init(jax.random.PRNGKey(0), ctx.replace(optimizer=optax.adam(0.1)), make_hparams(alg))


# ------------------------------------------------------------------- FedAvgM, FedAdam
def server_opt_reference(ctx, n_rounds, kind, hp):
    lr, tau, s = float(ctx.lr), steps(ctx), ctx.num_slots
    x = [init_model(ctx)] * s
    zero = tmap(np.zeros_like, x[0])
    m, v = [zero] * s, [zero] * s
    for t in range(1, n_rounds + 1):
        y = [sgd(loss(ctx, i), x[i], lr, tau[i]) for i in range(s)]
        for i in range(s):
            g = tmap(np.subtract, x[i], _mean(ctx, y, i))
            if kind == "fedavgm":
                m[i] = tmap(lambda a, b: hp["momentum"] * a + b, m[i], g)
                x[i] = tmap(lambda a, b: a - hp["server_lr"] * b, x[i], m[i])
            else:
                b1, b2 = hp["b1"], hp["b2"]
                m[i] = tmap(lambda a, b: b1 * a + (1 - b1) * b, m[i], g)
                v[i] = tmap(lambda a, b: b2 * a + (1 - b2) * b * b, v[i], g)
                x[i] = tmap(
                    lambda p, a, b: (
                        p
                        - hp["server_lr"]
                        * (a / (1 - b1**t))
                        / (np.sqrt(b / (1 - b2**t)) + hp["tau"])
                    ),
                    x[i],
                    m[i],
                    v[i],
                )
    return x


@pytest.mark.parametrize(
    "kind, hp, adjacency",
    [
        ("fedavgm", {"server_lr": 0.8, "momentum": 0.5}, NETWORK),
        ("fedadam", {"server_lr": 0.05, "b1": 0.8, "b2": 0.9, "tau": 0.01}, None),
    ],
)
def test_server_optimizers_match_a_per_client_loop(kind, hp, adjacency):
    ctx = _ctx(adjacency)
    got = evaluated(kind, ctx, 2, hp)
    want = server_opt_reference(ctx, 2, kind, hp)
    for i in range(ctx.num_slots):
        assert_close(tmap(lambda a, i=i: a[i], got), want[i])


def test_fedavgm_without_momentum_at_rate_1_is_fedavg():
    ctx = make_ctx(COUNTS, repeat=False)
    got = evaluated("fedavgm", ctx, 2, {"momentum": 0.0, "server_lr": 1.0})
    assert_close(got, evaluated("fedavg", ctx, 2), 1e-5, 1e-6)


def test_server_optimizers_run_everywhere():
    smoke("fedavgm")
    smoke("fedadam")


# ----------------------------------------------------------------------------- FedDyn
def feddyn_reference(ctx, n_rounds, alpha):
    lr, tau, s = float(ctx.lr), steps(ctx), ctx.num_slots
    theta = [init_model(ctx)] * s
    zero = tmap(np.zeros_like, theta[0])
    g, h = [zero] * s, [zero] * s
    for _ in range(n_rounds):
        trained = []
        for i in range(s):
            f, gi, anchor = loss(ctx, i), g[i], theta[i]

            def objective(p, f=f, gi=gi, anchor=anchor):
                inner = sum(jnp.sum(a * b) for a, b in zip(jax.tree.leaves(gi), jax.tree.leaves(p)))
                return f(p) - inner + 0.5 * alpha * sq_norm_diff(p, anchor)

            trained.append(sgd(objective, theta[i], lr, tau[i]))
        g = [
            tmap(lambda a, b, c: a - alpha * (b - c), g[i], trained[i], theta[i]) for i in range(s)
        ]
        means = [_mean(ctx, trained, i) for i in range(s)]
        h = [tmap(lambda a, m, t: a - (m - t), h[i], means[i], theta[i]) for i in range(s)]
        theta = [tmap(np.subtract, means[i], h[i]) for i in range(s)]
    return theta


@pytest.mark.parametrize("adjacency", [SINGLE, NETWORK])
def test_feddyn_matches_a_per_client_loop(adjacency):
    ctx = _ctx(adjacency, lr=0.1)
    got = evaluated("feddyn", ctx, 2, {"alpha": 0.5})
    want = feddyn_reference(ctx, 2, 0.5)
    for i in range(ctx.num_slots):
        assert_close(tmap(lambda a, i=i: a[i], got), want[i])


# ---------------------------------------------------------------------------- FedNova
def fednova_reference(ctx, n_rounds):
    lr, tau, s = float(ctx.lr), steps(ctx), ctx.num_slots
    x = [init_model(ctx)] * s
    for _ in range(n_rounds):
        d = [
            tmap(lambda a, b, i=i: (a - b) / tau[i], x[i], sgd(loss(ctx, i), x[i], lr, tau[i]))
            for i in range(s)
        ]
        new = []
        for i in range(s):
            p = weights(ctx, i)
            tau_eff = sum(p[j] * tau[j] for j in rows(ctx)[i])
            new.append(tmap(lambda a, b: a - tau_eff * b, x[i], _mean(ctx, d, i)))
        x = new
    return x


@pytest.mark.parametrize("adjacency", [SINGLE, NETWORK])
def test_fednova_matches_a_per_client_loop(adjacency):
    ctx = _ctx(adjacency)
    got = evaluated("fednova", ctx, 2)
    want = fednova_reference(ctx, 2)
    for i in range(ctx.num_slots):
        assert_close(tmap(lambda a, i=i: a[i], got), want[i])
    assert max_diff(got, evaluated("fedavg", ctx, 2)) > 1e-4  # unequal steps: not FedAvg


def test_fednova_with_equal_steps_is_fedavg_and_momentum_norm():
    ctx = make_ctx([8, 8, 8], repeat=False)
    assert_close(evaluated("fednova", ctx, 2), evaluated("fedavg", ctx, 2), 1e-5, 1e-6)
    from pfedwn_jax.algorithms.fednova import step_norm

    rho, n = 0.9, 5  # ||a||_1 = sum_k (1 - rho^(n - k)) / (1 - rho), k = 0..n-1
    want = sum((1 - rho ** (n - k)) / (1 - rho) for k in range(n))
    np.testing.assert_allclose(step_norm(jnp.array([n]), rho), [want], rtol=1e-5)


def test_feddyn_and_fednova_run_everywhere():
    smoke("feddyn")
    smoke("fednova")


FIELD = ("ditto", "scaffold", "fedavgm", "fedadam", "feddyn", "fednova", "apfl", "pfedme", "fedem")


@pytest.mark.slow
@pytest.mark.parametrize("name", FIELD)
def test_a_thousand_nodes_in_network_mode(name):
    """1,000 slots, up to 6 neighbors each: a round runs, finite, and nothing is `[S, S]`."""
    from test_sparse_neighbors import random_network_ctx

    s = 1000
    ctx = random_network_ctx(s, 6)
    alg = get_algorithm(name)
    hp = make_hparams(alg, {"components": 2} if name == "fedem" else None)
    step = jax.jit(lambda st, k, c: alg.round(st, k, c, hp)[0])
    state = step(alg.init(jax.random.PRNGKey(0), ctx, hp), jax.random.PRNGKey(1), ctx)
    leaves = jax.tree.leaves((state, alg.eval_params(state, ctx, hp)))
    assert all(np.all(np.isfinite(np.asarray(a))) for a in leaves)
    assert all(s * s not in np.shape(a) and np.size(a) < s * s for a in leaves)
