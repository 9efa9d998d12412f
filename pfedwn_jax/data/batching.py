"""Per-client epoch batching that runs under `jit`/`vmap`.

Every client draws its own permutation of its real samples; clients with fewer samples get
trailing *masked* steps so all clients run the same static number of steps. The last partial
batch of a client is **kept** (its missing slots are masked): every real sample is visited
exactly once per epoch, which matters for the small clients of unbalanced partitions, where
dropping a partial batch would discard a large share of their data.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

log = logging.getLogger("pfedwn_jax")
#: The batch sizes already noted as clamped in this job (None outside `clamp_notes_once`).
_noted: contextvars.ContextVar[set[int] | None] = contextvars.ContextVar("noted", default=None)


@contextlib.contextmanager
def clamp_notes_once() -> Iterator[None]:
    """Inside, a clamped `batch_size` is noted once, not once per run (a sweep of hundreds
    of capped runs would otherwise repeat the same line hundreds of times)."""
    token = _noted.set(set())
    try:
        yield
    finally:
        _noted.reset(token)


def steps_per_epoch(max_count: int, batch_size: int) -> int:
    """Static number of steps that covers the largest client once: ceil(max_count / batch)."""
    return max(1, math.ceil(int(max_count) / int(batch_size)))


def fit_batch_size(batch_size: int, counts: Any) -> int:
    """`batch_size`, or the largest of `counts` (samples per client) where it exceeds that.

    A batch larger than every client only adds masked slots: one step already sees all of a
    client's samples, so the clamped batch gives the same numbers while the padded one costs
    memory and time in proportion to `batch_size` (a typo such as 1,000,000 can exhaust the
    machine). A clamp is noted as one warning line on the "pfedwn_jax" logger (once per
    `batch_size` inside `clamp_notes_once`).
    """
    largest = int(np.max(np.asarray(counts), initial=0))
    if largest < 1 or batch_size <= largest:
        return int(batch_size)
    noted = _noted.get()
    if noted is None or batch_size not in noted:
        again = "" if noted is None else "; the same for every run whose clients are smaller"
        log.warning(
            "batch_size=%d is larger than every client (largest: %d samples); using %d "
            "(the same numbers, without the padding)%s",
            batch_size,
            largest,
            largest,
            again,
        )
    if noted is not None:
        noted.add(int(batch_size))
    return largest


def client_permutation(key: jax.Array, count: jax.Array, max_samples: int) -> jax.Array:
    """A random order of one client's slots with its `count` real samples first.

    Returns `[max_samples]` int32: positions `0..count-1` hold a uniform permutation of the
    real sample indices, the rest hold the padded slots (in order).
    """
    pos = jnp.arange(max_samples)
    u = jax.random.uniform(key, (max_samples,))
    sort_key = jnp.where(pos < count, u, 2.0 + pos / max_samples)
    return jnp.argsort(sort_key).astype(jnp.int32)


def epoch_indices(
    key: jax.Array,
    count: jax.Array,
    max_samples: int,
    batch_size: int,
    num_steps: int,
    ids: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Batch indices for one epoch of every client.

    Args:
      key: PRNG key; client n uses `fold_in(key, n)`, so a client's order does not depend on
        how many other clients are stacked with it.
      count: `[clients]` real samples per client.
      max_samples: static padded length of the client axis of the data.
      batch_size: static batch size.
      num_steps: static steps per epoch (usually `steps_per_epoch(max(count), batch_size)`).
      ids: `[clients]` int, the number each client's order is keyed with (default `n`, its
        row: `fold_in(key, ids[n])`).

    Returns:
      idx: `[clients, num_steps, batch_size]` int32 sample indices into each client's arrays.
      valid: `[clients, num_steps, batch_size]` bool, False for padded slots and masked steps.
    """
    clients = count.shape[0]
    total = num_steps * batch_size
    ids = jnp.arange(clients, dtype=jnp.int32) if ids is None else ids
    keys = jax.vmap(lambda n: jax.random.fold_in(key, n))(ids)
    perm = jax.vmap(client_permutation, in_axes=(0, 0, None))(keys, count, max_samples)
    if total > max_samples:
        perm = jnp.pad(perm, ((0, 0), (0, total - max_samples)))
    perm = perm[:, :total]
    valid = jnp.arange(total)[None, :] < count[:, None]
    return (
        perm.reshape(clients, num_steps, batch_size),
        valid.reshape(clients, num_steps, batch_size),
    )
