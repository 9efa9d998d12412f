"""Divergence: a slot whose model or loss blew up, detected inside the compiled round.

A slot has diverged after a round when any parameter of its evaluated model is not finite, or
its test loss or training loss (the algorithm's `train_loss` record, where it has one) is not
finite or exceeds `LOSS_BOUND` in absolute value (a finite loss of 1e15 is as diverged as a
NaN, and the NaN follows a round or two later). The flag is computed on the device in the
round's program (`slot_finite`) and travels with the round's metrics, so it costs no extra
transfer or synchronisation.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pfedwn_jax.engine.tree import block_size

# |loss| above this is divergence (cross-entropy of a sane model is below ~50)
LOSS_BOUND = 1e6
# the record holding each slot's training loss `[S]` (every built-in algorithm has it)
TRAIN_LOSS = "train_loss"
POLICIES = ("stop", "continue")


def slot_finite(params: Any, losses: list[jax.Array]) -> jax.Array:
    """`[S]` bool: every leaf of slot `s`'s `params [S, ...]` finite and every `loss [S]` finite
    and within `LOSS_BOUND`. Jittable."""
    ok = None
    for leaf in jax.tree.leaves(params):
        leaf_ok = _rows_finite(leaf.reshape(leaf.shape[0], -1))
        ok = leaf_ok if ok is None else ok & leaf_ok
    for loss in losses:
        loss_ok = jnp.isfinite(loss) & (jnp.abs(loss) <= LOSS_BOUND)
        ok = loss_ok if ok is None else ok & loss_ok
    assert ok is not None, "slot_finite needs a parameter leaf or a loss"
    return ok


def _rows_finite(a: jax.Array) -> jax.Array:
    """`[S]` bool: every entry of row `s` of `a [S, D]` finite, a block of columns at a time
    (`engine.tree.block_size`): a reduction over all of `a` at once makes XLA:CPU hold a
    scratch copy of a sizeable share of it (measured: 1/6 of the models); the last block
    overlaps its predecessor, which changes nothing here."""
    s, d = a.shape
    cols = block_size(d, s)

    def block(b: jax.Array, ok: jax.Array) -> jax.Array:
        lo = jnp.minimum(b * cols, d - cols)
        part = jax.lax.dynamic_slice_in_dim(a, lo, cols, axis=1)
        # 0 * x is 0 for a finite x and NaN otherwise
        return ok & jnp.isfinite(jnp.sum((part * 0).astype(jnp.float32), axis=1))

    return jax.lax.fori_loop(0, -(-d // cols), block, jnp.ones((s,), bool))


def check_policy(on_divergence: str) -> str:
    """`on_divergence` if it is one of `POLICIES`; a `ValueError` otherwise."""
    if on_divergence not in POLICIES:
        raise ValueError(f"on_divergence must be one of {list(POLICIES)}; got {on_divergence!r}")
    return on_divergence
