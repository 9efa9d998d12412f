"""Pytree helpers over stacked client parameters (every leaf has a leading slot axis S)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_int, check_rank, check_tree_leading

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
