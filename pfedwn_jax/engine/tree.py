"""Pytree helpers over stacked client parameters (every leaf has a leading slot axis S)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pfedwn_jax._checks import check_int, check_range, check_rank, check_tree_leading
from pfedwn_jax.engine.sharding import constrain_slots, resolve_shards, slot_mesh

PyTree = Any


def num_slots_of(params: PyTree) -> int:
    """The slot count S of a stacked pytree: the leading axis of its first leaf (`[S, ...]`)."""
    leaves = jax.tree.leaves(params)
    if not leaves or not jnp.ndim(leaves[0]):
        raise ValueError("params must be a pytree of arrays with a leading slot axis [S, ...]")
    return int(jnp.shape(leaves[0])[0])


def mix(params: PyTree, matrix: jax.Array) -> PyTree:
    """Mix slot models: `out_i = sum_j matrix[i, j] * params_j`, one einsum per leaf.

    Args:
      params: pytree, leaves `[S, ...]`.
      matrix: `[S_out, S]` weights (row-stochastic for averaging; FedAvg's group average, a
        neighbor mixing matrix, or a one-hot selection).

    Returns: pytree with leaves `[S_out, ...]`, in the leaves' dtype.
    """
    matrix = jnp.asarray(matrix)
    check_rank("matrix", matrix, 2, "[S_out, S]")
    check_tree_leading("params", params, matrix.shape[1])

    def leaf(a: jax.Array) -> jax.Array:
        m = matrix.astype(jnp.result_type(a.dtype, jnp.float32))
        out = jnp.einsum("ij,j...->i...", m, a, precision=jax.lax.Precision.HIGHEST)
        return out.astype(a.dtype)

    return jax.tree.map(leaf, params)


def check_neighbors(neighbors: Any, num_slots: int, name: str = "neighbors") -> None:
    """Raise a ``ValueError`` unless ``neighbors`` is an int ``[S_out, K]`` array of slot
    indices in ``[0, num_slots)`` (values are checked on the host only, not under tracing)."""
    check_rank(name, neighbors, 2, "[S, K]")
    if not jnp.issubdtype(jnp.result_type(neighbors), jnp.integer):
        raise ValueError(f"{name} must be integer slot indices; got {jnp.result_type(neighbors)}")
    check_range(name, neighbors, 0, num_slots - 1)


def mix_sparse(params: PyTree, neighbors: Any, weights: Any, *, shards: int | None = 1) -> PyTree:
    """Mix slot models along neighbor lists: `out_s = sum_k w[s, k] params[neighbors[s, k]]`.

    The sparse form of `mix` (O(S K P) instead of O(S^2 P)), i.e.
    `einsum("sk,sk...->s...", weights, leaf[neighbors])` per leaf, computed as a loop over the
    K columns, each a gather of `[S, ...]` accumulated in float32 (the `[S, K, ...]` block is
    never built: memory O(S P), and faster than the einsum on a CPU, where it is
    memory-bound).

    Args:
      params: pytree, leaves `[S, ...]`.
      neighbors: `[S_out, K]` int slot indices into `params` (padding entries may point
        anywhere, e.g. the row's own slot, with weight 0).
      weights: `[S_out, K]` weights (row-stochastic for averaging; 0 on padding).
      shards: the slots' split over devices (`engine.sharding`; algorithms pass
        `ctx.shards`). Above 1, each leaf is gathered to every device once and the result
        constrained to the slot split, so each device computes only its own rows (left to
        itself, XLA re-gathered the operand for every column: 6x slower, 3x the memory).

    Returns: pytree with leaves `[S_out, ...]`, in the leaves' dtype.
    """
    neighbors = jnp.asarray(neighbors)
    weights = jnp.asarray(weights)
    shards = resolve_shards(shards, neighbors.shape[0]) if neighbors.ndim == 2 else 1
    check_tree_leading("params", params, num_slots_of(params))
    check_neighbors(neighbors, num_slots_of(params))
    check_rank("weights", weights, 2, "[S, K]")
    if weights.shape != neighbors.shape:
        raise ValueError(
            f"weights must have the shape of neighbors {neighbors.shape}; got {weights.shape}"
        )

    def leaf(a: jax.Array) -> jax.Array:
        dtype = jnp.result_type(a.dtype, jnp.float32)
        w = weights.astype(dtype).reshape(weights.shape + (1,) * (a.ndim - 1))

        def term(k: int | jax.Array) -> jax.Array:
            return w[:, k] * jnp.take(a, neighbors[:, k], axis=0).astype(dtype)

        # one gathered [S, ...] at a time (a loop, not K unrolled gathers the scheduler may
        # keep alive together: with slots sharded over devices each would be replicated)
        out = jax.lax.fori_loop(1, neighbors.shape[1], lambda k, acc: acc + term(k), term(0))
        return out.astype(a.dtype)

    if shards == 1:
        return jax.tree.map(leaf, params)
    mesh = slot_mesh(shards)
    everywhere = lambda a: jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P()))
    out = jax.tree.map(leaf, jax.tree.map(everywhere, params))
    return constrain_slots(out, neighbors.shape[0], shards)


def flatten_slots(params: PyTree) -> jax.Array:
    """Concatenate every leaf of each slot into one vector: `[S, total_params]`."""
    check_tree_leading("params", params, num_slots_of(params))
    leaves = jax.tree.leaves(params)
    return jnp.concatenate([a.reshape(a.shape[0], -1) for a in leaves], axis=1)


def sq_dist(params: PyTree) -> jax.Array:
    """Pairwise squared Euclidean distances between slot models: `[S, S]` float32.

    Computed from explicit differences (not the Gram identity, which loses all precision for
    nearly equal models such as right after averaging), one row at a time (`lax.map`) so the
    memory is `S x total_params`. Exactly symmetric with a zero diagonal.
    """
    v = flatten_slots(params).astype(jnp.float32)
    return jax.lax.map(lambda row: jnp.sum(jnp.square(v - row), axis=1), v)


def neighbor_sq_dist(params: PyTree, neighbors: Any, *, shards: int | None = 1) -> jax.Array:
    """Squared Euclidean distances to the listed neighbors: `d[s, k] = ||w_s - w_{nbr[s, k]}||^2`.

    The sparse form of `sq_dist` (`[S, K]` float32 instead of `[S, S]`), from explicit
    differences as there, one column at a time (a gather of `[S, P]` per column, never the
    `[S, K, P]` block). `neighbors [S, K]` int slot indices into `params` (leaves `[S, ...]`);
    `shards` as in `mix_sparse` (the flat models gathered to every device once).
    """
    v = flatten_slots(params).astype(jnp.float32)
    neighbors = jnp.asarray(neighbors)
    check_neighbors(neighbors, v.shape[0])
    if neighbors.shape[0] != v.shape[0]:
        raise ValueError(
            f"neighbors must have one row per slot ({v.shape[0]}); got {neighbors.shape}"
        )
    shards = resolve_shards(shards, v.shape[0])
    everywhere = v
    if shards > 1:
        everywhere = jax.lax.with_sharding_constraint(v, NamedSharding(slot_mesh(shards), P()))

    def column(k: jax.Array) -> jax.Array:
        return jnp.sum(jnp.square(jnp.take(everywhere, neighbors[:, k], axis=0) - v), axis=1)

    cols = jax.lax.map(column, jnp.arange(neighbors.shape[1]))  # [K, S]
    return cols.T


def where_slots(mask: jax.Array, a: PyTree, b: PyTree) -> PyTree:
    """Per slot select: leaf `[S, ...]` of `a` where `mask [S]` is True, else of `b`."""
    mask = jnp.asarray(mask, dtype=bool)
    check_rank("mask", mask, 1, "[S]")
    check_tree_leading("a", a, mask.shape[0])
    check_tree_leading("b", b, mask.shape[0])

    def leaf(x: jax.Array, y: jax.Array) -> jax.Array:
        m = mask.reshape(mask.shape + (1,) * (x.ndim - 1))
        return jnp.where(m, x, y)

    return jax.tree.map(leaf, a, b)


def take_slots(params: PyTree, index: jax.Array) -> PyTree:
    """Gather slots: leaves `[S, ...]` -> `[K, ...]` for `index [K]` int."""
    check_rank("index", index, 1, "[K]")
    check_tree_leading("params", params, num_slots_of(params))
    return jax.tree.map(lambda a: jnp.take(a, index, axis=0), params)


def broadcast_slots(params: PyTree, num_slots: int) -> PyTree:
    """Stack one model `num_slots` times: leaves `[...]` -> `[num_slots, ...]` (fresh buffers)."""
    num_slots = check_int("num_slots", num_slots, 1)
    return jax.tree.map(lambda a: jnp.repeat(a[None], num_slots, axis=0), params)
