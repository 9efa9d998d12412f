"""`local_train`: local minibatch training of every model slot at once, as one compiled program.

Layout: slot s trains the model `state.params[s]` on the samples of data client
`data_client[s]`. The steps, top to bottom:

- `local_train` validates the inputs on the host (`_check_train_inputs`), resolves the
  strategy and the shard count, and calls the jitted `_train_impl`;
- `_train_impl` draws the minibatch schedule (`engine.batches.slot_batches`, `[S, T, B]`) and
  runs `_run_slots` on every shard of slots (`engine.sharding`);
- `_run_slots` trains the whole block as one group (`_train_group`) or scans over groups of
  slots (`_train_groups`, the strategies of `engine.strategy`);
- `_train_group` loops over a group's steps after each slot's non-empty steps are compacted to
  the front, only as long as its busiest slot, so clients with little data do not pay for the
  largest client's step count;
- `_slot_step` is one optimizer step of one slot: gather its minibatch (`_gather_batch`),
  `grad -> optimizer.update -> apply_updates`, skipped (state kept bit for bit) when the
  slot's batch is empty.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pfedwn_jax._checks import (
    check_finite,
    check_int,
    check_range,
    check_rank,
    check_shape,
    check_tree_leading,
    is_concrete,
)
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
# `step(consts, params, opt_state, x, y, w, valid_t, aux_s, key) -> (params, opt_state, loss)`:
# one slot's optimizer step with its closed-over values explicit (`_hoisted_step`).
Step = Callable[..., tuple[Any, Any, jax.Array]]
# (params, opt_state, loss_sum [S], steps [S]): what training a block or group of slots returns.
SlotsOut = tuple[Any, Any, jax.Array, jax.Array]


class _StepFns(NamedTuple):
    """The static pieces of one optimizer step (see `local_train` for `loss_fn`/`grad_fn`)."""

    model: Model
    optimizer: optax.GradientTransformation
    loss_fn: LossFn | None
    grad_fn: GradFn | None


class _Shared(NamedTuple):
    """Inputs every slot reads (replicated on every shard)."""

    x: jax.Array  # [clients, M, H, W, C] uint8 train images
    y: jax.Array  # [clients, M] int32 labels
    consts: tuple  # values the step closes over (learning rate, ...), None where per slot


class _Slots(NamedTuple):
    """Per-slot inputs of the step loop; every leaf has the same leading slot axis (S or C)."""

    params: Any  # leaves [S, ...]
    opt_state: Any  # leaves [S, ...]
    data_client: jax.Array  # [S] int32, the data client of each slot
    idx: jax.Array  # [S, T, B] int32 sample indices of each step's minibatch
    valid: jax.Array  # [S, T, B] bool, False on padded samples and empty steps
    sample_weight: jax.Array | None  # [S, M] per-sample weights, or None (all 1)
    aux: Any  # leaves [S, ...] handed to the objective as `aux_s`, or None
    slot_key: jax.Array  # [S, ...] PRNG key of each slot's `grad_fn`, folded with the step
    consts: tuple  # [S, ...] per-slot values of the step's closed-over values, else None


# ---------------------------------------------------------------------------------------------
# Input validation (host side, before tracing)


def check_slots(data: ClientData, data_client: Any, num_slots: int | None = None) -> None:
    """Validate `data_client [S]` against the data (host-side; a no-op on tracers)."""
    check_rank("data_client", data_client, 1, "[S]")
    size = np.shape(data_client)[0]
    if num_slots is not None and size != num_slots:
        raise ValueError(f"data_client has {size} entries; the state has {num_slots} slots")
    check_range("data_client", data_client, 0, data.num_clients - 1)
    if is_concrete(data_client):
        arr = np.asarray(data_client)
        if arr.dtype.kind not in "iu":
            raise ValueError(f"data_client must be integers; got dtype {arr.dtype}")


def _check_train_inputs(
    model: Model,
    state: ClientState,
    data: ClientData,
    data_client: Any,
    aux: Any,
    sample_weight: Any,
    active: Any,
) -> None:
    """Check the array inputs of `local_train` against the state's S slots (`[S, ...]`)."""
    num_slots = state.num_slots
    check_tree_leading("state", state, num_slots)
    check_model_fits(model, data.x.shape[2:], input_dtype=data.x.dtype)
    check_slots(data, data_client, num_slots)
    if aux is not None:
        check_tree_leading("aux", aux, num_slots)
    if sample_weight is not None:
        check_shape(
            "sample_weight", sample_weight, (num_slots, data.max_samples), "[S, max_samples]"
        )
        check_finite("sample_weight", sample_weight)
        check_range("sample_weight", sample_weight, 0.0)
    if active is not None:
        check_shape("active", active, (num_slots,), "[S]")


