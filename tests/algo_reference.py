"""Shared pieces of the algorithms' reference tests: a tiny context whose minibatches do not
matter, the rounds compiled as the runner does, and plain per-client gradient steps.

Each data client holds ``n_i`` copies of one sample (``repeat=True``): any minibatch of it has
the same mean loss, so a slot's local training is ``tau_i`` plain gradient steps on
``f_i(w) = ce(w; x_i, y_i)`` whatever the batch order (``tau_i = epochs * ceil(n_i / B)`` or
``num_steps``), and a reference written as a loop over clients is exact to float tolerance.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY_RUN

import pfedwn_jax
from pfedwn_jax import ExperimentConfig
from pfedwn_jax.algorithms import RoundContext, get_algorithm, make_hparams, neighbor_lists
from pfedwn_jax.data.client_data import ClientData
from pfedwn_jax.models import get_model

SHAPE = (3, 3, 1)
CLASSES = 3
NETWORK = [[1, 1, 0, 1], [0, 1, 1, 0], [1, 1, 1, 0], [0, 0, 1, 1]]  # directed rows
# The single-target group (everyone receives everyone): its reference runs in the slow tier
# (the limit tests cover that mode in the quick one).
SINGLE = pytest.param(None, marks=pytest.mark.slow, id="single")


def make_data(counts, *, repeat=True, seed=0) -> ClientData:
    """Random images and labels; with ``repeat`` each client's samples are one sample's copies."""
    rng = np.random.default_rng(seed)
    n, m = len(counts), max(counts)
    x = rng.integers(0, 256, size=(n, m, *SHAPE), dtype=np.uint8)
    y = rng.integers(0, CLASSES, size=(n, m)).astype(np.int32)
    if repeat:
        x, y = np.repeat(x[:, :1], m, axis=1), np.repeat(y[:, :1], m, axis=1)
    mask = np.arange(m)[None, :] < np.asarray(counts)[:, None]
    x = np.where(mask[:, :, None, None, None], x, 0).astype(np.uint8)
    y = np.where(mask, y, 0).astype(np.int32)
    return ClientData(*map(jnp.asarray, (x, y, mask)), jnp.asarray(counts, jnp.int32))


def make_ctx(
    counts, adjacency=None, *, lr=0.3, batch_size=4, epochs=1, num_steps=None, repeat=True
) -> RoundContext:
    s = len(counts)
    adjacency = np.ones((s, s), bool) if adjacency is None else np.asarray(adjacency, bool)
    neighbors, neighbor_mask = neighbor_lists(adjacency)
    return RoundContext(
        model=get_model("logreg", CLASSES, SHAPE),
        optimizer=None,
        train=make_data(counts, repeat=repeat),
        data_client=jnp.arange(s, dtype=jnp.int32),
        neighbors=jnp.asarray(neighbors),
        neighbor_mask=jnp.asarray(neighbor_mask),
        is_target=jnp.arange(s) == 0,
        num_samples=jnp.asarray(counts, jnp.float32),
        batch_size=batch_size,
        local_epochs=epochs,
        num_steps=num_steps,
        lr=jnp.float32(lr),
    )


def steps(ctx: RoundContext) -> list[int]:
    """Local steps of each slot in a round."""
    if ctx.num_steps is not None:
        return [ctx.num_steps] * ctx.num_slots
    counts = np.asarray(ctx.train.count)[np.asarray(ctx.data_client)]
    return [ctx.local_epochs * math.ceil(int(n) / ctx.batch_size) for n in counts]


def rows(ctx: RoundContext) -> list[list[int]]:
    """Each slot's neighbor list (itself first), as Python ints."""
    nbr, mask = np.asarray(ctx.neighbors), np.asarray(ctx.neighbor_mask)
    return [[int(j) for j, m in zip(nbr[s], mask[s], strict=True) if m] for s in range(len(nbr))]


