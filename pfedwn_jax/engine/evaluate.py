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
from pfedwn_jax.engine.tree import chunked_rows, num_slots_of
from pfedwn_jax.models import Model, check_model_fits

# Samples evaluated at once (pairs x samples per pair) when no chunk_size is given.
_EVAL_SAMPLES_PER_CHUNK = 8192
# Bytes of the models one chunk gathers (pairs x one model's parameters), likewise.
_EVAL_MODEL_BYTES = 64 * 2**20
# Samples of one pair evaluated at once: a pair steps through its client's real samples in
# blocks of this many, so the padding of a small client is not evaluated (the sample axis is
# padded to the largest client, bucketed: 4x the real samples in the mnist-full cases).
EVAL_BLOCK = 512


def eval_chunk(max_samples: int, model_bytes: int) -> int:
    """Pairs `cross_evaluate` evaluates at once by default: about `_EVAL_SAMPLES_PER_CHUNK`
    samples (`max_samples` padded samples per pair) and at most `_EVAL_MODEL_BYTES` of
    gathered models (`model_bytes` per pair's model), at least one pair."""
    by_samples = _EVAL_SAMPLES_PER_CHUNK // max(max_samples, 1)
    return max(1, min(by_samples, _EVAL_MODEL_BYTES // max(model_bytes, 1)))


def slot_bytes(params: Any) -> int:
    """Bytes of one slot's model in stacked `params` (leaves `[S, ...]`)."""
    leaves = jax.tree.leaves(params)
    return sum(int(np.prod(np.shape(a)[1:])) * np.dtype(a.dtype).itemsize for a in leaves)


def cross_evaluate(
    model: Model,
    params: Any,
    data: ClientData,
    model_slot: Any,
    data_client: Any,
    *,
    chunk_size: int | None = None,
    block_size: int = EVAL_BLOCK,
) -> dict[str, jax.Array]:
    """Per-sample loss and correctness of model `model_slot[p]` on client `data_client[p]`.

    Args:
      params: stacked parameters, leaves `[S, ...]`.
      data: a `ClientData` split (usually train for EM responsibilities, test for metrics).
      model_slot: `[P]` int in [0, S).
      data_client: `[P]` int in [0, clients).
      chunk_size: pairs evaluated at once (default `eval_chunk`: about 8192 samples and at
        most 64 MiB of models per chunk).
      block_size: samples of one pair evaluated at once; a pair runs only the blocks that
        hold its client's real samples.

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
        chunk_size = eval_chunk(data.max_samples, slot_bytes(params))
    chunk_size = min(check_int("chunk_size", chunk_size, 1), max(num_pairs, 1))
    block = min(check_int("block_size", block_size, 1), max(data.max_samples, 1))
    return _cross_evaluate(
        model,
        params,
        data.x,
        data.y,
        data.mask,
        jnp.asarray(model_slot, jnp.int32),
        jnp.asarray(data_client, jnp.int32),
        chunk=chunk_size,
        block=block,
    )


@functools.partial(jax.jit, static_argnames=("model", "chunk", "block"))
def _cross_evaluate(
    model, params, x_all, y_all, mask_all, model_slot, data_client, *, chunk, block
):
    """`chunk` pairs at a time (`chunked_rows`), each chunk looping over sample blocks as
    long as its longest pair needs (one scalar bound: with the pairs split over devices,
    every device runs the same number of iterations, so their collectives stay in step; a
    loop per pair under `vmap` let the devices' loops end apart and XLA:CPU abort)."""
    size = y_all.shape[1]
    counts = jnp.sum(mask_all, axis=1, dtype=jnp.int32)  # [clients] real samples

    def pairs(rows: jax.Array, real: jax.Array) -> tuple[jax.Array, jax.Array]:
        m, n = model_slot[rows], data_client[rows]  # [C]
        p = jax.tree.map(lambda a: a[m], params)
        trips = -(-counts[n] // block)  # [C] blocks holding each pair's samples

        def one(p_c, n_c, start):
            take = lambda a: jax.lax.dynamic_slice(
                a, (n_c, start) + (0,) * (a.ndim - 2), (1, block, *a.shape[2:])
            )[0]
            x, y, mask = take(x_all), take(y_all), take(mask_all)
            logits = model.apply(p_c, x)
            loss = jnp.where(mask, per_sample_ce(logits, y), 0.0)
            hit = (jnp.argmax(logits, axis=-1) == y).astype(jnp.float32)
            return loss, jnp.where(mask, hit, 0.0)

        def body(k, acc):
            start = jnp.minimum(k * block, size - block)  # the last block may overlap
            new = jax.vmap(one, (0, 0, None))(p, n, start)
            old = jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, start, block, 1), acc)
            keep = (k < trips)[:, None]  # a pair past its own blocks keeps what it has
            part = jax.tree.map(lambda a, b: jnp.where(keep, a, b), new, old)
            return jax.tree.map(
                lambda full, b: jax.lax.dynamic_update_slice_in_dim(full, b, start, 1), acc, part
            )

        zeros = jnp.zeros((rows.shape[0], size), jnp.float32)
        return jax.lax.fori_loop(0, jnp.max(trips), body, (zeros, zeros))

    if model_slot.shape[0] == 0:
        return {"loss": jnp.zeros((0, size)), "correct": jnp.zeros((0, size))}
    loss, correct = chunked_rows(pairs, model_slot.shape[0], chunk)
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
