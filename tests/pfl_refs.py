"""A 4-slot federation on a directed network for the algorithm references: the context,
a compiled round runner and the per-client reference pieces (full-batch gradient descent on
each client's samples, the sample-weighted group mean of a network row)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from toy_groups import CLASSES, SHAPE, make_data

from pfedwn_jax.algorithms import RoundContext, get_algorithm, make_hparams, neighbor_lists
from pfedwn_jax.engine import per_sample_ce
from pfedwn_jax.models import get_model

LR = 0.1
CLASSES_OF = [[0, 1], [0, 1], [2, 3], [1, 2]]
# directed network rows: 0 <- {1, 3}, 1 <- {}, 2 <- {0, 1}, 3 <- {2}
ADJ = np.array([[1, 1, 0, 1], [0, 1, 0, 0], [1, 1, 1, 0], [0, 0, 1, 1]], bool)


def make_ctx(model="mlp", adjacency=ADJ, epochs=1) -> RoundContext:
    """4 slots; batches of 64 >= every client's 40 samples: one full-batch step per epoch."""
    data = make_data(CLASSES_OF)
    neighbors, mask = neighbor_lists(np.asarray(adjacency, bool))
    return RoundContext(
        model=get_model(model, CLASSES, SHAPE),
        optimizer=optax.sgd(LR),
        train=data,
        data_client=jnp.arange(4, dtype=jnp.int32),
        neighbors=jnp.asarray(neighbors),
        neighbor_mask=jnp.asarray(mask),
        is_target=jnp.ones(4, bool),
        num_samples=jnp.asarray(data.count, jnp.float32),
        batch_size=64,
        local_epochs=epochs,
    )


def run(name, ctx, rounds, overrides=None, seed=0):
    """``rounds`` compiled rounds of ``name``: (state, eval params)."""
    alg = get_algorithm(name)
    hp = make_hparams(alg, overrides)
    step = jax.jit(lambda state, key, ctx: alg.round(state, key, ctx, hp)[0])
    state = alg.init(jax.random.PRNGKey(seed), ctx, hp)
    for r in range(rounds):
        state = step(state, jax.random.PRNGKey(100 + r), ctx)
    return state, alg.eval_params(state, ctx, hp)


# --- the reference: one dict of params per client, full-batch GD --------------------------


def client_data(ctx, c):
    n = int(ctx.train.count[c])
    return ctx.train.x[c, :n], ctx.train.y[c, :n]


def gd(ctx, params, c, steps, keys, n=None):
    """``steps`` full-batch gradient steps of client ``c`` on the subtrees ``keys`` (on its
    first ``n`` samples if given)."""
    x, y = client_data(ctx, c)
    x, y = x[:n], y[:n]
    loss = lambda p: jnp.mean(per_sample_ce(ctx.model.apply(p, x), y))
    for _ in range(steps):
        g = jax.grad(loss)(params)
        params = {
            k: jax.tree.map(lambda p, d: p - LR * d, v, g[k]) if k in keys else v
            for k, v in params.items()
        }
    return params


def group_mean(ctx, models, i, keys):
    """Client ``i``'s models with ``keys`` replaced by its row's sample-weighted mean."""
    n = np.asarray(ctx.train.count, np.float64)
    row = np.nonzero(ADJ[i])[0]
    mean = {
        k: jax.tree.map(
            lambda *p: sum(n[j] * p[t] for t, j in enumerate(row)) / n[row].sum(),
            *[models[j][k] for j in row],
        )
        for k in keys
    }
    return {**models[i], **mean}


def init_list(ctx):
    p = ctx.model.init(jax.random.PRNGKey(0))
    return [p] * 4


def assert_close(got, models):
    for i, want in enumerate(models):
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(g[i]), np.asarray(w), rtol=2e-4, atol=2e-6)