def _static_steps_per_epoch(
    data: ClientData, data_client: Any, active: Any, batch_size: int
) -> int:
    """Steps of one epoch (static): the busiest active slot's need when the sample counts are
    known on the host, else the padded length's (the extra steps are skipped at run time)."""
    if is_concrete(data.count) and is_concrete(data_client):
        counts = np.asarray(data.count)[np.asarray(data_client)]
        if active is not None and is_concrete(active):
            counts = counts * np.asarray(active, dtype=bool)
        return steps_per_epoch(int(counts.max(initial=0)), batch_size)
    return steps_per_epoch(data.max_samples, batch_size)


# ---------------------------------------------------------------------------------------------
# Public entry point


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
    _check_train_inputs(model, state, data, data_client, aux, sample_weight, active)
    batch_size = check_int("batch_size", batch_size, 1)
    epochs = check_int("epochs", epochs, 1)
    if num_steps is not None:
        num_steps = check_int("num_steps", num_steps, 1)
    strategy, chunk = resolve_strategy(strategy, chunk_size, state.num_slots)
    shards = resolve_shards(shards, state.num_slots)
    check_placement("state", state, shards)
    check_placement("data", data, shards)
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
        steps_per_epoch=_static_steps_per_epoch(data, data_client, active, batch_size),
        num_steps=num_steps,
        loss_fn=loss_fn,
        grad_fn=grad_fn,
        strategy=strategy,
        chunk=chunk,
        shards=shards,
    )


# ---------------------------------------------------------------------------------------------
# The jitted program: schedule, shards


def _train_impl(
    model: Model,
    optimizer: optax.GradientTransformation,
    state: ClientState,
    x_all: jax.Array,
    y_all: jax.Array,
    count_all: jax.Array,
    data_client: jax.Array,
    key: jax.Array,
    aux: Any,
    sample_weight: jax.Array | None,
    active: jax.Array | None,
    *,
    batch_size: int,
    epochs: int,
    steps_per_epoch: int,
    num_steps: int | None,
    loss_fn: LossFn | None,
    grad_fn: GradFn | None,
    strategy: str,
    chunk: int,
    shards: int,
) -> tuple[ClientState, dict[str, jax.Array]]:
    """The jitted body of `local_train`: schedule `[S, T, B]`, train every shard, metrics `[S]`.

    An inactive slot gets count 0, hence no valid step: its state comes back unchanged.
    """
    num_slots = data_client.shape[0]
    count = count_all[data_client]  # [S] real samples of each slot's client
    if active is not None:
        count = jnp.where(jnp.asarray(active, bool), count, 0)
    batch_key, grad_key = jax.random.split(key)
    idx, valid = slot_batches(
        batch_key,
        count,
        y_all.shape[1],
        batch_size,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        num_steps=num_steps,
    )
    slot_ids = jnp.arange(num_slots, dtype=jnp.int32)
    slot_keys = jax.vmap(jax.random.fold_in, (None, 0))(grad_key, slot_ids)
    slots = _Slots(
        state.params, state.opt_state, data_client, idx, valid, sample_weight, aux, slot_keys, ()
    )
    fns = _StepFns(model, optimizer, loss_fn, grad_fn)
    step, consts = _hoisted_step(fns, x_all, y_all, slots)
    slots = slots._replace(consts=(None,) * len(consts))
    shared = _Shared(x_all, y_all, tuple(consts))
    run = _foldable_run(step, strategy, chunk)
    if shards == 1:
        params, opt_state, loss_sum, n = run(shared, slots, count)
    else:
        params, opt_state, loss_sum, n = shard_slots(
            run, (shared,), (slots, count), num_slots, shards, work=count
        )
    new_state = ClientState(params, opt_state)
    if shards > 1:
        new_state = constrain_slots(new_state, num_slots, shards)
    metrics = {"loss": loss_sum / jnp.maximum(n, 1).astype(jnp.float32), "steps": n}
    return new_state, metrics


