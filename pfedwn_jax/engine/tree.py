"""Pytree helpers over stacked client parameters (every leaf has a leading slot axis S)."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_int, check_range, check_rank, check_tree_leading
from pfedwn_jax.engine.sharding import constrain_slots, resolve_shards, whole_on_slots

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


#: Elements of one block of the per-link work: `mix_sparse`'s column block of a leaf
#: (`[S, columns]`) and a row chunk of `neighbor_sq_dist` (`[rows, parameters]`): 16 MiB of
#: float32, so the working set stays a small fraction of the models however many slots.
BLOCK_ELEMENTS = 1 << 22


def block_size(total: int, per_item: int, elements: int | None = None) -> int:
    """Items per block of `total` items of `per_item` elements each, so a block holds about
    `elements` (default `BLOCK_ELEMENTS`): at least 1, at most `total`."""
    elements = BLOCK_ELEMENTS if elements is None else check_int("elements", elements, 1)
    return max(1, min(total, elements // max(per_item, 1)))


def chunked_rows(fn: Any, num_rows: int, chunk: int) -> Any:
    """`fn(rows [C] int32, real [C] bool) -> pytree [C, ...]` over every chunk of `chunk` rows
    of `0 .. num_rows - 1`, one chunk at a time (`lax.map`), stacked to `[num_rows, ...]`.

    The last chunk is padded by repeating row `num_rows - 1` with `real` False (its results
    are dropped), so a chunk always has `C = min(chunk, num_rows)` rows. With one chunk `fn`
    runs once on every row, without a loop.
    """
    num_rows, chunk = check_int("num_rows", num_rows, 1), check_int("chunk", chunk, 1)
    chunk = min(chunk, num_rows)
    blocks = -(-num_rows // chunk)
    index = jnp.arange(blocks * chunk, dtype=jnp.int32)
    rows, real = jnp.minimum(index, num_rows - 1), index < num_rows
    if blocks == 1:
        return fn(rows, real)
    out = jax.lax.map(lambda a: fn(*a), (rows.reshape(blocks, chunk), real.reshape(blocks, chunk)))
    return jax.tree.map(lambda a: a.reshape(blocks * chunk, *a.shape[2:])[:num_rows], out)


def rows_in_place(fn: Any, tree: PyTree, chunk: int) -> PyTree:
    """`tree` (leaves `[R, ...]`) with every chunk of `chunk` rows replaced by `fn(rows [C]
    int32, real [C] bool, part) -> part` (`part` leaves `[C, ...]`), one chunk at a time.

    The loop carries `tree` and writes each chunk back over it (XLA updates it in place), so
    what `fn` holds beside the rows (a fresh optimizer state, say) is one chunk's worth, not
    `R` rows'. The last chunk is padded by repeating row `R - 1` with `real` False; its padded
    results are dropped. With one chunk `fn` runs once on every row, without a loop.
    """
    num_rows = num_slots_of(tree)
    chunk = min(check_int("chunk", chunk, 1), num_rows)
    blocks = -(-num_rows // chunk)
    if blocks == 1:
        return fn(jnp.arange(num_rows, dtype=jnp.int32), jnp.ones(num_rows, bool), tree)

    def body(g: jax.Array, full: PyTree) -> PyTree:
        index = g * chunk + jnp.arange(chunk, dtype=jnp.int32)
        real, rows = index < num_rows, jnp.minimum(index, num_rows - 1)
        new = fn(rows, real, jax.tree.map(lambda a: jnp.take(a, rows, axis=0), full))
        dest = jnp.where(real, rows, num_rows)  # out of bounds: dropped
        return jax.tree.map(lambda a, b: a.at[dest].set(b, mode="drop"), full, new)

    return jax.lax.fori_loop(0, blocks, body, tree)


def by_columns(fn: Any, a: jax.Array, rows_out: int, columns: int) -> jax.Array:
    """`fn` applied to every block of `columns` columns of `a [S, D]`: `fn(block [S, c]) ->
    [rows_out, c]` for a column-wise map (column j of the result depends on column j of `a`
    only), assembled to `[rows_out, D]`.

    One loop over `ceil(D / columns)` blocks of `columns` columns each; the last block is
    shifted back to end at column D and keeps the columns its predecessor wrote. With
    `rows_out == S` the loop carries `a` and writes each block over it (XLA updates it in
    place where `a` is not used afterwards): the working set is one block, not a second
    `[S, D]` array. Otherwise it fills a fresh `[rows_out, D]` array.
    """
    return by_column_blocks(lambda block, lo: fn(block), a, rows_out, columns)


def by_column_blocks(fn: Any, a: jax.Array, rows_out: int, columns: int) -> jax.Array:
    """`by_columns` whose `fn(block [S, c], lo)` also gets the block's first column `lo` (a
    traced int, 0 for one block), to read the same columns of another `[*, D]` array."""
    s, d = a.shape
    if columns >= d:
        return fn(a, 0)
    src = lambda x, lo: jax.lax.dynamic_slice_in_dim(x, lo, columns, axis=1)
    in_place = rows_out == s

    def body(b: jax.Array, out: jax.Array) -> jax.Array:
        start = b * columns
        lo = jnp.minimum(start, d - columns)
        new = fn(src(out if in_place else a, lo), lo)
        done = (lo + jnp.arange(columns)) < start  # written by the previous block already
        new = jnp.where(done[None, :], src(out, lo), new)
        return jax.lax.dynamic_update_slice_in_dim(out, new, lo, axis=1)

    init = a if in_place else jnp.zeros((rows_out, d), a.dtype)
    return jax.lax.fori_loop(0, -(-d // columns), body, init)


def mix_sparse(
    params: PyTree,
    neighbors: Any,
    weights: Any,
    *,
    shards: int | None = 1,
    columns: int | None = None,
) -> PyTree:
    """Mix slot models along neighbor lists: `out_s = sum_k w[s, k] params[neighbors[s, k]]`.

    The sparse form of `mix` (O(S K P) instead of O(S^2 P)), i.e.
    `einsum("sk,sk...->s...", weights, leaf[neighbors])` per leaf, computed one block of
    columns of each leaf at a time (`by_columns`; mixing is a map over the parameters), and in
    each block as a loop over the K columns, each a gather of `[S, block]` accumulated in
    float32 in the order k = 0, 1, ... (the `[S, K, ...]` block is never built). Where the
    output has the rows of `params` (`S_out = S`) and `params` is not used afterwards, XLA
    writes the result over `params`: the working set is one block (about `BLOCK_ELEMENTS`),
    not a second copy of the models. The result does not depend on `columns`.

    Args:
      params: pytree, leaves `[S, ...]`.
      neighbors: `[S_out, K]` int slot indices into `params` (padding entries may point
        anywhere, e.g. the row's own slot, with weight 0).
      weights: `[S_out, K]` weights (row-stochastic for averaging; 0 on padding).
      shards: the slots' split over devices (`engine.sharding`; algorithms pass
        `ctx.shards`). Above 1, each block is gathered to every device once and the result
        constrained to the slot split, so each device computes only its own rows.
      columns: columns of a leaf mixed at once (None: `block_size(D, S)`).

    Returns: pytree with leaves `[S_out, ...]`, in the leaves' dtype.
    """
    neighbors = jnp.asarray(neighbors)
    weights = jnp.asarray(weights)
    shards = resolve_shards(shards, neighbors.shape[0]) if neighbors.ndim == 2 else 1
    num_slots = num_slots_of(params)
    check_tree_leading("params", params, num_slots)
    check_neighbors(neighbors, num_slots)
    check_rank("weights", weights, 2, "[S, K]")
    if weights.shape != neighbors.shape:
        raise ValueError(
            f"weights must have the shape of neighbors {neighbors.shape}; got {weights.shape}"
        )
    s_out = neighbors.shape[0]

    def block(a: jax.Array, dtype: Any) -> jax.Array:  # [S, c] -> [S_out, c]
        a = whole_on_slots(a, shards)
        w = weights.astype(dtype)

        def term(k: int | jax.Array) -> jax.Array:
            return w[:, k, None] * jnp.take(a, neighbors[:, k], axis=0).astype(dtype)

        # one gathered [S_out, c] at a time (a loop, not K unrolled gathers kept alive together)
        out = jax.lax.fori_loop(1, neighbors.shape[1], lambda k, acc: acc + term(k), term(0))
        return constrain_slots(out.astype(a.dtype), s_out, shards)

    def leaf(a: jax.Array) -> jax.Array:
        flat = a.reshape(num_slots, -1)
        dtype = jnp.result_type(a.dtype, jnp.float32)
        cols = block_size(flat.shape[1], num_slots) if columns is None else columns
        cols = check_int("columns", cols, 1)
        out = by_columns(lambda b: block(b, dtype), flat, s_out, cols)
        return out.reshape((s_out, *a.shape[1:]))

    out = jax.tree.map(leaf, params)
    return out if shards == 1 else constrain_slots(out, s_out, shards)


def mix_sparse_masked(
    pool: PyTree,
    index: Any,
    masks: PyTree,
    sources: Any,
    weights: Any,
    *,
    shards: int | None = 1,
    columns: int | None = None,
) -> PyTree:
    """Each coordinate of slot `s` averaged over the listed models whose masks keep it, then
    masked by `s`'s own mask (DisPFL's sparse average):

        t = sum_k w[s, k] pool[index[s, k]],  c = sum_k w[s, k] masks[sources[s, k]]
        out_s = where(c > 0, t / c, pool[s]) * masks[s]

    `pool` leaves `[P, ...]` (`P >= S`; its first `S` rows are the slots' own models, e.g.
    `neighbor_models`' pool with stale copies after them); `masks` 0/1 (bool or float)
    `[S, ...]` like the models, `sources [S, K]` the slot whose mask applies to entry
    `(s, k)`; `index`, `weights [S, K]`, `shards` and `columns` as `mix_sparse`'s. Computed
    one block of columns at a time, both sums in one loop over K in float32 (`mix_sparse`'s
    order): where `P == S` the result is written over `pool`, so the working set is one
    block (no `[S, ...]` count).
    """
    index, sources = jnp.asarray(index), jnp.asarray(sources)
    weights = jnp.asarray(weights)
    s = num_slots_of(masks)
    shards = resolve_shards(shards, s)
    check_neighbors(index, num_slots_of(pool), "index")
    check_neighbors(sources, s, "sources")
    if not (weights.shape == index.shape == sources.shape == (s, index.shape[1])):
        raise ValueError(
            f"index, sources and weights must be [S={s}, K]; got {index.shape}, "
            f"{sources.shape} and {weights.shape}"
        )

    def leaf(a: jax.Array, m: jax.Array) -> jax.Array:
        flat, mflat = a.reshape(a.shape[0], -1), m.reshape(s, -1)
        dtype = jnp.result_type(a.dtype, jnp.float32)
        w = weights.astype(dtype)

        def block(b: jax.Array, lo: Any) -> jax.Array:  # [P, c] -> [S, c]
            mb = jax.lax.dynamic_slice_in_dim(mflat, lo, b.shape[1], axis=1)
            b, mb = whole_on_slots(b, shards), whole_on_slots(mb, shards)

            def term(k: int | jax.Array) -> tuple[jax.Array, jax.Array]:
                wk = w[:, k, None]
                return (wk * jnp.take(b, index[:, k], axis=0).astype(dtype),
                        wk * jnp.take(mb, sources[:, k], axis=0).astype(dtype))  # fmt: skip

            add = lambda k, acc: jax.tree.map(jnp.add, acc, term(k))
            total, count = jax.lax.fori_loop(1, index.shape[1], add, term(0))
            mean = total.astype(a.dtype) / jnp.maximum(count, 1).astype(a.dtype)
            out = jnp.where(count > 0, mean, b[:s]) * mb.astype(a.dtype)
            return constrain_slots(out, s, shards)

        cols = block_size(flat.shape[1], flat.shape[0]) if columns is None else columns
        out = by_column_blocks(block, flat, s, check_int("columns", cols, 1))
        return out.reshape((s, *a.shape[1:]))

    return jax.tree.map(leaf, pool, masks)


def flatten_slots(params: PyTree) -> jax.Array:
    """Concatenate every leaf of each slot into one vector: `[S, total_params]`."""
    check_tree_leading("params", params, num_slots_of(params))
    leaves = jax.tree.leaves(params)
    return jnp.concatenate([a.reshape(a.shape[0], -1) for a in leaves], axis=1)


def _row_sq_dist(a: jax.Array, b: jax.Array) -> jax.Array:
    """`[R]` float32 `sum ((a - b)^2)` over each row of the pytrees `a`, `b` (leaves `[R, ...]`):
    from explicit differences, leaf by leaf, the leaves' sums added in leaf order."""
    sums = [
        jnp.sum(
            jnp.square(x.astype(jnp.float32) - y.astype(jnp.float32)).reshape(x.shape[0], -1), 1
        )
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    ]
    return functools.reduce(jnp.add, sums)


def sq_dist(params: PyTree) -> jax.Array:
    """Pairwise squared Euclidean distances between slot models: `[S, S]` float32.

    Computed from explicit differences (not the Gram identity, which loses all precision for
    nearly equal models such as right after averaging), one row at a time (`lax.map`) so the
    memory is `S x total_params`. Exactly symmetric with a zero diagonal.
    """
    s = num_slots_of(params)
    check_tree_leading("params", params, s)

    def row(i: jax.Array) -> jax.Array:
        one = jax.tree.map(lambda a: jnp.broadcast_to(a[i], a.shape), params)
        return _row_sq_dist(params, one)

    return jax.lax.map(row, jnp.arange(s))


def neighbor_sq_dist(
    params: PyTree,
    neighbors: Any,
    *,
    pool: PyTree = None,
    shards: int | None = 1,
    chunk: int | None = None,
) -> jax.Array:
    """Squared Euclidean distances to the listed neighbors: `d[s, k] = ||w_s - w_{nbr[s, k]}||^2`.

    The sparse form of `sq_dist` (`[S, K]` float32 instead of `[S, S]`, the same numbers),
    over chunks of `chunk` target rows (`chunked_rows`; None: `block_size(S, P)` rows, about
    `BLOCK_ELEMENTS` parameters), in each chunk one column `k` at a time: a gather of `[C, P]`,
    never the `[S, K, P]` block nor a flat copy of the models. The result does not depend on
    `chunk` (at least 2 rows: XLA:CPU reduces a one-row block in another order, 1 ulp).
    `params` leaves `[S, ...]`; `neighbors [S, K]` int indices into `pool` (default
    `params`; e.g. `concat(params, stale copies)`, leaves `[S', ...]`); `shards` as in
    `mix_sparse` (the pool gathered to every device once).
    """
    s = num_slots_of(params)
    check_tree_leading("params", params, s)
    pool = params if pool is None else pool
    check_tree_leading("pool", pool, num_slots_of(pool))
    neighbors = jnp.asarray(neighbors)
    check_neighbors(neighbors, num_slots_of(pool))
    if neighbors.shape[0] != s:
        raise ValueError(f"neighbors must have one row per slot ({s}); got {neighbors.shape}")
    shards = resolve_shards(shards, s)
    pool = whole_on_slots(pool, shards)
    size = sum(math.prod(a.shape[1:]) for a in jax.tree.leaves(params))
    chunk = block_size(s, size) if chunk is None else check_int("chunk", chunk, 1)
    chunk = max(chunk, min(s, 2))  # XLA:CPU sums a [1, P] block in another order (last bit)

    def rows_of(rows: jax.Array, real: jax.Array) -> jax.Array:  # [C] -> [C, K]
        own = take_slots(params, rows)
        column = lambda k: _row_sq_dist(take_slots(pool, neighbors[rows, k]), own)
        return jax.lax.map(column, jnp.arange(neighbors.shape[1])).T

    return constrain_slots(chunked_rows(rows_of, s, chunk), s, shards)


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
