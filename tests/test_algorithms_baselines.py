"""Local, FedAvg and FedProx against independent references (numpy, a plain GD loop)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from pfedwn_jax.algorithms import (
    RoundContext,
    available_algorithms,
    get_algorithm,
    group_average_matrix,
    group_average_weights,
    init_clients,
    local_update,
    make_hparams,
    neighbor_lists,
)
from pfedwn_jax.data.client_data import ClientData
from pfedwn_jax.models import get_model

SHAPE = (5, 5, 1)
CLASSES = 3


def make_data(counts, seed=0) -> ClientData:
    """Random images and labels, each client padded to max(counts)."""
    rng = np.random.default_rng(seed)
    n, m = len(counts), max(counts)
    x = rng.integers(0, 256, size=(n, m, *SHAPE), dtype=np.uint8)
    y = rng.integers(0, CLASSES, size=(n, m)).astype(np.int32)
    mask = np.arange(m)[None, :] < np.asarray(counts)[:, None]
    x = np.where(mask[:, :, None, None, None], x, 0).astype(np.uint8)
    y = np.where(mask, y, 0).astype(np.int32)
    return ClientData(
        jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask), jnp.asarray(counts, jnp.int32)
    )


def make_ctx(counts, adjacency=None, *, lr=0.1, batch_size=4, epochs=1) -> RoundContext:
    s = len(counts)
    adjacency = np.ones((s, s), bool) if adjacency is None else np.asarray(adjacency, bool)
    neighbors, neighbor_mask = neighbor_lists(adjacency)
    return RoundContext(
        model=get_model("logreg", CLASSES, SHAPE),
        optimizer=optax.sgd(lr),
        train=make_data(counts),
        data_client=jnp.arange(s, dtype=jnp.int32),
        neighbors=jnp.asarray(neighbors),
        neighbor_mask=jnp.asarray(neighbor_mask),
        is_target=jnp.arange(s) == 0,
        num_samples=jnp.asarray(counts, jnp.float32),
        batch_size=batch_size,
        local_epochs=epochs,
    )


def copy(tree):
    """A fresh copy (the engine may donate its input buffers)."""
    return jax.tree_util.tree_map(jnp.array, tree)


def jit_round(alg, hp):
    """The round compiled once (as the runner does), context passed as a pytree argument."""
    return jax.jit(lambda state, key, ctx: alg.round(state, key, ctx, hp)[0])


def run_rounds(name, ctx, rounds, hp_overrides=None, seed=0):
    alg = get_algorithm(name)
    hp = make_hparams(alg, hp_overrides)
    step = jit_round(alg, hp)
    state = alg.init(jax.random.PRNGKey(seed), ctx, hp)
    for r in range(rounds):
        state = step(state, jax.random.PRNGKey(100 + r), ctx)
    return alg.eval_params(state, ctx, hp)


def leaves64(params):
    return [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(params)]


def test_registry_lists_the_baselines_and_rejects_unknown_names():
    assert {"local", "fedavg", "fedprox"} <= set(available_algorithms())
    with pytest.raises(ValueError, match="fedavg"):
        get_algorithm("fedsgd")
    with pytest.raises(ValueError, match=r"fedprox\.mu"):
        make_hparams(get_algorithm("fedprox"), {"mu": -0.1})
    with pytest.raises(ValueError, match="unknown field"):
        make_hparams(get_algorithm("fedprox"), {"lam": 1.0})


def test_group_average_matrix_by_hand():
    adj = np.array([[1, 1, 0], [0, 1, 0], [1, 1, 1]], bool)
    m = np.asarray(group_average_matrix(jnp.asarray(adj), jnp.asarray([1.0, 3.0, 4.0])))
    np.testing.assert_allclose(m, [[0.25, 0.75, 0], [0, 1, 0], [0.125, 0.375, 0.5]], rtol=1e-6)
    nbr, mask = neighbor_lists(adj)  # rows [0, 1], [1, pad], [2, 0, 1]
    w = np.asarray(group_average_weights(nbr, mask, jnp.asarray([1.0, 3.0, 4.0])))
    np.testing.assert_allclose(w, [[0.25, 0.75, 0], [1, 0, 0], [0.5, 0.125, 0.375]], rtol=1e-6)
    empty = np.asarray(group_average_weights(nbr, mask, jnp.zeros(3)))  # no weight: keep own
    np.testing.assert_array_equal(empty, np.eye(3)[[0, 0, 0]])


def test_shape_errors_at_the_entry_points_are_value_errors():
    with pytest.raises(ValueError, match=r"adjacency must have shape \(3, 3\); got \(3, 2\)"):
        group_average_matrix(jnp.ones((3, 2), bool), jnp.ones(3))
    with pytest.raises(ValueError, match=r"weights must have shape \(3,\); got \(4,\)"):
        group_average_matrix(jnp.ones((3, 3), bool), jnp.ones(4))
    ctx = make_ctx([5, 6, 7])
    bad = ctx.replace(neighbor_mask=jnp.ones((3, 2), bool))
    with pytest.raises(
        ValueError, match=r"neighbor_mask must have shape \[S, K\] = \(3, 3\); got \(3, 2\)"
    ):
        init_clients(jax.random.PRNGKey(0), bad)
    bad = ctx.replace(neighbors=ctx.neighbors[:, ::-1])
    with pytest.raises(ValueError, match=r"neighbors\[s, 0\] must be s itself.*row 0 has 2"):
        init_clients(jax.random.PRNGKey(0), bad)
    bad = ctx.replace(neighbors=ctx.neighbors.at[1, 2].set(3))
    with pytest.raises(ValueError, match=r"neighbors must be in \[0, 2\]; got 3"):
        init_clients(jax.random.PRNGKey(0), bad)
    with pytest.raises(ValueError, match="epochs or num_steps"):
        local_update(ctx, init_clients(jax.random.PRNGKey(0), ctx), jax.random.PRNGKey(1),
                     epochs=1, num_steps=2)  # fmt: skip


def test_round_context_is_a_pytree_with_static_settings():
    ctx = make_ctx([5, 6, 7])
    leaves, treedef = jax.tree_util.tree_flatten(ctx)
    assert len(leaves) == len(jax.tree_util.tree_leaves(ctx.train)) + 5  # only the arrays
    assert jax.tree_util.tree_unflatten(treedef, leaves).batch_size == ctx.batch_size
    # equal settings, equal tree definitions: a compiled round is reused
    same = ctx.replace(neighbor_mask=ctx.neighbor_mask.at[:, 1:].set(False))
    assert jax.tree_util.tree_structure(same) == treedef
    assert jax.tree_util.tree_structure(ctx.replace(local_epochs=2)) != treedef
    traces = []

    @jax.jit
    def count(c):
        traces.append(1)
        return c.num_samples.sum() * c.batch_size

    assert float(count(ctx)) == float(count(same)) == 18 * ctx.batch_size
    assert len(traces) == 1
    count(ctx.replace(batch_size=2))
    assert len(traces) == 2


def test_fedavg_over_a_group_of_one_equals_local():
    ctx = make_ctx([13])
    local = run_rounds("local", ctx, 3)
    fedavg = run_rounds("fedavg", ctx, 3)
    chex.assert_trees_all_equal(local, fedavg)


@pytest.mark.parametrize(
    "adjacency",
    [
        None,  # single-target group: fully connected
        [[1, 1, 0, 1], [0, 1, 0, 0], [1, 1, 1, 0], [0, 0, 1, 1]],  # network-wide rows
    ],
)
def test_fedavg_aggregate_is_the_sample_weighted_mean(adjacency):
    counts = [5, 17, 30, 9]
    ctx = make_ctx(counts, adjacency)
    key = jax.random.PRNGKey(7)
    local, fedavg = get_algorithm("local"), get_algorithm("fedavg")
    hp = make_hparams(local)
    state0 = local.init(jax.random.PRNGKey(0), ctx, hp)
    # one round of local training alone, and one FedAvg round from the same state and key
    trained = leaves64(local.eval_params(jit_round(local, hp)(copy(state0), key, ctx), ctx, hp))
    averaged = leaves64(fedavg.eval_params(jit_round(fedavg, hp)(copy(state0), key, ctx), ctx, hp))
    adj = np.ones((4, 4), bool) if adjacency is None else np.asarray(adjacency, bool)
    n = np.asarray(counts, np.float64)
    for p, got in zip(trained, averaged, strict=True):
        expected = np.stack(
            [sum(n[j] * p[j] for j in range(4) if adj[i, j]) / n[adj[i]].sum() for i in range(4)]
        )
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-6)
    # the clients really differed before averaging (otherwise the test proves nothing)
    assert np.abs(trained[0][0] - trained[0][1]).max() > 1e-3


def _gd_reference(ctx, w0, rounds, epochs, lr, mu):
    """Full-batch gradient descent with the proximal term, written as a plain loop."""
    model = ctx.model
    count = int(ctx.train.count[0])
    x, y = ctx.train.x[0, :count], ctx.train.y[0, :count]

    def objective(w, anchor):
        logp = jax.nn.log_softmax(model.apply(w, x))
        ce = -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))
        prox = sum(
            jnp.sum((a - b) ** 2)
            for a, b in zip(
                jax.tree_util.tree_leaves(w), jax.tree_util.tree_leaves(anchor), strict=True
            )
        )
        return ce + 0.5 * mu * prox

    w = w0
    for _ in range(rounds):
        anchor = w
        for _ in range(epochs):
            g = jax.grad(objective)(w, anchor)
            w = jax.tree_util.tree_map(lambda p, d: p - lr * d, w, g)
    return w


@pytest.mark.parametrize("mu", [0.0, 2.0])
def test_fedprox_matches_proximal_gradient_descent(mu):
    # one client, batch larger than its data: each local epoch is one full-batch step, so the
    # engine's SGD must equal plain GD on f(w) + mu/2 ||w - w_round_start||^2.
    lr, epochs, rounds = 0.5, 3, 2
    ctx = make_ctx([12], lr=lr, batch_size=16, epochs=epochs)
    alg = get_algorithm("fedprox")
    hp = make_hparams(alg, {"mu": mu})
    step = jit_round(alg, hp)
    state = alg.init(jax.random.PRNGKey(0), ctx, hp)
    w0 = jax.tree_util.tree_map(lambda p: p[0], copy(state.clients.params))
    for r in range(rounds):
        state = step(state, jax.random.PRNGKey(r), ctx)
    got = jax.tree_util.tree_map(lambda p: p[0], alg.eval_params(state, ctx, hp))
    want = _gd_reference(ctx, w0, rounds, epochs, lr, mu)
    chex.assert_trees_all_close(got, want, rtol=1e-4, atol=1e-5)
    if mu > 0:  # the proximal term matters here: plain GD ends elsewhere
        plain = _gd_reference(ctx, w0, rounds, epochs, lr, 0.0)
        assert (
            max(np.abs(a - b).max() for a, b in zip(leaves64(got), leaves64(plain), strict=True))
            > 1e-3
        )