def weights(ctx: RoundContext, s: int) -> dict[int, float]:
    """FedAvg's sample-count weights over slot ``s``'s list."""
    n = np.asarray(ctx.num_samples, np.float64)
    row = rows(ctx)[s]
    return {j: n[j] / n[row].sum() for j in row}


def loss(ctx: RoundContext, i: int):
    """``f_i(w)``: the mean cross-entropy of data client ``i``'s real samples."""
    count = int(ctx.train.count[i])
    x, y = ctx.train.x[i, :count], ctx.train.y[i, :count]

    def f(w):
        logp = jax.nn.log_softmax(ctx.model.apply(w, x))
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    return f


def slot(tree, s: int):
    return jax.tree.map(lambda a: a[s], tree)


def tmap(fn, *trees):
    return jax.tree.map(fn, *trees)


def wsum(pairs):
    """``sum_j c_j tree_j`` of ``[(c_j, tree_j)]``."""
    out = None
    for c, t in pairs:
        term = tmap(lambda a, c=c: c * np.asarray(a, np.float64), t)
        out = term if out is None else tmap(np.add, out, term)
    return out


def sgd(f, w, lr, n):
    """``n`` plain gradient steps on ``f`` from ``w``."""
    for _ in range(n):
        w = tmap(lambda p, g: p - lr * g, w, jax.grad(f)(w))
    return w


def init(name, ctx, overrides=None, seed=0):
    alg = get_algorithm(name)
    hp = make_hparams(alg, overrides)
    return alg, hp, alg.init(jax.random.PRNGKey(seed), ctx, hp)


def rounds(name, ctx, n, overrides=None, seed=0):
    """``(alg, hp, state)`` after ``n`` compiled rounds."""
    alg, hp, state = init(name, ctx, overrides, seed)
    step = jax.jit(lambda st, key, c: alg.round(st, key, c, hp)[0])
    for r in range(n):
        state = step(state, jax.random.PRNGKey(100 + r), ctx)
    return alg, hp, state


def trajectory(name, ctx, n, overrides=None, seed=0):
    """The evaluated models ``[S, ...]`` after each of ``n`` rounds (one compiled round)."""
    alg = get_algorithm(name)
    hp = make_hparams(alg, overrides)
    state = alg.init(jax.random.PRNGKey(seed), ctx, hp)
    step = jax.jit(lambda st, key, c: alg.round(st, key, c, hp)[0])
    out = []
    for r in range(n):
        state = step(state, jax.random.PRNGKey(100 + r), ctx)
        out.append(alg.eval_params(state, ctx, hp))
    return out


def evaluated(name, ctx, n, overrides=None, seed=0):
    alg, hp, state = rounds(name, ctx, n, overrides, seed)
    return alg.eval_params(state, ctx, hp)


def init_model(ctx, seed=0):
    """The shared initial model every method starts from (``init_clients``)."""
    return ctx.model.init(jax.random.PRNGKey(seed))


def assert_close(got, want, rtol=2e-4, atol=2e-5):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def max_diff(a, b) -> float:
    return max(
        float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max())
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def smoke(name: str, hparams=None) -> None:
    """``name`` through ``pfedwn_jax.sweep`` (two seeds, single-target) and ``pfedwn_jax.run``
    in network mode over lossy links with stale copies, 2 tiny rounds each: finite results."""
    base = {**TINY_RUN, "rounds": 2, "algorithms": (name,)}
    if hparams:
        base["hparams"] = {name: hparams}
    swept = pfedwn_jax.sweep(ExperimentConfig(**base), seeds=[0, 1], progress=False)
    assert swept.num_runs == 2 and np.all(np.isfinite(swept.rows["target_accuracy"]))
    net = {**base, "mode": "network", "num_neighbors": 5, "gamma_th": 2.0, "eps": 0.1}
    config = ExperimentConfig(**net, link_model="bernoulli", link_failure=0.4, stale=True)
    result = pfedwn_jax.run(config, progress=False)
    loss = np.asarray(result.methods[name]["client_loss"], np.float64)
    assert loss.shape[-1] == 6 and np.all(np.isfinite(loss))
