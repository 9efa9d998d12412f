"""Neighbor queries of moving nodes inside a compiled program: a cell grid of static shape.

The host version (`wireless.neighbors`) sizes its grid from the positions; inside a jitted
round the positions are traced, so the grid is fixed in advance (`make_grid`): `cells x
cells` square cells over the area `[0, area]^2`, each read as at most `capacity` nodes.
A query gathers the nodes of the `(2 rings + 1)^2` cells around each node's own, `O(N
rings^2 capacity)` work and memory, and never an `[N, N]` array.

It is exact when no cell holds more than `capacity` nodes and, for the K nearest, when each
node's K-th nearest lies within `rings x side` metres (every node within that distance is in
the gathered cells); each query returns `unsure`, True when either may have failed. With
`knn_radius` (1.5x the expected K-nearest radius) as the cell side and 2 rings a uniform
layout meets both by a wide margin, corners included (there the K-nearest radius is about
2x the mean); the capacity is 3x the mean count of a cell plus 4 standard deviations plus 8.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_float, check_int

#: Most cells per axis (a radius far below the spread needs no finer grid).
MAX_CELLS = 4096


@dataclasses.dataclass(frozen=True)
class Grid:
    """A cell grid over `[0, area]^2` (static: it sets shapes).

    Attributes:
      cells: cells per axis. side: a cell's side (m), `area / cells`.
      capacity: nodes read per cell (more in one cell are missed: `overflow`).
    """

    cells: int
    side: float
    capacity: int


def make_grid(num_nodes: int, area: float, radius: float) -> Grid:
    """A grid for `num_nodes` nodes over `[0, area]^2` whose cells are at least `radius`
    metres wide, reading 3x a cell's mean count plus 4 standard deviations plus 8 nodes."""
    n = check_int("num_nodes", num_nodes, 1)
    area = check_float("area", area, 0.0, low_inclusive=False)
    radius = check_float("radius", radius, 0.0, low_inclusive=False)
    cells = max(1, min(MAX_CELLS, int(area // radius)))
    mean = n / cells**2
    capacity = min(n, math.ceil(3.0 * mean + 4.0 * math.sqrt(mean) + 8.0))
    return Grid(cells, area / cells, capacity)


def knn_radius(num_nodes: int, area: float, k: int) -> float:
    """1.5x the expected distance to the k-th nearest of `num_nodes` uniform nodes over
    `[0, area]^2` (the disc holding k + 1 of them on average)."""
    density = num_nodes / (area * area)
    return 1.5 * math.sqrt((k + 1) / (math.pi * density))


def cell_pool(xy: Any, grid: Grid, rings: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The nodes in the `(2 rings + 1)^2` cells around each node's cell:
    `(idx [N, M] int32, present [N, M] bool, overflow [] bool)`, `M = (2 rings + 1)^2
    capacity`; a node is not in its own row. `xy [N, 2]` in `[0, area]^2` (clipped)."""
    n, rings = xy.shape[0], min(rings, grid.cells - 1)  # no cells beyond the grid
    cell = jnp.clip(jnp.floor(xy / grid.side).astype(jnp.int32), 0, grid.cells - 1)
    key = cell[:, 0] * grid.cells + cell[:, 1]
    order = jnp.argsort(key, stable=True).astype(jnp.int32)
    sorted_keys = key[order]
    every = jnp.arange(grid.cells * grid.cells, dtype=jnp.int32)
    start = jnp.searchsorted(sorted_keys, every, side="left").astype(jnp.int32)
    count = jnp.searchsorted(sorted_keys, every, side="right").astype(jnp.int32) - start
    span = jnp.arange(-rings, rings + 1, dtype=jnp.int32)
    offsets = jnp.stack(jnp.meshgrid(span, span, indexing="ij"), -1).reshape(-1, 2)
    near = cell[:, None, :] + offsets  # [N, B, 2]
    inside = ((near >= 0) & (near < grid.cells)).all(-1)
    near = jnp.clip(near, 0, grid.cells - 1)
    at_cell = near[..., 0] * grid.cells + near[..., 1]
    slot = jnp.arange(grid.capacity, dtype=jnp.int32)
    present = inside[..., None] & (slot < count[at_cell][..., None])  # [N, B, C]
    at = jnp.minimum(start[at_cell][..., None] + slot, n - 1)
    idx = order[at].reshape(n, -1)
    present = present.reshape(n, -1) & (idx != jnp.arange(n, dtype=jnp.int32)[:, None])
    return idx, present, (count > grid.capacity).any()


def nearest(
    xy: Any, k: int, grid: Grid, rings: int = 2, valid: Any = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Each node's `k` nearest others among the gathered cells (and `valid [N]`, default
    all): `(idx [N, k] int32 by increasing distance, mask [N, k], unsure [])`; padding
    holds the node itself with mask False (fewer than `k` found). `unsure`: a cell
    overflowed, or a node's k-th nearest found lies beyond `rings x side` (a nearer one may
    have been outside the gathered cells)."""
    idx, present, overflow = cell_pool(xy, grid, rings)
    if valid is not None:
        present = present & valid[idx]
    d = xy[idx] - xy[:, None, :]
    d2 = jnp.where(present, (d * d).sum(-1), jnp.inf)
    width = min(k, idx.shape[1])
    neg, col = jax.lax.top_k(-d2, width)
    own = jnp.arange(xy.shape[0], dtype=jnp.int32)[:, None]
    found = jnp.isfinite(neg)
    chosen = jnp.where(found, jnp.take_along_axis(idx, col, 1), own)
    sure = jnp.float32(min(rings, grid.cells - 1) * grid.side) ** 2
    far = (grid.cells > 1 + rings) & (-neg[:, -1] > sure).any()  # all gathered: exact
    if width < k:  # fewer gathered than asked: pad
        pad = k - width
        chosen = jnp.concatenate([chosen, jnp.broadcast_to(own, (xy.shape[0], pad))], 1)
        found = jnp.concatenate([found, jnp.zeros((xy.shape[0], pad), bool)], 1)
    return chosen, found, overflow | far


def within(
    xy: Any, radius: float, grid: Grid, valid: Any = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Every other node within `radius` metres of each node: `(idx [N, M], mask [N, M],
    overflow [])` over the cells `ceil(radius / side)` rings around (unordered, masked;
    `make_grid(n, area, radius)` reads one ring)."""
    rings = max(1, math.ceil(radius / grid.side - 1e-9))
    idx, present, overflow = cell_pool(xy, grid, rings)
    if valid is not None:
        present = present & valid[idx]
    d = xy[idx] - xy[:, None, :]
    return idx, present & ((d * d).sum(-1) <= radius * radius), overflow
