"""Per-sample and minibatch objectives shared by training and evaluation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def per_sample_ce(logits: jax.Array, y: jax.Array) -> jax.Array:
    """Cross-entropy of each sample: `logits [B, K]`, `y [B]` int -> `[B]` float32."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y)


def weighted_ce(
    logits: jax.Array, y: jax.Array, w: jax.Array, num_valid: jax.Array | None = None
) -> jax.Array:
    """Minibatch objective `sum(w * ce) / max(num_valid, 1)`.

    `w [B]` is the per-sample weight (0 on padded samples). `num_valid` is the number of real
    samples of the batch; when omitted it is `sum(w > 0)` (samples of weight 0 count as absent).
    """
    if num_valid is None:
        num_valid = jnp.sum(w > 0)
    ce = per_sample_ce(logits, y)
    return jnp.sum(w * ce) / jnp.maximum(num_valid, 1).astype(ce.dtype)


def default_loss(model):
    """A contract-style `loss_fn(params, x, y, w, aux_s) -> scalar`: masked mean cross-entropy.

    Building block for custom objectives (e.g. FedProx: `default_loss(model)(...) + prox`).
    It normalises by `sum(w > 0)`; the engine's built-in default (`loss_fn=None`) normalises by
    the number of real samples, which differs only when a real sample has weight exactly 0.
    """

    def loss_fn(params, x, y, w, aux_s):
        del aux_s
        return weighted_ce(model.apply(params, x), y, w)

    return loss_fn
