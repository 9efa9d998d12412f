"""`local_train`: local minibatch training of every model slot at once, as one compiled program.

Layout: slot s trains the model `state.params[s]` on the samples of data client
`data_client[s]`. The steps, top to bottom:

- `local_train` validates the inputs on the host (`_check_train_inputs`), resolves the
  strategy and the shard count, and calls the jitted `_train_impl`;
- `_train_impl` draws the minibatch schedule (`engine.batches.slot_batches`, `[S, T, B]`) and
  runs `_run_slots` on every shard of slots (`engine.sharding`);
- `_run_slots` trains the whole block as one group (`slot_steps.train_group`) or scans over
  groups of slots (`slot_steps.train_groups`, the strategies of `engine.strategy`); under a
  sweep's `vmap` it folds the runs into the slots (`_foldable_run`);
- `slot_steps.train_group` loops over a group's steps after each slot's non-empty steps are
  compacted to the front, only as long as its busiest slot, so clients with little data do not
  pay for the largest client's step count; one step of one slot gathers its minibatch and does
  `grad -> optimizer.update -> apply_updates`, skipped (state kept bit for bit) when the
  slot's batch is empty.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
from pfedwn_jax.engine.sharding import (
    check_placement,
    constrain_slots,
    resolve_shards,
    shard_slots,
)
from pfedwn_jax.engine.slot_steps import (
    GradFn,
    LossFn,
    Shared,
    Slots,
    SlotsOut,
    Step,
    StepFns,
    hoisted_step,
    train_group,
    train_groups,
)
from pfedwn_jax.engine.state import ClientState
from pfedwn_jax.engine.strategy import resolve_strategy
from pfedwn_jax.models import Model, check_model_fits

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


def _placement(
    state: ClientState, data: ClientData, strategy: str, chunk_size: int | None, shards: Any
) -> tuple[str, int, int]:
    """`(strategy, chunk, shards)` resolved for `state`'s slots, the state and the data
    checked to be placed over those shards."""
    strategy, chunk = resolve_strategy(strategy, chunk_size, state.num_slots)
    shards = resolve_shards(shards, state.num_slots)
    check_placement("state", state, shards)
    check_placement("data", data, shards)
    return strategy, chunk, shards


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


def _schedule(
    state: ClientState, batch_size: int, epochs: int, num_steps: int | None, slot_ids: Any
) -> tuple[int, int, int | None, jax.Array | None]:
    """`local_train`'s schedule arguments checked: `(batch_size, epochs, num_steps,
    slot_ids)`, the ids as an int32 array `[S]` (or None)."""
    if slot_ids is not None:
        check_shape("slot_ids", slot_ids, (state.num_slots,), "[S]")
        slot_ids = jnp.asarray(slot_ids, jnp.int32)
    batch_size, epochs = check_int("batch_size", batch_size, 1), check_int("epochs", epochs, 1)
    num_steps = None if num_steps is None else check_int("num_steps", num_steps, 1)
    return batch_size, epochs, num_steps, slot_ids


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
    slot_ids: Any = None,
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
      slot_ids: `[S]` int, the number keying each slot's minibatch order and `grad_fn` key
        (default its row): slots trained in several calls (chunks of a larger set) given
        their ids in the whole set train exactly as in one call.
      strategy, chunk_size: slot execution strategy (see `engine.strategy`).
      shards: split the slots into this many contiguous blocks, one per device, trained in
        parallel (see `engine.sharding`); None: every device of the default backend.
      donate: donate `state`'s buffers to the output (the caller must not reuse `state`).

    Returns:
      `(new_state, {"loss": [S] mean objective over the slot's non-empty steps (0 if none),
      "steps": [S] int32 number of optimizer steps taken})`.
    """
    _check_train_inputs(model, state, data, data_client, aux, sample_weight, active)
    batch_size, epochs, num_steps, ids = _schedule(state, batch_size, epochs, num_steps, slot_ids)
    strategy, chunk, shards = _placement(state, data, strategy, chunk_size, shards)
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
        ids,
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
    slot_ids: jax.Array | None,
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
    if slot_ids is None:
        slot_ids = jnp.arange(num_slots, dtype=jnp.int32)
    idx, valid = slot_batches(
        batch_key,
        count,
        y_all.shape[1],
        batch_size,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        num_steps=num_steps,
        ids=slot_ids,
    )
    slot_keys = jax.vmap(jax.random.fold_in, (None, 0))(grad_key, slot_ids)
    slots = Slots(
        state.params, state.opt_state, data_client, idx, valid, sample_weight, aux, slot_keys, ()
    )
    fns = StepFns(model, optimizer, loss_fn, grad_fn)
    step, consts = hoisted_step(fns, x_all, y_all, slots)
    slots = slots.replace(consts=(None,) * len(consts))
    shared = Shared(x_all, y_all, tuple(consts))
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
    step: Step, strategy: str, chunk: int, shared: Shared, slots: Slots, count: jax.Array
) -> SlotsOut:
    """Train a block of S_local slots (`slots` leaves `[S_local, ...]`, `count [S_local]`) with
    `strategy`: the body of one shard. Returns `(params, opt_state, loss_sum, steps)`."""
    if strategy == "vmap" or chunk >= slots.data_client.shape[0]:
        return train_group(step, shared, slots)
    return train_groups(step, shared, slots, count, strategy, chunk)


def _foldable_run(
    step: Step, strategy: str, chunk: int
) -> Callable[[Shared, Slots, jax.Array], SlotsOut]:
    """`_run_slots(step, strategy, chunk, ...)` whose `vmap` folds the mapped axis into the slots.

    Slots train independently, so `vmap` over runs (a sweep) is the same as training the W*S
    slots of all runs as one block: each (run, slot) then steps only through its own
    non-empty steps under "map"/"chunked", instead of every run stepping as long as the
    longest run's client in lockstep (a batched loop bound), and a run's step is the same
    unbatched program as in `run()`. The rule calls the folded function itself, so nested
    `vmap`s fold too.
    """

    @jax.custom_batching.custom_vmap
    def run(shared: Shared, slots: Slots, count: jax.Array) -> SlotsOut:
        return _run_slots(step, strategy, chunk, shared, slots, count)

    @run.def_vmap
    def rule(axis_size: int, in_batched: list, shared: Shared, slots: Slots, count: jax.Array):
        shared_b, slots_b, count_b = in_batched
        folded = _fold(axis_size, shared, slots, count, shared_b, slots_b, count_b)
        out = run(*folded)
        unfold = lambda a: a.reshape(axis_size, a.shape[0] // axis_size, *a.shape[1:])
        return jax.tree.map(unfold, out), jax.tree.map(lambda _: True, out)

    return run


def _fold(
    w: int, shared: Shared, slots: Slots, count: jax.Array, shared_b, slots_b, count_b
) -> tuple[Shared, Slots, jax.Array]:
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
        slots = slots.replace(data_client=dc + offset)
        slots_b = slots_b.replace(data_client=True)
        shared = shared.replace(x=merge(shared.x, shared_b.x), y=merge(shared.y, shared_b.y))
    slots = jax.tree.map(merge, slots, slots_b)
    return shared, slots, merge(count, count_b)


def _consts_per_slot(
    w: int, num_slots: int, shared: Shared, slots: Slots, shared_b, slots_b
) -> tuple[Shared, Slots, Any]:
    """Move the step's mapped shared values (`[w, ...]`, e.g. each run's learning rate) into
    the slots as `[w, S, ...]`: after folding, each slot reads its own run's value."""
    common: list[Any] = []
    own: list[Any] = []
    own_b: list[Any] = []
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
    shared = shared.replace(consts=tuple(common))
    return shared, slots.replace(consts=tuple(own)), slots_b.replace(consts=tuple(own_b))


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
