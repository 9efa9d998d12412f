"""`local_train`: local minibatch training of every model slot at once, as one compiled program.

Layout: slot s trains the model `state.params[s]` on the samples of data client
`data_client[s]`. The minibatch schedule comes from `engine.batches.slot_batches`; one step of
one slot is `grad -> optimizer.update -> apply_updates`, skipped (state kept bit for bit) when
the slot's batch is empty. Slots are executed by the strategy of `engine.strategy`; a group of
slots loops over steps after each slot's non-empty steps are compacted to the front, only as
long as its busiest slot, so clients with little data do not pay for the largest client's
step count.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pfedwn_jax._checks import check_finite, check_int, check_range, is_concrete
from pfedwn_jax.data.batching import steps_per_epoch
from pfedwn_jax.data.client_data import ClientData
from pfedwn_jax.engine.batches import slot_batches
from pfedwn_jax.engine.losses import weighted_ce
from pfedwn_jax.engine.sharding import (
    check_placement,
    constrain_slots,
    resolve_shards,
    shard_slots,
)
from pfedwn_jax.engine.state import ClientState
from pfedwn_jax.engine.strategy import resolve_strategy
from pfedwn_jax.models import Model, check_model_fits

LossFn = Callable[..., jax.Array]
GradFn = Callable[..., tuple[jax.Array, Any]]


def check_slots(data: ClientData, data_client: Any, num_slots: int | None = None) -> None:
    """Validate `data_client [S]` against the data (host-side; a no-op on tracers)."""
    shape = np.shape(data_client)
    if len(shape) != 1:
        raise ValueError(f"data_client must be a 1-D [S] array; got shape {shape}")
    if num_slots is not None and shape[0] != num_slots:
        raise ValueError(f"data_client has {shape[0]} entries; the state has {num_slots} slots")
    check_range("data_client", data_client, 0, data.num_clients - 1)
    if is_concrete(data_client):
        arr = np.asarray(data_client)
        if arr.dtype.kind not in "iu":
            raise ValueError(f"data_client must be integers; got dtype {arr.dtype}")


def _check_leading(name: str, tree: Any, num_slots: int) -> None:
    for leaf in jax.tree.leaves(tree):
        if np.ndim(leaf) < 1 or np.shape(leaf)[0] != num_slots:
            raise ValueError(
                f"{name} must have leading axis S={num_slots} on every leaf; got shape "
                f"{np.shape(leaf)}"
            )


def local_train(
    model: Model,
    optimizer: optax.GradientTransformation,
    state: ClientState,
    data: ClientData,
    data_client: Any,
    key: jax.Array,
    *,
    batch_size: int,
    epochs: int = 1,
    num_steps: int | None = None,
    loss_fn: LossFn | None = None,
    grad_fn: GradFn | None = None,
    aux: Any = None,
    sample_weight: Any = None,
    active: Any = None,
    strategy: str = "auto",
    chunk_size: int | None = None,
    shards: int | None = None,
    donate: bool = False,
) -> tuple[ClientState, dict[str, jax.Array]]:
    """Local minibatch training of all S slots.

    Args:
      model, optimizer: the network and the optax transformation (state stacked along S).
      state: `ClientState` with leaves `[S, ...]`.
      data: the train `ClientData` (`x [clients, M, H, W, C]` uint8).
      data_client: `[S]` int, the data client of each slot.
      key: PRNG key; `(batch_key, grad_key) = random.split(key)`: batch_key drives
        `slot_batches`, `fold_in(fold_in(grad_key, s), t)` is slot s's key at step t (grad_fn).
      batch_size: minibatch size B.
      epochs: local epochs E (each client's own data, last partial batch kept).
      num_steps: if given, every slot takes exactly this many steps instead of E epochs.
      loss_fn: `loss_fn(params, x, y, w, aux_s) -> scalar` one slot's minibatch objective
        (default: `sum(w * ce) / max(real samples in batch, 1)`).
      grad_fn: `grad_fn(params, x, y, w, aux_s, key) -> (loss, grads)` replaces the gradient.
      aux: pytree with leading axis S, slot s's `aux_s` (e.g. FedProx anchors).
      sample_weight: `[S, M]` per-sample weights of each slot's data (default 1).
      active: `[S]` bool; inactive slots are returned unchanged (bit for bit).
      strategy, chunk_size: slot execution strategy (see `engine.strategy`).
      shards: split the slots into this many contiguous blocks, one per device, trained in
        parallel (see `engine.sharding`); None: every device of the default backend.
      donate: donate `state`'s buffers to the output (the caller must not reuse `state`).

    Returns:
      `(new_state, {"loss": [S] mean objective over the slot's non-empty steps (0 if none),
      "steps": [S] int32 number of optimizer steps taken})`.
    """
    num_slots = state.num_slots
    check_model_fits(model, data.x.shape[2:])
    check_slots(data, data_client, num_slots)
    batch_size = check_int("batch_size", batch_size, 1)
    epochs = check_int("epochs", epochs, 1)
    if num_steps is not None:
        num_steps = check_int("num_steps", num_steps, 1)
    if aux is not None:
        _check_leading("aux", aux, num_slots)
    if sample_weight is not None:
        if np.shape(sample_weight) != (num_slots, data.max_samples):
            raise ValueError(
                f"sample_weight must have shape [S, max_samples] = "
                f"{(num_slots, data.max_samples)}; got {np.shape(sample_weight)}"
            )
        check_finite("sample_weight", sample_weight)
        check_range("sample_weight", sample_weight, 0.0)
    if active is not None and np.shape(active) != (num_slots,):
        raise ValueError(f"active must have shape [S] = ({num_slots},); got {np.shape(active)}")
    strategy, chunk = resolve_strategy(strategy, chunk_size, num_slots)
    shards = resolve_shards(shards, num_slots)
    check_placement("state", state, shards)
    check_placement("data", data, shards)

    # Static steps per epoch: the largest slot's need when the counts are known on the host.
    if is_concrete(data.count) and is_concrete(data_client):
        counts = np.asarray(data.count)[np.asarray(data_client)]
        if active is not None and is_concrete(active):
            counts = counts * np.asarray(active, dtype=bool)
        spe = steps_per_epoch(int(counts.max(initial=0)), batch_size)
    else:
        spe = steps_per_epoch(data.max_samples, batch_size)

    fn = _train_donated if donate else _train
    return fn(
        model,
        optimizer,
        state,
        data.x,
        data.y,
        data.count,
        jnp.asarray(data_client, dtype=jnp.int32),
        key,
        aux,
        sample_weight,
        active,
        batch_size=batch_size,
        epochs=epochs,
        steps_per_epoch=spe,
        num_steps=num_steps,
        loss_fn=loss_fn,
        grad_fn=grad_fn,
        strategy=strategy,
        chunk=chunk,
        shards=shards,
    )


def _train_impl(
    model,
    optimizer,
    state,
    x_all,
    y_all,
    count_all,
    data_client,
    key,
    aux,
    sample_weight,
    active,
    *,
    batch_size,
    epochs,
    steps_per_epoch,
    num_steps,
    loss_fn,
    grad_fn,
    strategy,
    chunk,
    shards,
):
    num_slots = data_client.shape[0]
    max_samples = y_all.shape[1]
    count = count_all[data_client]
    if active is not None:
        count = jnp.where(jnp.asarray(active, bool), count, 0)
    batch_key, grad_key = jax.random.split(key)
    idx, valid = slot_batches(
        batch_key,
        count,
        max_samples,
        batch_size,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        num_steps=num_steps,
    )
    slot_ids = jnp.arange(num_slots, dtype=jnp.int32)
    run = functools.partial(_run_slots, model, optimizer, loss_fn, grad_fn, strategy, chunk)
    replicated = (x_all, y_all, grad_key)
    per_slot = (
        state.params,
        state.opt_state,
        data_client,
        idx,
        valid,
        sample_weight,
        aux,
        slot_ids,
        count,
    )
    if shards == 1:
        params, opt_state, loss_sum, n = run(*replicated, *per_slot)
    else:
        params, opt_state, loss_sum, n = shard_slots(
            run, replicated, per_slot, num_slots, shards, work=count
        )

    # Inactive slots had count 0, hence no valid step: their state is returned unchanged.
    new_state = ClientState(params, opt_state)
    if shards > 1:
        new_state = constrain_slots(new_state, num_slots, shards)
    metrics = {"loss": loss_sum / jnp.maximum(n, 1).astype(jnp.float32), "steps": n}
    return new_state, metrics


def _run_slots(
    model,
    optimizer,
    loss_fn,
    grad_fn,
    strategy,
    chunk,
    x_all,
    y_all,
    grad_key,
    params_all,
    opt_all,
    data_client,
    idx,
    valid,
    sample_weight,
    aux,
    slot_ids,
    count,
):
    """Train the given slots (leading axis S_local) with `strategy`; the body of one shard.

    Returns `(params, opt_state, loss_sum [S_local], steps [S_local])`.
    """
    num_slots = data_client.shape[0]

    def objective(params, x, y, w, valid_t, aux_s):
        if loss_fn is not None:
            return loss_fn(params, x, y, w, aux_s)
        return weighted_ce(model.apply(params, x), y, w, jnp.sum(valid_t))

    def slot_step(params, opt_state, dc, idx_t, valid_t, sw, aux_s, slot_id, t, masked=True):
        """One optimizer step of one slot; with `masked`, an empty batch leaves it unchanged."""
        x = x_all[dc, idx_t]
        y = y_all[dc, idx_t]
        w = valid_t.astype(jnp.float32)
        if sw is not None:
            w = w * sw[idx_t].astype(jnp.float32)
        if grad_fn is not None:
            step_key = jax.random.fold_in(jax.random.fold_in(grad_key, slot_id), t)
            loss, grads = grad_fn(params, x, y, w, aux_s, step_key)
        else:
            loss, grads = jax.value_and_grad(objective)(params, x, y, w, valid_t, aux_s)
        updates, new_opt = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        ok = jnp.any(valid_t)
        if not masked:  # the caller guarantees a non-empty batch: skip the extra pass
            return new_params, new_opt, loss, ok
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
        return keep(new_params, params), keep(new_opt, opt_state), jnp.where(ok, loss, 0.0), ok

    def train_group(params, opt_state, dcs, g_idx, g_valid, g_sw, g_aux, g_ids):
        """Train a group of C slots (all leading axes C) through their non-empty steps.

        Each slot's non-empty steps are moved to the front (stable, so their order is kept)
        and the group loops `max(non-empty steps)` times: a slot with little data stops
        early (its remaining steps are empty, hence no-ops), and no step is wasted on the
        trailing padded steps of the whole group.
        """
        size = dcs.shape[0]
        nonempty = jnp.any(g_valid, axis=-1)  # [C, T]
        step_order = jnp.argsort(~nonempty, axis=1, stable=True).astype(jnp.int32)
        rows = jnp.arange(size)

        if size == 1:  # one slot: unbatched, and every step it runs is non-empty (no masking)
            squeeze = lambda tree: jax.tree.map(lambda a: a[0], tree)
            expand = lambda tree: jax.tree.map(lambda a: a[None], tree)

            def group_step(p, o, idx_t, valid_t, t):
                p, o, loss, ok = slot_step(
                    squeeze(p),
                    squeeze(o),
                    dcs[0],
                    idx_t[0],
                    valid_t[0],
                    None if g_sw is None else g_sw[0],
                    None if g_aux is None else squeeze(g_aux),
                    g_ids[0],
                    t[0],
                    masked=False,
                )
                return expand(p), expand(o), loss[None], ok[None]
        else:
            group_step = lambda p, o, idx_t, valid_t, t: jax.vmap(slot_step)(
                p, o, dcs, idx_t, valid_t, g_sw, g_aux, g_ids, t
            )

        def body(k, carry):
            p, o, loss_sum, n = carry
            t = step_order[:, k]  # [C] each slot's k-th non-empty step
            p, o, loss, ok = group_step(p, o, g_idx[rows, t], g_valid[rows, t], t)
            return p, o, loss_sum + loss.astype(jnp.float32), n + ok.astype(jnp.int32)

        init = (params, opt_state, jnp.zeros(size, jnp.float32), jnp.zeros(size, jnp.int32))
        trips = jnp.max(jnp.sum(nonempty, axis=1))
        return jax.lax.fori_loop(0, trips, body, init)

    if strategy == "vmap" or chunk >= num_slots:
        return train_group(
            params_all, opt_all, data_client, idx, valid, sample_weight, aux, slot_ids
        )

    # Groups of `chunk` slots, largest data first; padded entries point past the end (S)
    # and are dropped when scattered back. One slot per group (map) uses dynamic slices,
    # updated in place.
    groups = -(-num_slots // chunk)
    local = jnp.arange(num_slots, dtype=jnp.int32)
    if strategy == "map":
        order = local.reshape(groups, 1)
        get = lambda full, slots: jax.lax.dynamic_slice_in_dim(full, slots[0], 1)
        put = lambda full, part, slots: jax.lax.dynamic_update_slice_in_dim(full, part, slots[0], 0)
    else:
        order = jnp.argsort(-count, stable=True)
        order = jnp.concatenate([order, jnp.full(groups * chunk - num_slots, num_slots)])
        order = order.astype(jnp.int32).reshape(groups, chunk)
        get = lambda full, slots: jnp.take(full, jnp.minimum(slots, num_slots - 1), axis=0)
        put = lambda full, part, slots: full.at[slots].set(part, mode="drop")

    def group_body(g, carry):
        p_all, o_all, l_all, n_all = carry
        slots = order[g]
        g_valid = get(valid, slots) & (slots < num_slots)[:, None, None]
        g_sw = None if sample_weight is None else get(sample_weight, slots)
        take = lambda tree: jax.tree.map(lambda a: get(a, slots), tree)
        p, o, loss_sum, n = train_group(
            take(p_all),
            take(o_all),
            get(data_client, slots),
            get(idx, slots),
            g_valid,
            g_sw,
            None if aux is None else take(aux),
            get(slot_ids, slots),
        )
        put_all = lambda full, part: jax.tree.map(lambda a, b: put(a, b, slots), full, part)
        return (
            put_all(p_all, p),
            put_all(o_all, o),
            put(l_all, loss_sum, slots),
            put(n_all, n, slots),
        )

    init = (
        params_all,
        opt_all,
        jnp.zeros(num_slots, jnp.float32),
        jnp.zeros(num_slots, jnp.int32),
    )
    return jax.lax.fori_loop(0, groups, group_body, init)


_STATIC = (
    "model",
    "optimizer",
    "batch_size",
    "epochs",
    "steps_per_epoch",
    "num_steps",
    "loss_fn",
    "grad_fn",
    "strategy",
    "chunk",
    "shards",
)
_train = jax.jit(_train_impl, static_argnames=_STATIC)
_train_donated = jax.jit(_train_impl, static_argnames=_STATIC, donate_argnames=("state",))
