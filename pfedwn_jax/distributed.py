"""The run axis as a mesh axis: one global `("runs", "slots")` mesh over every process's devices.

A sweep keeps its state as one pytree whose leaves are `[runs, slots, ...]`; the leading axis is
split over the mesh axis `"runs"` (`NamedSharding(mesh, P("runs"))`) and, optionally, the
second over `"slots"`. On one host the mesh spans its devices; on several hosts each process
calls `initialize` first (`jax.distributed.initialize`), then builds the same global mesh from
`jax.devices()`, places the same global arrays (`shard_runs`) and runs the same jitted program.
XLA does the communication; there is no scheduler of our own. Results come back to every host
with `gather_to_host`, and only the writer (`is_writer`, process 0) writes files.

On several hosts (or several processes on one host, as `tests/test_distributed.py` does):

1. start the same script in every process with `JAX_COORDINATOR_ADDRESS=host0:PORT`,
   `JAX_NUM_PROCESSES=N`, `JAX_PROCESS_ID=i` (or pass them to `initialize`; SLURM, Open MPI
   and Cloud TPU are detected without them);
2. `initialize()` first, before any JAX computation;
3. `mesh = make_mesh(runs, slots)` over all processes' devices, `shard_runs(state, mesh)`,
   the jitted program, `state_store.save` / `restore` to a directory every host can reach;
4. `gather_to_host(results)` in every process; write files only where `is_writer()`.

Every function that touches arrays of several processes (`shard_runs`, `gather_to_host`) is a
collective: every process must call it, in the same order, with the same shapes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pfedwn_jax._checks import check_int

RUN_AXIS = "runs"
SLOT_AXIS = "slots"
# read by `initialize` when an argument is None (JAX itself reads only the first)
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"

_initialized_with: tuple[str | None, int | None, int | None] | None = None


# --------------------------------------------------------------------------- processes
def _env_int(name: str) -> int | None:
    """The integer in environment variable `name` (None when unset or empty)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer; got {text!r}") from None


def _resolve(
    coordinator: str | None, num_processes: int | None, process_id: int | None
) -> tuple[str | None, int | None, int | None]:
    """Arguments, else the environment (`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`,
    `JAX_PROCESS_ID`); checked for consistency. All None: leave it to JAX's cluster detection."""
    coordinator = coordinator or os.environ.get(ENV_COORDINATOR) or None
    num = _env_int(ENV_NUM_PROCESSES) if num_processes is None else num_processes
    pid = _env_int(ENV_PROCESS_ID) if process_id is None else process_id
    given = {"coordinator": coordinator, "num_processes": num, "process_id": pid}
    if all(v is None for v in given.values()):
        return None, None, None
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise ValueError(
            f"initialize needs coordinator, num_processes and process_id together (arguments "
            f"or {ENV_COORDINATOR}, {ENV_NUM_PROCESSES}, {ENV_PROCESS_ID}); missing {missing}"
        )
    num = check_int("num_processes", num, 1)
    pid = check_int("process_id", pid, 0)
    if pid >= num:
        raise ValueError(f"process_id must be in [0, {num - 1}] for num_processes={num}; got {pid}")
    host, sep, port = str(coordinator).rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(
            f"coordinator must be 'HOST:PORT' (e.g. 'localhost:1234'); got {coordinator!r}"
        )
    return str(coordinator), num, pid


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
    """Join this process to a multi-process JAX job (`jax.distributed.initialize`).

    Call it first, before any JAX computation, in every process. Arguments left None are read
    from `JAX_COORDINATOR_ADDRESS` ("host:port" of process 0), `JAX_NUM_PROCESSES` and
    `JAX_PROCESS_ID`; with none of the three set anywhere JAX detects the cluster (SLURM, Open
    MPI, Cloud TPU, ...). On CPUs the cross-process collectives use gloo. Calling it again with
    the same settings does nothing; with other settings it raises a `ValueError`.
    """
    global _initialized_with
    wanted = _resolve(coordinator, num_processes, process_id)
    if _initialized_with is not None or jax.distributed.is_initialized():
        if _initialized_with is not None and wanted not in (_initialized_with, (None,) * 3):
            raise ValueError(
                f"jax.distributed is already initialized with (coordinator, num_processes, "
                f"process_id) = {_initialized_with}; cannot re-initialize with {wanted}"
            )
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(*wanted)
    except ValueError as e:
        if wanted != (None,) * 3:
            raise
        raise ValueError(
            f"initialize: no cluster detected ({e}); pass coordinator, num_processes and "
            f"process_id, or set {ENV_COORDINATOR}, {ENV_NUM_PROCESSES}, {ENV_PROCESS_ID}"
        ) from None
    _initialized_with = wanted


def is_writer() -> bool:
    """True in the process that writes results and logs (process 0); the others compute only."""
    return jax.process_index() == 0


