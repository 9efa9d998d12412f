"""Candidate links of a large network: each node's K nearest others, or all within a radius.

A cell grid on the host (NumPy, float64): nodes are bucketed into square cells at least as
wide as the search radius, so every node within the radius of a query lies in its 3 x 3 block
of cells. Queries run in chunks, so memory is O(N K) (plus a chunk of 9 x the fullest cell
per query), never [N, N]. The K-nearest query is a radius query whose radius doubles for the
nodes that found fewer than K others. Order and ties are deterministic: by squared distance
(float64, `dx * dx + dy * dy`), then by node index.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pfedwn_jax._checks import check_finite, check_float, check_int
from pfedwn_jax.devices import check_host_bytes

# elements (query rows x gathered nodes) per chunk of a radius query
_CHUNK_ELEMENTS = 1 << 22
# finest grid: at most 2**20 cells per axis (a radius far below the spread needs no more)
_MAX_CELLS = 1 << 20
_OFFSETS = np.array([(dx, dy) for dx in (-1, 0, 1) for dy in (-1, 0, 1)], np.int64)  # [9, 2]


def check_positions(positions: Any, min_nodes: int = 2) -> np.ndarray:
    """`positions` as float64 [N, 2] (N >= min_nodes, finite); `ValueError` naming it."""
    try:
        xy = np.asarray(positions, np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"positions must be an [N, 2] array of numbers; got {positions!r}") from e
    if xy.ndim != 2 or xy.shape[1] != 2 or xy.shape[0] < min_nodes:
        raise ValueError(
            f"positions must have shape [N, 2] with N >= {min_nodes}; got {list(xy.shape)}"
        )
    check_finite("positions", xy)
    return xy


def _key(cell: np.ndarray) -> np.ndarray:
    """Unique int64 key of cells [..., 2] with coordinates in [-1, _MAX_CELLS + 1]."""
    return (cell[..., 0] + 1) * (_MAX_CELLS + 3) + (cell[..., 1] + 1)


def _grid(xy: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """(cell [N, 2] int64, order [N] (nodes by cell key, then index), cell side, sorted keys)."""
    lo = xy.min(axis=0)
    span = float(np.max(xy.max(axis=0) - lo))
    side = max(radius, span / _MAX_CELLS, np.finfo(float).tiny)
    cell = np.floor((xy - lo) / side).astype(np.int64)
    key = _key(cell)
    order = np.argsort(key, kind="stable")
    return cell, order, side, key[order]


def _gather_block(
    rows: np.ndarray, cell: np.ndarray, keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Nodes in the 3 x 3 cell block of each query row, as positions in the cell order:
    (slot [R, M] int64, present [R, M] bool)."""
    nb = cell[rows][:, None, :] + _OFFSETS  # [R, 9, 2]
    nkey = _key(nb)
    start = np.searchsorted(keys, nkey, "left")
    count = np.searchsorted(keys, nkey, "right") - start  # [R, 9] (0 for empty / outside)
    width = max(1, int(count.max()))
    slot = np.arange(width)
    present = slot < count[..., None]  # [R, 9, width]
    at = np.minimum(start[..., None] + slot, len(keys) - 1)
    r = len(rows)
    return at.reshape(r, -1), present.reshape(r, -1)


def _compact(ok: np.ndarray, *arrays: tuple[np.ndarray, Any]) -> list[np.ndarray]:
    """Entries of each `(array [R, M], fill)` where `ok` [R, M], moved to the front of their
    row in order, the rest `fill`: [R, max count] each. Linear time (no sort)."""
    cnt = ok.sum(axis=1)
    width = max(1, int(cnt.max(initial=0)))
    rows, cols = np.nonzero(ok)
    dest = (np.cumsum(ok, axis=1) - 1)[rows, cols]
    out = []
    for a, fill in arrays:
        b = np.full((ok.shape[0], width), fill, a.dtype)
        b[rows, dest] = a[rows, cols]
        out.append(b)
    return out


