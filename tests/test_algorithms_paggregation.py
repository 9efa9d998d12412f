"""Personalized aggregation (FedFomo, FedALA, APPLE) against plain per-client references
(a Python loop over clients, full-batch gradient descent), their limits, and their runs in
run/sweep, network mode and stale lossy links."""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY_RUN
from pfl_refs import ADJ, LR, assert_close, client_data, gd, init_list, make_ctx, run

import pfedwn_jax
from pfedwn_jax import ExperimentConfig
from pfedwn_jax.algorithms import get_algorithm, make_hparams
from pfedwn_jax.engine import per_sample_ce

ALL = ("out",)  # logreg: one layer


def sq_norm(a, b):
    return sum(float(jnp.sum((x - y) ** 2)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def fomo_reference(ctx, rounds, frac):
    """FedFomo per client (paper eq. 6-7): weights on own validation data, then training."""
    models, all_w = init_list(ctx), []
    for _ in range(rounds):
        sent, models, all_w = list(models), [], []
        for i in range(4):
            n = int(ctx.train.count[i])
            nv = math.floor(np.float32(frac) * np.float32(n))
            x, y = client_data(ctx, i)
            xv, yv = x[n - nv :], y[n - nv :]
            loss = lambda m: (
                float(jnp.mean(per_sample_ce(ctx.model.apply(m, xv), yv))) if nv else 0.0
            )
            row = np.nonzero(ADJ[i])[0]
            w = np.array(
                [
                    max(
                        0.0,
                        (loss(sent[i]) - loss(sent[j]))
                        / (math.sqrt(sq_norm(sent[j], sent[i])) + 1e-5),
                    )
                    for j in row
                ]
            )
            agg = sent[i]
            if w.sum() == 0:
                w = (row == i).astype(float)  # no neighbor helps: keep its own
            else:
                w = w / w.sum()
                agg = jax.tree.map(
                    lambda *p: sum(wt * q for wt, q in zip(w, p)), *[sent[j] for j in row]
                )
            all_w.append(w)
            models.append(gd(ctx, agg, i, 1, ALL, n=n - nv))
    return models, all_w


def test_fedfomo_two_rounds_equal_the_per_client_reference():
    ctx = make_ctx("logreg")
    state, params = run("fedfomo", ctx, 3)
    want, weights = fomo_reference(ctx, 3, 0.2)
    assert_close(params, want)
    got_w = np.asarray(state.weights)
    nbr = np.asarray(ctx.neighbors)
    for i in range(4):
        row = np.nonzero(ADJ[i])[0]
        got = {int(nbr[i, k]): got_w[i, k] for k in range(nbr.shape[1]) if ctx.neighbor_mask[i, k]}
        np.testing.assert_allclose([got[j] for j in row], weights[i], rtol=1e-3, atol=1e-5)
    # a neighbor's model really was taken in (otherwise the test proves little)
    assert max(w[1:].max(initial=0) for w in weights) > 0.05


def test_fedfomo_without_validation_data_is_local():
    ctx = make_ctx("logreg")
    _, got = run("fedfomo", ctx, 2, {"val_fraction": 0.0})
    _, want = run("local", ctx, 2)
    chex.assert_trees_all_equal(got, want)
    with pytest.raises(ValueError, match=r"hparams\.fedfomo\.val_fraction"):
        make_hparams(get_algorithm("fedfomo"), {"val_fraction": 1.0})


PAGG = ("fedfomo", "fedala", "apple")
SMOKE = {**TINY_RUN, "rounds": 2}


@pytest.mark.parametrize(
    "name", [PAGG[0], *(pytest.param(n, marks=pytest.mark.slow) for n in PAGG[1:])]
)
def test_run_sweep_network_and_stale_lossy_links(name):
    lossy = dict(link_model="bernoulli", link_failure=0.3, stale=True)
    config = ExperimentConfig(**SMOKE, algorithms=(name,), mode="network", **lossy)
    result = pfedwn_jax.run(config, progress=False)
    assert np.all(np.isfinite(result.methods[name]["client_accuracy"]))
    swept = pfedwn_jax.sweep(
        ExperimentConfig(**SMOKE, algorithms=(name,)), seeds=[0, 1], progress=False
    )
    assert np.all(np.isfinite(swept.rows["target_accuracy"]))


# --- FedALA ---------------------------------------------------------------------------------


def ala_reference(ctx, own, glob, epochs, eta):
    """ALA per client: element-wise weights on the head learned over in-order minibatches of
    all the client's samples (rand_fraction 1), the body taken from the group model."""
    out = []
    for c in range(4):
        x, y = client_data(ctx, c)
        h, hg = own[c]["out"], glob[c]["out"]
        w = jax.tree.map(jnp.ones_like, h)
        mix = lambda w, h=h, hg=hg: jax.tree.map(lambda p, q, wt: p + (q - p) * wt, h, hg, w)
        for _ in range(epochs):
            for i in range(len(y) // ctx.batch_size):
                xb, yb = (a[i * ctx.batch_size : (i + 1) * ctx.batch_size] for a in (x, y))
                g = jax.grad(
                    lambda hh, c=c, xb=xb, yb=yb: jnp.mean(
                        per_sample_ce(ctx.model.apply({**glob[c], "out": hh}, xb), yb)
                    )
                )(mix(w))
                w = jax.tree.map(
                    lambda wt, gr, p, q: jnp.clip(wt - eta * gr * (q - p), 0, 1), w, g, h, hg
                )
        out.append({**glob[c], "out": mix(w)})
    return out


def test_fedala_weight_learning_equals_the_per_client_reference():
    from pfedwn_jax.algorithms.fedala import learn_weights

    ctx = make_ctx().replace(batch_size=8)
    alg = get_algorithm("fedala")
    hp = make_hparams(alg, {"rand_fraction": 1.0, "start_epochs": 2, "eta": 5.0})
    keys = jax.random.split(jax.random.PRNGKey(3), 8)
    own = jax.vmap(ctx.model.init)(keys[:4])
    glob = jax.vmap(ctx.model.init)(keys[4:])
    state = alg.init(jax.random.PRNGKey(0), ctx, hp)
    fn = jax.jit(lambda o, g, w, s: learn_weights(ctx, o, g, w, s, jax.random.PRNGKey(1), hp))
    slots = lambda t: [jax.tree.map(lambda p: p[i], t) for i in range(4)]
    for started, epochs in ((False, 2), (True, 1)):
        got, w, now = fn(own, glob, state.ala_weights, jnp.full(4, started))
        assert_close(got, ala_reference(ctx, slots(own), slots(glob), epochs, 5.0))
        assert np.all(np.asarray(now))
    assert 0.01 < float(jnp.mean(w["out"]["kernel"])) < 0.99  # the weights really moved
    same, _, now = fn(own, own, state.ala_weights, jnp.zeros(4, bool))  # nothing received
    chex.assert_trees_all_equal(same, own)
    assert not np.any(np.asarray(now))


def test_fedala_with_eta_0_starts_each_round_from_the_group_average():
    ctx = make_ctx()
    state, _ = run("fedala", ctx, 2, {"eta": 0.0})
    fedavg, _ = run("fedavg", ctx, 1)
    local = get_algorithm("local")
    hp = make_hparams(local)
    want = local.round(fedavg, jax.random.PRNGKey(101), ctx, hp)[0]
    for a, b in zip(jax.tree.leaves(state.clients.params), jax.tree.leaves(want.clients.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# --- APPLE ----------------------------------------------------------------------------------


def apple_ctx():
    """The 4-slot context training with its own SGD learning rate (APPLE scales p's step)."""
    return make_ctx("logreg").replace(optimizer=None, lr=jnp.float32(LR))


def apple_reference(ctx, rounds, lr_dr, mu, reg_rounds):
    """APPLE per client (the paper's objective, full batch): the personalized model
    ``sum_j p_j theta_j`` over the client's row, its own core and ``p`` trained on
    ``CE + lambda(r) ||p - p0||^2``, ``lambda(r) = mu 0.001^(r / reg_rounds)`` early on."""
    n = np.asarray(ctx.train.count, np.float64)
    rows = [np.nonzero(ADJ[i])[0] for i in range(4)]
    p0 = [n[row] / n[row].sum() for row in rows]
    ps, cores = [q.copy() for q in p0], init_list(ctx)
    personal = []
    for r in range(rounds):
        sent, cores, personal = list(cores), [], []
        lam = mu * 0.001 ** (r / reg_rounds) if r < reg_rounds else 0.0
        for i, row in enumerate(rows):
            x, y = client_data(ctx, i)
            own = int(np.nonzero(row == i)[0][0])

            def mix(theta, p, i=i, row=row, own=own):
                models = [theta if j == i else sent[j] for j in row]
                return jax.tree.map(lambda *q: sum(p[t] * q[t] for t in range(len(row))), *models)

            def objective(theta, p, i=i, x=x, y=y):
                ce = jnp.mean(per_sample_ce(ctx.model.apply(mix(theta, p), x), y))
                return ce + lam * jnp.sum((p - jnp.asarray(p0[i], jnp.float32)) ** 2)

            g_theta, g_p = jax.grad(objective, argnums=(0, 1))(sent[i], jnp.asarray(ps[i]))
            theta = jax.tree.map(lambda a, g: a - LR * g, sent[i], g_theta)
            ps[i] = np.asarray(ps[i]) - lr_dr * np.asarray(g_p)
            cores.append(theta)
            personal.append(mix(theta, jnp.asarray(ps[i], jnp.float32)))
    return personal, ps


def test_apple_three_rounds_equal_the_per_client_reference():
    ctx = apple_ctx()
    hp = {"lr_dr": 0.5, "mu": 0.3, "reg_rounds": 2}  # p moves enough to be seen
    state, params = run("apple", ctx, 3, hp)
    want, ps = apple_reference(ctx, 3, 0.5, 0.3, 2)
    assert_close(params, want)
    got_p, nbr = np.asarray(state.clients.params[1]), np.asarray(ctx.neighbors)
    for i in range(4):
        got = {int(nbr[i, k]): got_p[i, k] for k in range(nbr.shape[1]) if ctx.neighbor_mask[i, k]}
        np.testing.assert_allclose([got[j] for j in np.nonzero(ADJ[i])[0]], ps[i], atol=1e-5)
    assert np.abs(got_p - np.asarray(state.p0)).max() > 1e-3  # p really moved from p0


def test_apple_with_a_still_dr_vector_keeps_the_sample_shares_and_alone_is_local():
    ctx = apple_ctx()
    state, params = run("apple", ctx, 2, {"lr_dr": 0.0})
    np.testing.assert_array_equal(state.clients.params[1], state.p0)
    _, local = run("local", ctx, 2)
    alone = lambda t: jax.tree.map(lambda a: a[1], t)  # slot 1 receives no neighbor
    for a, b in zip(jax.tree.leaves(alone(params)), jax.tree.leaves(alone(local))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match=r"hparams\.apple\.reg_rounds"):
        make_hparams(get_algorithm("apple"), {"reg_rounds": -1})
    with pytest.raises(ValueError, match="apple needs the context's SGD"):
        run("apple", make_ctx("logreg"), 1)