def _run_slots(
    step: Step, strategy: str, chunk: int, shared: _Shared, slots: _Slots, count: jax.Array
) -> SlotsOut:
    """Train a block of S_local slots (`slots` leaves `[S_local, ...]`, `count [S_local]`) with
    `strategy`: the body of one shard. Returns `(params, opt_state, loss_sum, steps)`."""
    if strategy == "vmap" or chunk >= slots.data_client.shape[0]:
        return _train_group(step, shared, slots)
    return _train_groups(step, shared, slots, count, strategy, chunk)


def _foldable_run(
    step: Step, strategy: str, chunk: int
) -> Callable[[_Shared, _Slots, jax.Array], SlotsOut]:
    """`_run_slots(step, strategy, chunk, ...)` whose `vmap` folds the mapped axis into the slots.

    Slots train independently, so `vmap` over runs (a sweep) is the same as training the W*S
    slots of all runs as one block: each (run, slot) then steps only through its own
    non-empty steps under "map"/"chunked", instead of every run stepping as long as the
    longest run's client in lockstep (a batched loop bound), and a run's step is the same
    unbatched program as in `run()`. The rule calls the folded function itself, so nested
    `vmap`s fold too.
    """

    @jax.custom_batching.custom_vmap
    def run(shared: _Shared, slots: _Slots, count: jax.Array) -> SlotsOut:
        return _run_slots(step, strategy, chunk, shared, slots, count)

    @run.def_vmap
    def rule(axis_size: int, in_batched: list, shared: _Shared, slots: _Slots, count: jax.Array):
        shared_b, slots_b, count_b = in_batched
        folded = _fold(axis_size, shared, slots, count, shared_b, slots_b, count_b)
        out = run(*folded)
        unfold = lambda a: a.reshape(axis_size, a.shape[0] // axis_size, *a.shape[1:])
        return jax.tree.map(unfold, out), jax.tree.map(lambda _: True, out)

    return run


def _fold(
    w: int, shared: _Shared, slots: _Slots, count: jax.Array, shared_b, slots_b, count_b
) -> tuple[_Shared, _Slots, jax.Array]:
    """Merge a mapped axis of size `w` into the client and slot axes: data `[w, C, ...]` ->
    `[w*C, ...]` (run r's data client c becomes `r*C + c`), slot leaves `[w, S, ...]` ->
    `[w*S, ...]` (unmapped ones broadcast first), and mapped shared values of the step
    (`[w, ...]`) become per-slot values `[w*S, ...]`."""
    num_slots = slots.data_client.shape[1 if slots_b.data_client else 0]

    def merge(a: jax.Array, batched: bool) -> jax.Array:
        a = a if batched else jnp.broadcast_to(a, (w, *a.shape))
        return a.reshape(w * a.shape[1], *a.shape[2:])

    shared, slots, slots_b = _consts_per_slot(w, num_slots, shared, slots, shared_b, slots_b)
    if shared_b.x or shared_b.y:
        num_clients = shared.x.shape[1] if shared_b.x else shared.x.shape[0]
        dc = slots.data_client if slots_b.data_client else slots.data_client[None]
        offset = (jnp.arange(w, dtype=dc.dtype) * num_clients)[:, None]
        slots = slots._replace(data_client=dc + offset)
        slots_b = slots_b._replace(data_client=True)
        shared = shared._replace(x=merge(shared.x, shared_b.x), y=merge(shared.y, shared_b.y))
    slots = jax.tree.map(merge, slots, slots_b)
    return shared, slots, merge(count, count_b)


def _consts_per_slot(
    w: int, num_slots: int, shared: _Shared, slots: _Slots, shared_b, slots_b
) -> tuple[_Shared, _Slots, Any]:
    """Move the step's mapped shared values (`[w, ...]`, e.g. each run's learning rate) into
    the slots as `[w, S, ...]`: after folding, each slot reads its own run's value."""
    common, own, own_b = [], [], []
    for c, c_b, o, o_b in zip(
        shared.consts, shared_b.consts, slots.consts, slots_b.consts, strict=True
    ):
        if c_b:
            common.append(None)
            own.append(jnp.broadcast_to(c[:, None], (w, num_slots, *c.shape[1:])))
            own_b.append(True)
        else:
            common.append(c)
            own.append(o)
            own_b.append(o_b)
    shared = shared._replace(consts=tuple(common))
    return shared, slots._replace(consts=tuple(own)), slots_b._replace(consts=tuple(own_b))


# ---------------------------------------------------------------------------------------------
# One optimizer step of one slot


def _gather_batch(
    shared: _Shared, dc: jax.Array, idx_t: jax.Array, valid_t: jax.Array, sw: jax.Array | None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One slot's minibatch: `x [B, H, W, C]`, `y [B]`, weights `w [B]` float32 (0 on padding).

    `dc` is the slot's data client, `idx_t [B]` the sample indices, `valid_t [B]` the mask,
    `sw [M]` the slot's per-sample weights (or None).
    """
    x = shared.x[dc, idx_t]
    y = shared.y[dc, idx_t]
    w = valid_t.astype(jnp.float32)
    if sw is not None:
        w = w * sw[idx_t].astype(jnp.float32)
    return x, y, w


def _objective(
    fns: _StepFns,
    params: Any,
    x: jax.Array,
    y: jax.Array,
    w: jax.Array,
    valid_t: jax.Array,
    aux_s: Any,
) -> jax.Array:
    """One slot's minibatch objective: `loss_fn`, or the mean cross-entropy over real samples."""
    if fns.loss_fn is not None:
        return fns.loss_fn(params, x, y, w, aux_s)
    return weighted_ce(fns.model.apply(params, x), y, w, jnp.sum(valid_t))


def _update(
    fns: _StepFns,
    params: Any,
    opt_state: Any,
    x: jax.Array,
    y: jax.Array,
    w: jax.Array,
    valid_t: jax.Array,
    aux_s: Any,
    step_key: jax.Array,
) -> tuple[Any, Any, jax.Array]:
    """One optimizer step of one slot on its minibatch: `(params, opt_state, loss)`."""
    if fns.grad_fn is not None:
        loss, grads = fns.grad_fn(params, x, y, w, aux_s, step_key)
    else:
        objective = functools.partial(_objective, fns)
        loss, grads = jax.value_and_grad(objective)(params, x, y, w, valid_t, aux_s)
    updates, new_opt = fns.optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_opt, loss


def _hoisted_step(
    fns: _StepFns, x_all: jax.Array, y_all: jax.Array, slots: _Slots
) -> tuple[Step, list]:
    """`_update` as `(step(consts, *args), consts)`: every value it closes over (the learning
    rate inside the optimizer, a loss's hyperparameters) becomes an explicit input, so the
    run-folding `vmap` rule (`_foldable_run`) can give each slot its own run's values."""
    spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)  # no sharding: traced once
    one = lambda tree: jax.tree.map(lambda a: spec(a.shape[1:], a.dtype), tree)
    batch = (slots.idx.shape[-1],)
    x, y = spec(batch + x_all.shape[2:], x_all.dtype), spec(batch, y_all.dtype)
    w, valid = spec(batch, jnp.float32), spec(batch, jnp.bool_)
    args = (one(slots.params), one(slots.opt_state), x, y, w, valid)
    args += (one(slots.aux), one(slots.slot_key))
    closed, shape = jax.make_jaxpr(functools.partial(_update, fns), return_shape=True)(*args)
    out_tree, jaxpr = jax.tree.structure(shape), closed.jaxpr

    def step(consts: tuple, *step_args: Any) -> tuple[Any, Any, jax.Array]:
        flat = jax.core.eval_jaxpr(jaxpr, list(consts), *jax.tree.leaves(step_args))
        return jax.tree.unflatten(out_tree, flat)

    return step, list(closed.consts)


def _slot_step(
    step: Step,
    shared: _Shared,
    params: Any,
    opt_state: Any,
    dc: jax.Array,
    idx_t: jax.Array,
    valid_t: jax.Array,
    sw: jax.Array | None,
    aux_s: Any,
    slot_key: jax.Array,
    consts_s: tuple,
    t: jax.Array,
    masked: bool = True,
) -> tuple[Any, Any, jax.Array, jax.Array]:
    """One optimizer step of one slot at step `t` on minibatch `idx_t [B]`, `valid_t [B]`.

    `consts_s` holds the slot's own values of the step's closed-over values (None where
    `shared.consts` holds the value all slots share). Returns `(params, opt_state, loss, ok)`,
    `ok` True when the batch has a real sample. With `masked`, an empty batch leaves the
    state unchanged (bit for bit) and its loss 0; without, the caller guarantees a non-empty
    batch and the selection is skipped.
    """
    x, y, w = _gather_batch(shared, dc, idx_t, valid_t, sw)
    consts = tuple(
        c if c_s is None else c_s for c, c_s in zip(shared.consts, consts_s, strict=True)
    )
    step_key = jax.random.fold_in(slot_key, t)
    new_params, new_opt, loss = step(consts, params, opt_state, x, y, w, valid_t, aux_s, step_key)
    ok = jnp.any(valid_t)
    if not masked:
        return new_params, new_opt, loss, ok
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
    return keep(new_params, params), keep(new_opt, opt_state), jnp.where(ok, loss, 0.0), ok


# ---------------------------------------------------------------------------------------------
# The compacted step loop of one group of slots


def _group_step(
    step: Step,
    shared: _Shared,
    group: _Slots,
    params: Any,
    opt_state: Any,
    idx_t: jax.Array,
    valid_t: jax.Array,
    t: jax.Array,
) -> tuple[Any, Any, jax.Array, jax.Array]:
    """`_slot_step` of every slot of a group of C (leaves `[C, ...]`, `idx_t, valid_t [C, B]`,
    `t [C]`) -> `(params, opt_state, loss [C], ok [C])`.

    Several slots: vmapped and masked, since a slot may have fewer non-empty steps than the
    group runs. One slot: unbatched and unmasked, as every step `_train_group` runs for it is
    non-empty.
    """
    args = (params, opt_state, group.data_client, idx_t, valid_t)
    args += (group.sample_weight, group.aux, group.slot_key, group.consts, t)
    if group.data_client.shape[0] > 1:
        return jax.vmap(functools.partial(_slot_step, step, shared))(*args)
    one = jax.tree.map(lambda a: a[0], args)
    out = _slot_step(step, shared, *one, masked=False)
    return jax.tree.map(lambda a: a[None], out)


def _train_group(step: Step, shared: _Shared, group: _Slots) -> SlotsOut:
    """Train a group of C slots (`group` leaves `[C, ...]`) through their non-empty steps.

    Each slot's non-empty steps are moved to the front (stable, so their order is kept) and the
    group loops `max(non-empty steps)` times: a slot with little data stops early (its
    remaining steps are empty, hence no-ops), and no step is wasted on the trailing padded
    steps of the whole group. Returns `(params, opt_state, loss_sum [C], steps [C])`.
    """
    size = group.data_client.shape[0]
    nonempty = jnp.any(group.valid, axis=-1)  # [C, T]
    step_order = jnp.argsort(~nonempty, axis=1, stable=True).astype(jnp.int32)  # [C, T]
    rows = jnp.arange(size)
    group_step = functools.partial(_group_step, step, shared, group)

    def body(k: jax.Array, carry: SlotsOut) -> SlotsOut:
        p, o, loss_sum, n = carry
        t = step_order[:, k]  # [C] each slot's k-th non-empty step
        p, o, loss, ok = group_step(p, o, group.idx[rows, t], group.valid[rows, t], t)
        return p, o, loss_sum + loss.astype(jnp.float32), n + ok.astype(jnp.int32)

    init = (group.params, group.opt_state, jnp.zeros(size, jnp.float32), jnp.zeros(size, jnp.int32))
    trips = jnp.max(jnp.sum(nonempty, axis=1))
    return jax.lax.fori_loop(0, trips, body, init)


# ---------------------------------------------------------------------------------------------
# The scan over groups of slots ("map" and "chunked")


def _group_order(strategy: str, chunk: int, count: jax.Array) -> jax.Array:
    """`[G, C]` local slot indices of each group: one slot per group in order ("map"), or
    groups of `chunk` slots by decreasing data size ("chunked"), padded with S (past the end)."""
    num_slots = count.shape[0]
    groups = -(-num_slots // chunk)
    if strategy == "map":
        return jnp.arange(num_slots, dtype=jnp.int32).reshape(groups, 1)
    order = jnp.argsort(-count, stable=True)
    order = jnp.concatenate([order, jnp.full(groups * chunk - num_slots, num_slots)])
    return order.astype(jnp.int32).reshape(groups, chunk)


def _take_group(strategy: str, full: jax.Array, ids: jax.Array) -> jax.Array:
    """Rows `ids [C]` of `full [S, ...]`: a dynamic slice for "map" (one slot), else a gather
    (padded ids read the last slot; their steps are masked out)."""
    if strategy == "map":
        return jax.lax.dynamic_slice_in_dim(full, ids[0], 1)
    return jnp.take(full, jnp.minimum(ids, full.shape[0] - 1), axis=0)


def _put_group(strategy: str, full: jax.Array, part: jax.Array, ids: jax.Array) -> jax.Array:
    """Write `part [C, ...]` back to rows `ids` of `full [S, ...]`: in place for "map", else a
    scatter that drops the padded ids."""
    if strategy == "map":
        return jax.lax.dynamic_update_slice_in_dim(full, part, ids[0], 0)
    return full.at[ids].set(part, mode="drop")


def _train_groups(
    step: Step, shared: _Shared, slots: _Slots, count: jax.Array, strategy: str, chunk: int
) -> SlotsOut:
    """Train `slots` (leaves `[S, ...]`) group after group (`fori_loop` over the `[G, C]` order
    of `_group_order`), each group by `_train_group`, its results written back in place."""
    num_slots = slots.data_client.shape[0]
    order = _group_order(strategy, chunk, count)
    take = lambda tree, ids: jax.tree.map(lambda a: _take_group(strategy, a, ids), tree)
    put = lambda full, part, ids: jax.tree.map(
        lambda a, b: _put_group(strategy, a, b, ids), full, part
    )

    def body(g: jax.Array, carry: SlotsOut) -> SlotsOut:
        ids = order[g]  # [C]
        group = take(slots._replace(params=carry[0], opt_state=carry[1]), ids)
        group = group._replace(valid=group.valid & (ids < num_slots)[:, None, None])
        return put(carry, _train_group(step, shared, group), ids)

    init = (
        slots.params,
        slots.opt_state,
        jnp.zeros(num_slots, jnp.float32),
        jnp.zeros(num_slots, jnp.int32),
    )
    return jax.lax.fori_loop(0, order.shape[0], body, init)


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