# --------------------------------------------------------------------------- mesh
def make_mesh(
    runs: int | None = None, slots: int = 1, devices: Sequence[Any] | None = None
) -> Mesh:
    """A `runs x slots` mesh with axes `("runs", "slots")` over `devices` (default: every
    device of every process, `jax.devices()`, in JAX's order, so each process's devices are
    contiguous and a process holds whole blocks of runs).

    `runs=None`: all devices / `slots`. Raises a `ValueError` naming the numbers unless
    `runs * slots` equals the device count.
    """
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("make_mesh needs at least one device; got an empty device list")
    slots = check_int("slots", slots, 1)
    count = len(devices)
    if runs is None:
        if count % slots:
            raise ValueError(
                f"slots={slots} does not divide the {count} device(s); allowed: a divisor of "
                f"{count}"
            )
        runs = count // slots
    runs = check_int("runs", runs, 1)
    if runs * slots != count:
        raise ValueError(
            f"mesh runs={runs} x slots={slots} = {runs * slots} devices, but there are {count}; "
            f"runs * slots must equal {count}"
        )
    return Mesh(np.asarray(devices, dtype=object).reshape(runs, slots), (RUN_AXIS, SLOT_AXIS))


def run_sharding(mesh: Mesh, shard_slots: bool = False) -> NamedSharding:
    """Sharding of a `[runs, ...]` leaf: axis 0 over `"runs"`, replicated over `"slots"`;
    `shard_slots=True`: `[runs, slots, ...]` with axis 1 over `"slots"` too."""
    return NamedSharding(mesh, P(RUN_AXIS, SLOT_AXIS) if shard_slots else P(RUN_AXIS))


def _check_divisible(tree: Any, mesh: Mesh, shard_slots: bool, runs: int | None) -> None:
    """`ValueError` naming the leaf whose sharded axes do not split evenly over the mesh."""
    for path, leaf in jax.tree.leaves_with_path(tree):
        shape = tuple(np.shape(leaf))
        name = jax.tree_util.keystr(path) or "the array"
        if len(shape) < 1 + shard_slots:
            raise ValueError(f"leaf {name} has shape {shape}; needs a leading [runs] axis")
        total = shape[0] if runs is None else runs
        checks = [(RUN_AXIS, total)] + ([(SLOT_AXIS, shape[1])] if shard_slots else [])
        for axis, size in checks:
            if size % mesh.shape[axis]:
                raise ValueError(
                    f"leaf {name}: {axis} axis of size {size} does not split over the mesh's "
                    f"{mesh.shape[axis]} {axis!r} devices; pad it to a multiple of "
                    f"{mesh.shape[axis]}"
                )


def local_runs(mesh: Mesh, runs: int) -> slice:
    """The runs `[start, stop)` whose rows this process holds under `run_sharding(mesh)`: the
    part it builds for `shard_runs(..., local=True)` (all runs on one process)."""
    runs = check_int("runs", runs, 1)
    index_map = run_sharding(mesh).addressable_devices_indices_map((runs,))
    held: set[int] = set()
    for idx in index_map.values():
        assert idx is not None  # an index per device of a sharded (not a fully replicated) array
        held.update(range(*idx[0].indices(runs)))
    rows = sorted(held)
    if rows != list(range(rows[0], rows[-1] + 1)):
        raise ValueError(f"this process's runs of {runs} are not one contiguous block: {rows}")
    start, stop = rows[0], rows[-1] + 1
    return slice(start, stop)


def shard_runs(
    tree: Any,
    mesh: Mesh,
    shard_slots: bool = False,
    *,
    local: bool = False,
    runs: int | None = None,
) -> Any:
    """Place a pytree of `[runs, ...]` leaves on `mesh` (`run_sharding`): global `jax.Array`s.

    `local=False`: every leaf is the whole `[runs, ...]` array, the same in every process (e.g.
    built from the same seeds); each process keeps only its devices' rows. `local=True`: every
    leaf is this process's rows `[local_runs(mesh, runs)]` only, and `runs` is the global count.
    Single process: a plain `jax.device_put`. Every process must call it (a collective).
    """
    if local and runs is None:
        raise ValueError("shard_runs(local=True) needs runs, the global number of runs")
    _check_divisible(tree, mesh, shard_slots, runs if local else None)
    sharding = run_sharding(mesh, shard_slots)
    if jax.process_count() == 1 and not local:
        return jax.device_put(tree, sharding)

    def place(leaf: Any) -> jax.Array:
        if local:
            host = np.asarray(leaf)
            shape = (runs, *host.shape[1:])
            return jax.make_array_from_process_local_data(sharding, host, shape)
        return from_host(leaf, sharding)

    return jax.tree.map(place, tree)


def from_host(leaf: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    """`leaf`, a host array with the same value in every process, as one global `jax.Array` on
    `sharding`: each process copies only its own devices' slices.

    No communication, unlike `jax.device_put` onto a sharding of several processes, which
    all-gathers the whole value from every process to check that they agree.
    """
    host = np.asarray(leaf)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: np.asarray(host[idx]))


def gather_to_host(tree: Any) -> Any:
    """Every leaf as a whole numpy array in every process (results to report or write).

    Arrays split over several processes are all-gathered (`multihost_utils.process_allgather`,
    one collective for all of them, so every process must call it); the others are copied.
    """
    leaves, treedef = jax.tree.flatten(tree)
    out: list[Any] = [None] * len(leaves)
    spread = []
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
            out[i] = np.asarray(leaf)
        elif leaf.is_fully_replicated:
            out[i] = np.asarray(leaf.addressable_data(0))
        else:
            spread.append(i)
    if spread:
        gathered = multihost_utils.process_allgather([leaves[i] for i in spread], tiled=True)
        for i, g in zip(spread, gathered, strict=True):
            out[i] = np.asarray(g)
    return jax.tree.unflatten(treedef, out)
