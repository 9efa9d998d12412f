"""The minibatch schedule of every slot for one `local_train` call.

Kept separate so that references (tests, the Python-loop benchmark) replay exactly the batches
the engine uses.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_rank
from pfedwn_jax.data.batching import client_permutation, epoch_indices


def slot_batches(
    key: jax.Array,
    count: jax.Array,
    max_samples: int,
    batch_size: int,
    *,
    epochs: int = 1,
    steps_per_epoch: int = 1,
    num_steps: int | None = None,
    ids: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Sample indices of every slot's minibatches.

    Args:
      key: PRNG key of this call.
      count: `[S]` real samples of each slot's data client (0 for a slot that must not train).
      max_samples: static padded sample axis of the data.
      batch_size: static batch size B.
      epochs: epochs mode: E passes over each slot's data, epoch e shuffled with
        `fold_in(key, e)` (see `data.batching.epoch_indices`), `steps_per_epoch` steps each
        (clients with fewer samples get masked trailing steps).
      steps_per_epoch: static steps of one epoch (>= ceil(max(count) / B)).
      num_steps: steps mode (overrides epochs): every slot takes `num_steps` steps, step k on
        B samples drawn without replacement from its real samples by `fold_in(key_s, k)`
        (all of them, masked to B, when it has fewer than B).
      ids: `[S]` int, the number each slot's draws are keyed with (default `0 .. S - 1`): a
        slot's schedule depends on `key`, its id and its count only, so a subset of slots
        given their ids draws what they draw among all.

    Returns:
      idx: `[S, T, B]` int32 indices into the slot's data client's samples.
      valid: `[S, T, B]` bool, False on padded slots and masked steps.
    """
    check_rank("count", count, 1, "[S]")
    if ids is None:
        ids = jnp.arange(count.shape[0], dtype=jnp.int32)
    if num_steps is None:
        parts = [
            epoch_indices(
                jax.random.fold_in(key, e), count, max_samples, batch_size, steps_per_epoch, ids
            )
            for e in range(epochs)
        ]
        return (
            jnp.concatenate([p[0] for p in parts], axis=1),
            jnp.concatenate([p[1] for p in parts], axis=1),
        )

    take = min(batch_size, max_samples)

    def one_slot(s: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array]:
        key_s = jax.random.fold_in(key, s)

        def one_step(k: jax.Array) -> jax.Array:
            return client_permutation(jax.random.fold_in(key_s, k), n, max_samples)[:take]

        idx = jax.vmap(one_step)(jnp.arange(num_steps))
        valid = jnp.broadcast_to(jnp.arange(take) < n, idx.shape)
        if take < batch_size:
            pad = ((0, 0), (0, batch_size - take))
            idx, valid = jnp.pad(idx, pad), jnp.pad(valid, pad)
        return idx, valid

    return jax.vmap(one_slot)(ids, count)
