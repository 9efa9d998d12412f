"""Splitting the slot axis over devices: each device trains its own block of slots.

On a CPU, XLA runs one client's batch-32 steps on one core; exposing every core as a JAX
device (`pfedwn_jax.use_cpu_devices`) and giving each device a block of slots runs the cores in
parallel. On several GPUs or TPU cores the same code spreads the clients over the chips.

Several processes (`pfedwn_jax.distributed.initialize`, e.g. one per host): the slot mesh spans
the devices of every process, each holding an equal block of them; `put_slots` / `replicate`
copy each process's own rows from the same host value (`distributed.from_host`), and the
gathers of neighbor models across blocks are collectives XLA inserts into the compiled round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pfedwn_jax import distributed
from pfedwn_jax._checks import check_int, check_shape, check_tree_leading

SLOT_AXIS = "slots"

# `shards=None` splits only when every device gets at least this many slots. Below it the
# extra compile time and the gathers cost more than the parallel steps save (measured on 2
# cores: the 4-slot MLP demo ran 34 s on one device against 39 s on two, while a round of 10
# MLP clients ran 1.7x faster on two).
MIN_SLOTS_PER_SHARD = 4


def resolve_shards(shards: int | None, num_slots: int) -> int:
    """Number of blocks the slot axis is split into.

    `shards=None`: as many devices of the default backend as give each at least
    `MIN_SLOTS_PER_SHARD` slots (1, i.e. no splitting, on one device or for few slots).
    An explicit `shards` is capped at the number of slots. Several processes: a split must
    give every process the same number of devices, so the count is a multiple of the process
    count (None: rounded down to one, at least one device per process; an explicit count
    above 1: a `ValueError` otherwise). `shards=1` stays 1: each process runs every slot on
    its own first device (a sweep, which places the runs itself, asks for that).
    """
    num_slots = check_int("num_slots", num_slots, 1)
    available, procs = jax.device_count(), jax.process_count()
    if shards is None:
        return _whole_processes(max(1, min(available, num_slots // MIN_SLOTS_PER_SHARD)))
    shards = check_int("shards", shards, 1)
    if shards > available:
        raise ValueError(
            f"shards={shards} exceeds the {available} {jax.default_backend()} device(s); "
            f"allowed: 1..{available} (on a CPU, call pfedwn_jax.use_cpu_devices() first)"
        )
    if shards == 1:
        return 1
    if shards % procs:
        raise ValueError(
            f"shards={shards} does not split over the {procs} processes; allowed: a multiple "
            f"of {procs} up to {available}"
        )
    return _whole_processes(min(shards, num_slots))


def _whole_processes(shards: int) -> int:
    """`shards` rounded down to a multiple of the process count, at least one per process."""
    procs = jax.process_count()
    return max(procs, shards - shards % procs)


def check_placement(name: str, tree: Any, shards: int) -> None:
    """Host-side: raise a `ValueError` if a concrete leaf of `tree` is pinned (committed) to
    fewer devices than the `shards` it is about to be split over (JAX would fail deep inside
    with "incompatible devices")."""
    if shards == 1:
        return
    for leaf in jax.tree.leaves(tree):
        concrete = isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer)
        pinned = concrete and leaf.committed
        if pinned and len(leaf.sharding.device_set) < shards:
            raise ValueError(
                f"{name} is placed on {sorted(d.id for d in leaf.sharding.device_set)} "
                f"but the slots are split over {shards} devices; place it with "
                "engine.put_slots / engine.replicate, or pass shards=1"
            )


def slot_mesh(shards: int) -> Any:
    """The mesh whose `"slots"` axis splits the slots: inside a program traced under a mesh
    with a `"slots"` axis of `shards` devices (`jax.set_mesh`, the driver's `("runs",
    "slots")` mesh), that mesh; otherwise a one-axis mesh over the first `shards` devices of
    the default backend (over several processes, the first `shards / process_count` devices
    of each, in process order: each process holds one contiguous block of slots)."""
    context = jax.sharding.get_abstract_mesh()
    if not context.empty and dict(context.shape).get(SLOT_AXIS) == shards:
        return context
    procs = jax.process_count()
    if procs == 1 or shards == 1:
        return Mesh(np.asarray(jax.local_devices()[:shards]), (SLOT_AXIS,))
    by_process = [[d for d in jax.devices() if d.process_index == p] for p in range(procs)]
    devices = [d for local in by_process for d in local[: shards // procs]]
    return Mesh(np.asarray(devices), (SLOT_AXIS,))


def _place(leaf: Any, sharding: NamedSharding) -> jax.Array:
    """`leaf` on `sharding`. Over several processes a host value (the same in every process)
    is copied to this process's devices only (`distributed.from_host`, no communication); an
    array already spread over processes is resharded on the devices (a collective)."""
    if sharding.is_fully_addressable:
        return jax.device_put(leaf, sharding)
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        return jax.device_put(leaf, sharding)
    return distributed.from_host(leaf, sharding)


# Up to this many slots (single-target groups), `shard_slots` reorders the slots so the blocks
# carry equal work: a gather of the slot state in and out. Measured on 2 cores: 10 CNN clients
# went from 0.92x to 1.00x the loop, but 100 MLP clients from 1.5-1.9x down to 1.4x (their
# contiguous halves hold 15,498 / 18,202 samples, but the copies cost more than the 8%).
BALANCE_MAX_SLOTS = 32


def balanced_order(work: jax.Array, shards: int) -> jax.Array:
    """A permutation of the `[S']` slots (S' a multiple of `shards`) whose contiguous blocks
    carry nearly equal `work`: slots by decreasing work dealt to the blocks in snake order
    (0, 1, ..., D-1, D-1, ..., 0, 0, ...)."""
    size = work.shape[0]
    rounds = size // shards
    order = jnp.argsort(-work, stable=True).astype(jnp.int32).reshape(rounds, shards)
    order = jnp.where((jnp.arange(rounds) % 2 == 1)[:, None], order[:, ::-1], order)
    return order.T.reshape(size)


def shard_slots(
    fn: Callable[..., Any],
    replicated: Sequence[Any],
    per_slot: Sequence[Any],
    num_slots: int,
    shards: int,
    work: jax.Array | None = None,
) -> Any:
    """`fn(*replicated, *per_slot)` with every `per_slot` leaf's leading axis `[S]` split
    into `shards` blocks, one per device, and the outputs (leading axis `[S]`) joined back.

    `fn` must treat slots independently (a slot's outputs depend only on its own inputs and
    on `replicated`). S is padded with zero slots to a multiple of `shards`; the padding is
    dropped from the outputs. With `work [S]` (e.g. each slot's sample count) and at most
    `BALANCE_MAX_SLOTS` slots, the slots are reordered so every block gets a similar share
    of the work, and put back in order afterwards; otherwise the blocks are contiguous.
    """
    check_tree_leading("per_slot", tuple(per_slot), num_slots)
    if work is not None:
        check_shape("work", work, (num_slots,), "[S]")
    size = -(-num_slots // shards) * shards
    pad = size - num_slots

    def pad_leaf(a: jax.Array) -> jax.Array:
        if pad == 0:
            return a
        return jnp.concatenate([a, jnp.zeros((pad, *a.shape[1:]), a.dtype)])

    padded = jax.tree.map(pad_leaf, tuple(per_slot))
    order = None
    if work is not None and num_slots <= BALANCE_MAX_SLOTS:
        order = balanced_order(pad_leaf(jnp.asarray(work, jnp.float32)), shards)
        padded = jax.tree.map(lambda a: a[order], padded)
    if manual_slots():
        out = _own_block(fn, replicated, padded, size // shards)
    else:
        in_specs = (P(),) * len(replicated) + (P(SLOT_AXIS),) * len(per_slot)
        out = jax.shard_map(
            fn,
            mesh=slot_mesh(shards),
            in_specs=in_specs,
            out_specs=P(SLOT_AXIS),
            axis_names={SLOT_AXIS},
            check_vma=False,
        )(*replicated, *padded)
    if order is not None:
        inverse = jnp.argsort(order)
        out = jax.tree.map(lambda a: a[inverse], out)
    return jax.tree.map(lambda a: a[:num_slots], out)


def manual_slots() -> bool:
    """Whether the code is traced inside a `shard_map` already manual over `"slots"` (the
    runner's program over a mesh of several run and several slot devices): every device
    holds its runs whole, and the slot split is written out by hand (`shard_slots`)."""
    return SLOT_AXIS in jax.sharding.get_abstract_mesh().manual_axes


def _own_block(fn: Callable[..., Any], replicated: Sequence[Any], padded: Any, block: int) -> Any:
    """`fn` on this device's block of `block` slots of the `padded` per-slot leaves (held
    whole by every device), the outputs of every device's block gathered back into `[S']`:
    `shard_slots` inside a manual `"slots"` axis, with no nested `shard_map` (whose
    closed-over values would mix the two manual contexts)."""
    start = jax.lax.axis_index(SLOT_AXIS) * block
    own = jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, start, block), padded)
    out = fn(*replicated, *own)
    return jax.tree.map(lambda a: jax.lax.all_gather(a, SLOT_AXIS, tiled=True), out)


def _slot_spec(leaf: Any, num_slots: int, shards: int) -> P:
    shape = np.shape(leaf)
    if len(shape) >= 1 and shape[0] == num_slots and num_slots % shards == 0:
        return P(SLOT_AXIS)
    return P()


def put_slots(tree: Any, num_slots: int, shards: int | None = None) -> Any:
    """Place `tree` for a run over `shards` devices (host side, before the jitted rounds).

    Leaves with leading axis `[S]` are split over the devices when S is a multiple of the
    shard count (each device keeps its own block of slots); every other leaf, and every leaf
    when S is not a multiple, is replicated on all of them. A no-op for one shard.
    """
    shards = resolve_shards(shards, num_slots)
    if shards == 1:
        return tree
    mesh = slot_mesh(shards)
    return jax.tree.map(
        lambda a: _place(a, NamedSharding(mesh, _slot_spec(a, num_slots, shards))), tree
    )


def replicate(tree: Any, num_slots: int, shards: int | None = None) -> Any:
    """Place every leaf of `tree` on all the devices of the slot mesh (data, contexts)."""
    shards = resolve_shards(shards, num_slots)
    if shards == 1:
        return tree
    sharding = NamedSharding(slot_mesh(shards), P())
    return jax.tree.map(lambda a: _place(a, sharding), tree)


def whole_on_slots(tree: Any, shards: int) -> Any:
    """Inside a jitted function: every leaf whole on every device of the slot mesh (before a
    gather across slots); a no-op for one shard or inside a manual slot axis."""
    if shards == 1 or manual_slots():
        return tree
    everywhere = NamedSharding(slot_mesh(shards), P())
    return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, everywhere), tree)


def constrain_slots(tree: Any, num_slots: int, shards: int | None = None) -> Any:
    """Inside a jitted function: the placement of `put_slots`, so a program's state comes
    out where it went in (one compile for every round)."""
    shards = resolve_shards(shards, num_slots)
    if shards == 1 or manual_slots():
        return tree
    mesh = slot_mesh(shards)
    return jax.tree.map(
        lambda a: jax.lax.with_sharding_constraint(
            a, NamedSharding(mesh, _slot_spec(a, num_slots, shards))
        ),
        tree,
    )
