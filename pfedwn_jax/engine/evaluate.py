"""Evaluation: per-slot test metrics and per-sample losses of arbitrary (model, client) pairs."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax._checks import check_int, check_range, check_shape, check_tree_leading
from pfedwn_jax.data.client_data import ClientData
from pfedwn_jax.engine.losses import per_sample_ce
from pfedwn_jax.engine.train import check_slots
from pfedwn_jax.engine.tree import num_slots_of
from pfedwn_jax.models import Model, check_model_fits

# Samples evaluated at once (pairs x samples per pair) when no chunk_size is given.
_EVAL_SAMPLES_PER_CHUNK = 8192


def cross_evaluate(
    model: Model,
    params: Any,
    data: ClientData,
    model_slot: Any,
    data_client: Any,
    *,
    chunk_size: int | None = None,
) -> dict[str, jax.Array]:
    """Per-sample loss and correctness of model `model_slot[p]` on client `data_client[p]`.

    Args:
      params: stacked parameters, leaves `[S, ...]`.
      data: a `ClientData` split (usually train for EM responsibilities, test for metrics).
      model_slot: `[P]` int in [0, S).
      data_client: `[P]` int in [0, clients).
      chunk_size: pairs evaluated at once (default: about 8192 samples per chunk).

    Returns:
      `{"loss": [P, M] float32 cross-entropy, "correct": [P, M] float32 (1.0 if the arg-max is
      the label)}`, both 0 on padded samples.
    """
    num_slots = num_slots_of(params)
    check_tree_leading("params", params, num_slots)
    check_model_fits(model, data.x.shape[2:], input_dtype=data.x.dtype)
    check_slots(data, data_client)
    check_shape("model_slot", model_slot, np.shape(data_client), "[P] (as data_client)")
    check_range("model_slot", model_slot, 0, num_slots - 1)
    num_pairs = int(np.shape(data_client)[0])
    if chunk_size is None:
        chunk_size = max(1, _EVAL_SAMPLES_PER_CHUNK // max(data.max_samples, 1))
    chunk_size = min(check_int("chunk_size", chunk_size, 1), max(num_pairs, 1))
    return _cross_evaluate(
        model,
        params,
        data.x,
        data.y,
        data.mask,
        jnp.asarray(model_slot, jnp.int32),
        jnp.asarray(data_client, jnp.int32),
        chunk=chunk_size,
    )


@functools.partial(jax.jit, static_argnames=("model", "chunk"))
def _cross_evaluate(model, params, x_all, y_all, mask_all, model_slot, data_client, *, chunk):
    def one_pair(pair):
        m, n = pair
        p = jax.tree.map(lambda a: a[m], params)
        logits = model.apply(p, x_all[n])
        y, mask = y_all[n], mask_all[n]
        loss = per_sample_ce(logits, y)
        correct = (jnp.argmax(logits, axis=-1) == y).astype(jnp.float32)
        return jnp.where(mask, loss, 0.0), jnp.where(mask, correct, 0.0)

    loss, correct = jax.lax.map(one_pair, (model_slot, data_client), batch_size=chunk)
    return {"loss": loss, "correct": correct}


def evaluate(
    model: Model,
    params: Any,
    data: ClientData,
    data_client: Any,
    *,
    chunk_size: int | None = None,
) -> dict[str, jax.Array]:
    """Each slot's model on its data client's samples: `{"loss": [S], "accuracy": [S]}`.

    Means over the client's real samples (0 for a client without samples).
    """
    num_slots = num_slots_of(params)
    check_slots(data, data_client, num_slots)
    out = cross_evaluate(
        model, params, data, np.arange(num_slots), data_client, chunk_size=chunk_size
    )
    count = jnp.maximum(jnp.asarray(data.count)[jnp.asarray(data_client)], 1)
    return {
        "loss": out["loss"].sum(axis=1) / count,
        "accuracy": out["correct"].sum(axis=1) / count,
    }