def _sort_rows(node: np.ndarray, d2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row by (d2, node); padding (inf) last. Rows with tied distances get a lexsort."""
    o = np.argsort(d2, axis=1, kind="stable")
    node, d2 = np.take_along_axis(node, o, 1), np.take_along_axis(d2, o, 1)
    tied = np.any((d2[:, 1:] == d2[:, :-1]) & np.isfinite(d2[:, 1:]), axis=1)
    if tied.any():
        o = np.lexsort((node[tied], d2[tied]), axis=-1)
        node[tied] = np.take_along_axis(node[tied], o, 1)
    return node, d2


def _radius_rows(
    xy: np.ndarray, rows: np.ndarray, radius: float, ordered: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All nodes j != i with |x_j - x_i| <= radius for each i in rows.

    Returns (node [R, M] int64, d2 [R, M] float64 (inf where absent), count [R]); M is the
    largest count (>= 1), rows padded with node 0 / inf; sorted by (d2, index) if `ordered`.
    """
    cell, order, _, keys = _grid(xy, radius)
    xs, ys = xy[order, 0], xy[order, 1]  # in cell order: the block gathers are contiguous runs
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))  # node -> its position in the cell order
    full = max(1, int(np.max(np.unique(keys, return_counts=True)[1])))
    step = max(1, _CHUNK_ELEMENTS // (9 * full))
    parts = []
    for lo in range(0, len(rows), step):
        q = rows[lo : lo + step]
        at, present = _gather_block(q, cell, keys)
        dx = xs[at] - xy[q, None, 0]
        dy = ys[at] - xy[q, None, 1]
        d2 = dx * dx + dy * dy
        ok = present & (d2 <= radius * radius) & (at != rank[q, None])
        at, d2 = _compact(ok, (at, 0), (d2, np.inf))
        node = np.where(np.isfinite(d2), order[at], 0)
        if ordered:
            node, d2 = _sort_rows(node, d2)
        parts.append((node, d2, ok.sum(axis=1)))
    width = max(p[0].shape[1] for p in parts)
    pad = lambda a, v: np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=v)
    node = np.concatenate([pad(p[0], 0) for p in parts])
    d2 = np.concatenate([pad(p[1], np.inf) for p in parts])
    return node, d2, np.concatenate([p[2] for p in parts])


def _nearest(xy: np.ndarray, k: int, radius: float | None) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest (within `radius` if given): (node [N, k] int64, d2 [N, k], inf if absent)."""
    n = len(xy)
    span = float(np.max(xy.max(axis=0) - xy.min(axis=0)))
    if radius is None:  # start near the expected k-NN radius of a uniform layout, then double
        r = max(span * math.sqrt((k + 1) / (math.pi * n)) * 1.5, np.finfo(float).tiny)
    else:
        r = radius
    node = np.zeros((n, k), np.int64)
    d2 = np.full((n, k), np.inf)
    todo = np.arange(n)
    while len(todo):
        nd, dd, cnt = _radius_rows(xy, todo, r)
        w = min(k, nd.shape[1])
        done = (cnt >= k) | (radius is not None) | (r > 2.0 * span)
        node[todo[done], :w] = nd[done, :w]
        d2[todo[done], :w] = dd[done, :w]
        todo, r = todo[~done], 2.0 * r
    return node, d2


def candidate_neighbors(
    positions: Any, *, k: int | None = None, radius: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Candidate links of every node: `(idx [N, K] int32, mask [N, K] bool)`.

    Row i lists other nodes j != i by increasing distance (ties by index):
      k only:      the k nearest, K = k (<= N - 1), mask all True;
      radius only: all within `radius` metres (distance <= radius), K = the largest count
                   (at least 1), shorter rows padded;
      both:        the k nearest of those within `radius`, K = k, padded.
    Padded slots hold the node's own index (safe to gather) with mask False. Host NumPy with
    a cell grid: O(N K) memory, about O(N K log K) time for uniform layouts.
    """
    xy = check_positions(positions)
    n = len(xy)
    if k is None and radius is None:
        raise ValueError("candidate_neighbors needs k (nearest count) or radius (metres)")
    if k is not None:
        k = check_int("k", k, 1, n - 1)
    if radius is not None:
        radius = check_float("radius", radius, 0.0, None, low_inclusive=False)
    if k is None:
        assert radius is not None  # checked above: k or radius
        node, d2, _ = _radius_rows(xy, np.arange(n), radius)
    else:
        check_host_bytes(  # [N, k] indices, distances, mask and their temporaries
            40 * n * k,
            f"candidate_neighbors of {n} nodes x k={k}",
            "fewer candidates per node (k) or fewer nodes",
        )
        node, d2 = _nearest(xy, k, radius)
    mask = np.isfinite(d2)
    own = np.arange(n)[:, None]
    return np.where(mask, node, own).astype(np.int32), mask
