"""A toy federation of logistic regressions on 4x4 images of 4 classes, whose clients hold
chosen classes: the context builder and round runner the personalised-algorithm tests share."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pfedwn_jax.algorithms import RoundContext, get_algorithm, make_hparams, neighbor_lists
from pfedwn_jax.data.client_data import ClientData
from pfedwn_jax.models import get_model

SHAPE = (4, 4, 1)
CLASSES = 4
#: An uneven network of 6 slots: in-degrees 0, 3, 1, 2, 2, 0 (+ self), two rows without
#: neighbors (the sparse and chunked per-link tests share it).
ADJ = np.array(
    [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 1],
        [0, 0, 1, 1, 0, 0],
        [1, 0, 1, 1, 0, 0],
        [0, 1, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ],
    bool,
)


def make_data(classes_per_client, n=40, seed=0) -> ClientData:
    """Client c holds `n` noisy images of the classes `classes_per_client[c]` (one mean image
    per class), so a logistic regression fits them and models of disjoint label sets disagree."""
    rng = np.random.default_rng(seed)
    means = rng.integers(0, 256, size=(CLASSES, *SHAPE))
    c = len(classes_per_client)
    x = np.zeros((c, n, *SHAPE), np.uint8)
    y = np.zeros((c, n), np.int32)
    for i, cls in enumerate(classes_per_client):
        y[i] = rng.choice(cls, size=n)
        x[i] = np.clip(means[y[i]] + rng.normal(0, 30, size=(n, *SHAPE)), 0, 255)
    mask = np.ones((c, n), bool)
    mask[-1, n - 7 :] = False  # one client with padding
    y = np.where(mask, y, 0)
    x = np.where(mask[..., None, None, None], x, 0).astype(np.uint8)
    return ClientData(
        jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask), jnp.asarray(mask.sum(1), jnp.int32)
    )


def make_ctx(classes_per_client, adjacency=None, is_target=None, *, lr=0.1) -> RoundContext:
    s = len(classes_per_client)
    data = make_data(classes_per_client)
    adjacency = np.ones((s, s), bool) if adjacency is None else np.asarray(adjacency, bool)
    is_target = np.arange(s) == 0 if is_target is None else np.asarray(is_target, bool)
    neighbors, neighbor_mask = neighbor_lists(adjacency)
    return RoundContext(
        model=get_model("logreg", CLASSES, SHAPE),
        optimizer=optax.sgd(lr),
        train=data,
        data_client=jnp.arange(s, dtype=jnp.int32),
        neighbors=jnp.asarray(neighbors),
        neighbor_mask=jnp.asarray(neighbor_mask),
        is_target=jnp.asarray(is_target),
        num_samples=jnp.asarray(data.count, jnp.float32),
        batch_size=8,
        local_epochs=1,
    )


@functools.cache
def compiled_round(name, hp):
    alg = get_algorithm(name)
    return jax.jit(lambda state, key, ctx: alg.round(state, key, ctx, hp)[0])


def run(name, ctx, rounds, overrides=None, state=None):
    """`rounds` rounds of `name` from the shared initial model; (state, eval params)."""
    alg = get_algorithm(name)
    hp = make_hparams(alg, overrides)
    if state is None:
        state = alg.init(jax.random.PRNGKey(0), ctx, hp)
    step = compiled_round(name, hp)
    for r in range(rounds):
        state = step(state, jax.random.PRNGKey(100 + r), ctx)
    return state, alg.eval_params(state, ctx, hp)


def leaves(tree):
    return [np.asarray(a, np.float64) for a in jax.tree.leaves(tree)]


GROUP = [[0, 1], [0, 1], [2, 3]]  # target, a similar neighbor, an unrelated neighbor
