"""Gossip over neighbor lists: mixing weights, connected components, consensus diagnostics.

Every function works on the sparse lists of the algorithms (``neighbors [S, K]`` int32,
row ``s``: column 0 is ``s`` itself, then the slots whose models ``s`` receives;
``mask [S, K]`` bool marks the real entries). The lists are directed: ``s`` may hear ``j``
while ``j`` does not hear ``s``. The *symmetrized* graph has the edge ``{i, j}`` when either
hears the other.

- ``symmetric_degree``, ``metropolis_weights``: Metropolis-Hastings weights (Xiao and Boyd
  2004) on the symmetrized listed graph, ``w_ij = 1 / (1 + max(d_i, d_j))``, self weight
  ``1 - sum_j w_ij``, restricted to the links that delivered this round and renormalised
  over them (a node with nothing delivered keeps its model).
- ``component_labels``: connected components of the symmetrized graph (label = smallest slot).
- ``consensus_deviation`` / ``consensus_distance``: ``||x_i - mean of i's component||^2``
  per slot and its mean over the slots.
- ``mixing_matrix``, ``consensus_contraction``, ``spectral_gap``: the round's mixing matrix
  over the delivered links and ``1 - ||(I - J) W (I - J)||_2`` (``J = 11^T / S``), dense
  for ``S <= DENSE_LIMIT`` and by power iteration on the sparse operator above.

Pure and jittable (under ``vmap`` too); no function here names an algorithm.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_int, check_rank, check_shape, check_tree_leading
from pfedwn_jax.engine.tree import block_size, num_slots_of

#: Largest slot count whose spectral gap is computed from the dense ``[S, S]`` matrix (an SVD,
#: O(S^3)); above it, ``POWER_ITERATIONS`` steps of power iteration on the sparse operator.
DENSE_LIMIT = 512
#: Power-iteration steps of ``consensus_contraction`` above ``DENSE_LIMIT`` slots.
POWER_ITERATIONS = 100


def _lists(neighbors: Any, mask: Any) -> tuple[jax.Array, jax.Array]:
    neighbors = jnp.asarray(neighbors, jnp.int32)
    mask = jnp.asarray(mask, bool)
    check_rank("neighbors", neighbors, 2, "[S, K]")
    check_shape("mask", mask, neighbors.shape, "[S, K]")
    return neighbors, mask.at[:, 0].set(False)  # the off-diagonal entries


def mutual_links(neighbors: Any, mask: Any) -> jax.Array:
    """``[S, K]`` bool: entry ``(i, k)`` is listed (off-diagonal) and ``neighbors[i, k]``
    lists ``i`` too. O(S K^2)."""
    nbr, off = _lists(neighbors, mask)
    rows = jnp.arange(nbr.shape[0], dtype=jnp.int32)[:, None, None]
    back = (nbr[nbr] == rows) & off[nbr]  # [S, K, K]: row nbr[i, k] lists i
    return off & back.any(axis=-1)


def symmetric_degree(neighbors: Any, mask: Any) -> jax.Array:
    """``[S]`` int32 degree of every slot in the symmetrized graph: in-links + out-links -
    mutual links (each undirected edge counted once)."""
    nbr, off = _lists(neighbors, mask)
    s = nbr.shape[0]
    heard = jnp.zeros((s,), jnp.int32).at[nbr].add(off.astype(jnp.int32))  # out-links
    return off.sum(axis=1) + heard - mutual_links(nbr, off).sum(axis=1)


def metropolis_weights(neighbors: Any, listed: Any, delivered: Any = None) -> jax.Array:
    """``[S, K]`` float32 row-stochastic Metropolis-Hastings gossip weights (``mix_sparse``).

    On the symmetrized graph of the ``listed`` lists: ``w_ij = 1 / (1 + max(d_i, d_j))`` for
    every edge, self weight ``w_ii = 1 - sum_{j ~ i} w_ij`` (the sum over every symmetrized
    neighbor, also those ``i`` does not hear). Row ``i`` keeps the entries it can combine,
    ``delivered [S, K]`` (default ``listed``: every listed link arrived; column 0 always),
    and is divided by their sum: a link that is not there (one-way, lost) hands its weight
    to the rest in proportion. On a symmetric graph where everything arrives, the weights
    are the doubly stochastic MH matrix; a node with nothing delivered keeps its model.
    """
    nbr, off = _lists(neighbors, listed)
    s = nbr.shape[0]
    deg = symmetric_degree(nbr, off).astype(jnp.float32)
    w = jnp.where(off, 1.0 / (1.0 + jnp.maximum(deg[:, None], deg[nbr])), 0.0)
    one_way = off & ~mutual_links(nbr, off)  # j hears i only through this entry (i, k)
    row_sum = w.sum(axis=1) + jnp.zeros((s,), jnp.float32).at[nbr].add(jnp.where(one_way, w, 0))
    full = w.at[:, 0].set(1.0 - row_sum)
    got = off if delivered is None else jnp.asarray(delivered, bool) & off
    kept = jnp.where(got.at[:, 0].set(True), full, 0.0)
    return kept / kept.sum(axis=1, keepdims=True)


def component_labels(neighbors: Any, mask: Any) -> jax.Array:
    """``[S]`` int32: each slot's connected component in the symmetrized graph, labelled by
    its smallest slot (min-label propagation both ways along the lists until nothing
    changes: as many sweeps as the largest component's diameter)."""
    nbr, off = _lists(neighbors, mask)
    s = nbr.shape[0]
    big = jnp.int32(s)

    def sweep(lab: jax.Array) -> jax.Array:
        pulled = jnp.where(off, lab[nbr], big).min(axis=1)  # from whom i hears
        pushed = jnp.full((s,), big).at[nbr].min(jnp.where(off, lab[:, None], big))
        return jnp.minimum(lab, jnp.minimum(pulled, pushed))

    def body(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        lab, _ = carry
        new = sweep(lab)
        return new, (new != lab).any()

    start = jnp.arange(s, dtype=jnp.int32)
    return jax.lax.while_loop(lambda c: c[1], body, (start, jnp.array(True)))[0]


def consensus_deviation(params: Any, labels: Any = None) -> jax.Array:
    """``[S]`` float32 ``||x_s - xbar_c(s)||^2``: each slot's squared distance (over every
    leaf of its pytree) from the mean model of its component ``labels [S]`` (default: one
    component). The mean and the differences in float32, one block of columns at a time, so
    the working set stays about ``BLOCK_ELEMENTS`` beyond the models."""
    s = num_slots_of(params)
    check_tree_leading("params", params, s)
    labels = jnp.zeros((s,), jnp.int32) if labels is None else jnp.asarray(labels, jnp.int32)
    check_shape("labels", labels, (s,), "[S]")
    size = jax.ops.segment_sum(jnp.ones((s,), jnp.float32), labels, num_segments=s)

    def block(a: jax.Array) -> jax.Array:  # [S, c] -> [S]
        a = a.astype(jnp.float32)
        mean = jax.ops.segment_sum(a, labels, num_segments=s) / jnp.maximum(size, 1)[:, None]
        return jnp.sum(jnp.square(a - mean[labels]), axis=1)

    total = jnp.zeros((s,), jnp.float32)
    for leaf in jax.tree.leaves(params):
        total = total + _column_sums(block, leaf.reshape(s, -1))
    return total


def _column_sums(fn: Any, a: jax.Array) -> jax.Array:
    """``sum_b fn(a[:, block b])`` over blocks of ``block_size(D, S)`` columns of ``a [S, D]``
    (the last block shifted back to end at ``D``, its repeated columns zeroed)."""
    s, d = a.shape
    cols = block_size(d, s)
    if cols >= d:
        return fn(a)

    def body(b: jax.Array, acc: jax.Array) -> jax.Array:
        start = b * cols
        lo = jnp.minimum(start, d - cols)
        part = jax.lax.dynamic_slice_in_dim(a, lo, cols, axis=1)
        fresh = (lo + jnp.arange(cols)) >= start
        return acc + fn(jnp.where(fresh[None, :], part, 0.0))  # a zero column adds 0

    return jax.lax.fori_loop(0, -(-d // cols), body, jnp.zeros((s,), jnp.float32))


def consensus_distance(params: Any, labels: Any = None) -> jax.Array:
    """``[]`` float32 mean over the slots of ``consensus_deviation(params, labels)``."""
    return consensus_deviation(params, labels).mean()


def mixing_matrix(neighbors: Any, weights: Any, num_slots: int | None = None) -> jax.Array:
    """The dense ``[S, S]`` matrix of a round's weights ``[S, K]`` along ``neighbors``:
    ``W[s, neighbors[s, k]] += weights[s, k]`` (padding carries weight 0). For small S."""
    nbr = jnp.asarray(neighbors, jnp.int32)
    s = nbr.shape[0] if num_slots is None else check_int("num_slots", num_slots, 1)
    rows = jnp.broadcast_to(jnp.arange(nbr.shape[0])[:, None], nbr.shape)
    return jnp.zeros((nbr.shape[0], s), jnp.float32).at[rows, nbr].add(weights)


def consensus_contraction(
    neighbors: Any, weights: Any, *, dense_limit: int | None = None, active: Any = None
) -> jax.Array:
    """``[]`` float32 ``||(I - J) W (I - J)||_2`` of the round's ``W`` (``mixing_matrix``).

    For a row-stochastic ``W`` the largest factor by which one round can shrink the
    deviation from the average (``(I - J) W = (I - J) W (I - J)``); for a symmetric doubly
    stochastic ``W`` it is ``|lambda_2|``, the second-largest eigenvalue modulus; the same
    for ``W^T`` (push-sum's column-stochastic matrix). Up to ``dense_limit`` slots (default
    ``DENSE_LIMIT``) from the dense matrix's singular values; above, ``POWER_ITERATIONS``
    steps of power iteration on ``A^T A`` with the sparse operator (O(S K) each, from a
    fixed start): a lower bound that converges slowly when the top singular values are close.
    ``active [S]`` bool (default all): the slots the norm is over (``J`` their average, the
    others zeroed): a sweep's padded slots, linked to no one, are left out.
    """
    nbr = jnp.asarray(neighbors, jnp.int32)
    w = jnp.asarray(weights, jnp.float32)
    s = nbr.shape[0]
    on = jnp.ones((s,), jnp.float32) if active is None else jnp.asarray(active, jnp.float32)
    centre = lambda x: on * (x - (on * x).sum() / on.sum())  # (I - J) on the active slots
    limit = DENSE_LIMIT if dense_limit is None else dense_limit
    if s <= limit:
        proj = jax.vmap(centre)(jnp.eye(s, dtype=jnp.float32))  # symmetric
        m = proj @ mixing_matrix(nbr, w) @ proj
        return jnp.linalg.svd(m, compute_uv=False)[0]
    return _power_norm(nbr, w, centre)


def _power_norm(nbr: jax.Array, w: jax.Array, centre: Any) -> jax.Array:
    s = nbr.shape[0]
    apply = lambda x: centre((w * centre(x)[nbr]).sum(axis=1))  # (I-J) W (I-J) x
    apply_t = lambda y: centre(jnp.zeros((s,), jnp.float32).at[nbr].add(w * centre(y)[:, None]))

    def step(_: int, x: jax.Array) -> jax.Array:
        x = apply_t(apply(x))
        return x / jnp.maximum(jnp.linalg.norm(x), 1e-30)

    x0 = centre(jax.random.normal(jax.random.key(0), (s,), jnp.float32))
    x = jax.lax.fori_loop(0, POWER_ITERATIONS, step, x0 / jnp.linalg.norm(x0))
    return jnp.linalg.norm(apply(x))


def spectral_gap(
    neighbors: Any, weights: Any, *, dense_limit: int | None = None, active: Any = None
) -> jax.Array:
    """``[]`` float32 ``1 - consensus_contraction(neighbors, weights, active=active)``: 0 when
    the round cannot bring the nodes together (a disconnected graph), 1 for exact averaging."""
    return 1.0 - consensus_contraction(neighbors, weights, dense_limit=dense_limit, active=active)
