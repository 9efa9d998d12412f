"""One optimizer step of one slot, and the loops that run a block of slots through theirs.

`hoisted_step` traces the step once (objective or `grad_fn`, `optimizer.update`,
`apply_updates`) with every value it closes over made an explicit input; `train_group` runs a
group of slots through their non-empty steps (compacted to the front, as long as the busiest
slot); `train_groups` scans the groups of a block ("map", "chunked"). `local_train`
(`engine.train`) builds the inputs and calls them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax

from pfedwn_jax.engine.losses import weighted_ce
from pfedwn_jax.models import Model

LossFn = Callable[..., jax.Array]
GradFn = Callable[..., tuple[jax.Array, Any]]
# `step(consts, params, opt_state, x, y, w, valid_t, aux_s, key) -> (params, opt_state, loss)`:
# one slot's optimizer step with its closed-over values explicit (`hoisted_step`).
Step = Callable[..., tuple[Any, Any, jax.Array]]
# (params, opt_state, loss_sum [S], steps [S]): what training a block or group of slots returns.
SlotsOut = tuple[Any, Any, jax.Array, jax.Array]


class StepFns(NamedTuple):
    """The static pieces of one optimizer step (see `local_train` for `loss_fn`/`grad_fn`)."""

    model: Model
    optimizer: optax.GradientTransformation
    loss_fn: LossFn | None
    grad_fn: GradFn | None


class Shared(flax.struct.PyTreeNode):
    """Inputs every slot reads (replicated on every shard)."""

    x: jax.Array  # [clients, M, H, W, C] uint8 train images
    y: jax.Array  # [clients, M] int32 labels
    consts: tuple  # values the step closes over (learning rate, ...), None where per slot


class Slots(flax.struct.PyTreeNode):
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
# One optimizer step of one slot


def _gather_batch(
    shared: Shared, dc: jax.Array, idx_t: jax.Array, valid_t: jax.Array, sw: jax.Array | None
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
    fns: StepFns,
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
    fns: StepFns,
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


def hoisted_step(
    fns: StepFns, x_all: jax.Array, y_all: jax.Array, slots: Slots
) -> tuple[Step, list]:
    """`_update` as `(step(consts, *args), consts)`: every value it closes over (the learning
    rate inside the optimizer, a loss's hyperparameters) becomes an explicit input, so the
    run-folding `vmap` rule (`_foldable_run`) can give each slot its own run's values."""
    spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)  # no sharding: traced once
    one = lambda tree: jax.tree.map(lambda a: spec(a.shape[1:], a.dtype), tree)
    batch = (slots.idx.shape[-1],)
    x, y = spec(batch + x_all.shape[2:], x_all.dtype), spec(batch, y_all.dtype)
    w, valid = spec(batch, jnp.float32), spec(batch, jnp.bool_)
    params, opt_state, aux, slot_key = map(
        one, (slots.params, slots.opt_state, slots.aux, slots.slot_key)
    )
    args = (params, opt_state, x, y, w, valid, aux, slot_key)
    closed, shape = jax.make_jaxpr(functools.partial(_update, fns), return_shape=True)(*args)
    out_tree, jaxpr = jax.tree.structure(shape), closed.jaxpr

    def step(consts: tuple, *step_args: Any) -> tuple[Any, Any, jax.Array]:
        flat = jax.core.eval_jaxpr(jaxpr, list(consts), *jax.tree.leaves(step_args))
        return jax.tree.unflatten(out_tree, flat)

    return step, list(closed.consts)


def _slot_step(
    step: Step,
    shared: Shared,
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
    *,
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
    shared: Shared,
    group: Slots,
    params: Any,
    opt_state: Any,
    idx_t: jax.Array,
    valid_t: jax.Array,
    t: jax.Array,
) -> tuple[Any, Any, jax.Array, jax.Array]:
    """`_slot_step` of every slot of a group of C (leaves `[C, ...]`, `idx_t, valid_t [C, B]`,
    `t [C]`) -> `(params, opt_state, loss [C], ok [C])`.

    Vmapped and masked, since a slot may have fewer non-empty steps than the group runs (a
    single slot runs unbatched in `_train_one`).
    """
    dc, sw = group.data_client, group.sample_weight
    args = (params, opt_state, dc, idx_t, valid_t, sw, group.aux, group.slot_key, group.consts, t)
    return jax.vmap(functools.partial(_slot_step, step, shared))(*args)


def train_group(step: Step, shared: Shared, group: Slots) -> SlotsOut:
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
    if size == 1:
        return _train_one(step, shared, group, step_order[0], trips)
    return jax.lax.fori_loop(0, trips, body, init)


def _train_one(
    step: Step, shared: Shared, group: Slots, step_order: jax.Array, trips: jax.Array
) -> SlotsOut:
    """`train_group` of a single slot: the loop carries the unbatched state, so the
    optimizer updates each buffer in place (a `[1, ...]` carry made XLA:CPU copy the
    largest weight every step)."""
    one = jax.tree.map(lambda a: a[0], group)

    def body(k: jax.Array, carry: tuple) -> tuple:
        p, o, loss_sum, n = carry
        t = step_order[k]
        args = (p, o, one.data_client, one.idx[t], one.valid[t], one.sample_weight, one.aux)
        p, o, loss, ok = _slot_step(step, shared, *args, one.slot_key, one.consts, t, masked=False)
        return p, o, loss_sum + loss.astype(jnp.float32), n + ok.astype(jnp.int32)

    init = (one.params, one.opt_state, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))
    out = jax.lax.fori_loop(0, trips, body, init)
    return jax.tree.map(lambda a: a[None], out)


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


def train_groups(
    step: Step, shared: Shared, slots: Slots, count: jax.Array, strategy: str, chunk: int
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
        group = take(slots.replace(params=carry[0], opt_state=carry[1]), ids)
        group = group.replace(valid=group.valid & (ids < num_slots)[:, None, None])
        return put(carry, train_group(step, shared, group), ids)

    init = (
        slots.params,
        slots.opt_state,
        jnp.zeros(num_slots, jnp.float32),
        jnp.zeros(num_slots, jnp.int32),
    )
    return jax.lax.fori_loop(0, order.shape[0], body, init)
