"""Stacking per-client samples into padded `ClientData`, its memory cost, and bucketing.

A stacked split costs `clients * max_samples` slots although only `sum(count)` are real;
for very unbalanced partitions (one client with thousands of samples, others with tens) the
padding dominates. `padding_ratio` reports it and `bucketize` regroups clients of similar
size so each group pads only to its own largest client.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from pfedwn_jax._checks import check_int
from pfedwn_jax.data.client_data import ClientData
from pfedwn_jax.io import format_bytes


def stack_clients(
    x: np.ndarray, y: np.ndarray, parts: list[np.ndarray], max_samples: int | None = None
) -> ClientData:
    """Gather `parts` of a pool into a padded `ClientData` (host NumPy arrays).

    Args:
      x: `[n, ...]` pool inputs (uint8 images or float32 features).
      y: `[n]` int labels.
      parts: one index array per client; client n's samples fill slots `0..len-1` in order.
      max_samples: padded length (default: the largest part, at least 1).

    Returns:
      `ClientData` with `x [clients, max_samples, ...]` of `x`'s dtype (padding 0),
      `y [clients, max_samples]` int32 (padding 0), `mask` bool, `count [clients]` int32.
    """
    counts = np.array([len(p) for p in parts], dtype=np.int32)
    longest = int(counts.max(initial=0))
    max_samples = max(longest, 1) if max_samples is None else int(max_samples)
    if max_samples < longest:
        raise ValueError(f"max_samples={max_samples} is below the largest client ({longest})")
    num = len(parts)
    xs = np.zeros((num, max_samples, *x.shape[1:]), dtype=x.dtype)
    ys = np.zeros((num, max_samples), dtype=np.int32)
    for n, p in enumerate(parts):
        xs[n, : len(p)] = x[p]
        ys[n, : len(p)] = y[p]
    mask = np.arange(max_samples)[None, :] < counts[:, None]
    return ClientData(xs, ys, mask, counts)


def to_device(data: ClientData) -> ClientData:
    """Move every leaf to the default JAX device (keeps dtypes: uint8 images stay uint8)."""
    return ClientData(*(jnp.asarray(a) for a in data))


def memory_bytes(data: ClientData) -> int:
    """Bytes the arrays of a `ClientData` occupy (on host or device), padding included."""
    return int(sum(np.dtype(a.dtype).itemsize * int(np.prod(a.shape)) for a in data))


def padding_ratio(data: ClientData) -> float:
    """Padded slots per real sample: `(clients * max_samples - sum(count)) / sum(count)`."""
    count = np.asarray(data.count)
    real = int(count.sum())
    total = int(np.prod(np.shape(data.y)))
    return (total - real) / max(real, 1)


def memory_report(data: ClientData, label: str = "") -> str:
    """One line: memory, shape and padding waste of a stacked split."""
    count = np.asarray(data.count)
    prefix = f"{label}: " if label else ""
    return (
        f"{prefix}{format_bytes(memory_bytes(data))} for {data.num_clients} clients x "
        f"{data.max_samples} slots ({int(count.sum())} real samples, padding "
        f"{padding_ratio(data):.2f} padded per real)"
    )


def bucket_groups(count: np.ndarray, num_buckets: int) -> list[np.ndarray]:
    """Group clients into at most `num_buckets` buckets minimising the total padded slots.

    Clients are sorted by size and cut into contiguous groups by dynamic programming
    (exact for this cost: `sum over buckets of |bucket| * max count in bucket`). Clients of
    equal size never need to be split (moving them into the lower bucket costs nothing more),
    so the cuts fall between distinct sizes: O(B D^2) for D distinct sizes, whatever the
    number of clients. Returns client-id arrays, smallest clients first; empty buckets dropped.
    """
    count = np.asarray(count, dtype=np.int64)
    num_buckets = check_int("num_buckets", num_buckets, low=1)
    values, inverse, mult = np.unique(count, return_inverse=True, return_counts=True)
    num = values.shape[0]
    if num == 0:
        return []
    below = np.concatenate([[0], np.cumsum(mult)])  # clients with a size below values[j]
    b_max = min(num_buckets, num)
    inf = np.iinfo(np.int64).max // 4
    # best[b, j]: min cost covering the j smallest distinct sizes with b buckets.
    best = np.full((b_max + 1, num + 1), inf, dtype=np.int64)
    cut = np.zeros((b_max + 1, num + 1), dtype=np.int64)
    best[0, 0] = 0
    for b in range(1, b_max + 1):
        for j in range(1, num + 1):
            i = np.arange(j)  # the bucket holds sizes values[i..j-1]; its max is values[j-1]
            cost = best[b - 1, i] + (below[j] - below[i]) * values[j - 1]
            k = int(np.argmin(cost))
            best[b, j], cut[b, j] = cost[k], k
    b = int(np.argmin(best[1:, num])) + 1
    groups, j = [], num
    while b > 0:
        start = int(cut[b, j])
        groups.append(np.flatnonzero((inverse >= start) & (inverse < j)))
        j, b = start, b - 1
    return [g for g in reversed(groups) if g.size]


def bucketize(data: ClientData, num_buckets: int) -> list[tuple[np.ndarray, ClientData]]:
    """Split a `ClientData` into buckets of similar-size clients, each padded to its own max.

    Returns `[(client_ids [m], ClientData over those m clients)]`; `client_ids` index the
    original client axis. With `num_buckets=1` it is one bucket holding all clients.
    """
    groups = bucket_groups(np.asarray(data.count), num_buckets)
    out = []
    for ids in groups:
        width = max(int(np.asarray(data.count)[ids].max(initial=0)), 1)
        out.append((ids, ClientData(*(a[ids, :width] if a.ndim > 1 else a[ids] for a in data))))
    return out
