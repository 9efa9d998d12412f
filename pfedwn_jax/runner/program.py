"""The compiled unit: up to `kmax` rounds of one method for `R` runs at once, on a mesh.

`block(state, ctx, evals, hp, round_root, start, n)` scans `round_step` over rounds `start ..
start + n - 1` of one run (round `r`'s key `fold_in(round_root, r)`); `n <= kmax` is an
argument, so one compiled program runs blocks of any length (the driver adapts it to the
progress it shows) and the rounds past `n` are skipped (`lax.cond`, no work). `vmap` makes it
a program over a leading run axis of every argument (shared leaves broadcast), `jit` compiles
it once per method and shape group. The mesh has two axes, `("runs", "slots")`: with more
than one device on `"runs"` every device computes its own runs (`shard_map`); with more than
one on `"slots"` a run's slots are split over them (`engine.sharding`). A single run is the
same program with one run. The host sees the device once per block: `RoundOut [R, kmax, ...]`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pfedwn_jax.algorithms import Algorithm
from pfedwn_jax.distributed import from_host
from pfedwn_jax.runner.step import RoundOut, init_state, round_step, zeros_like_out

RUNS, SLOTS = "runs", "slots"
#: Records every round keeps (`records="all"`: every record the round produces).
ALL = "all"
#: XLA options of the programs on a CPU mesh. LLVM at -O2 instead of XLA's default -O3:
#: the same bits out (checked on every method, MLP and CNN), rounds as fast, and 4x less
#: compiling for the model initialiser (1.07 -> 0.26 s for 16 MLPs), ~10% less for a block.
CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 2}


def _jit(fn: Any, mesh: Mesh, **kw: Any) -> Any:
    """`jax.jit(fn, **kw)` with the compiler options of `mesh`'s platform."""
    cpu = mesh.devices.flat[0].platform == "cpu"
    return jax.jit(fn, compiler_options=CPU_COMPILER_OPTIONS if cpu else None, **kw)


def check_mesh(mesh: Any) -> Mesh:
    """`mesh` if it is a `Mesh` with axes ("runs", "slots"); a ValueError otherwise."""
    if not isinstance(mesh, Mesh) or tuple(mesh.axis_names) != (RUNS, SLOTS):
        axes = getattr(mesh, "axis_names", type(mesh).__name__)
        raise ValueError(f"mesh must be a jax Mesh with axes ('runs', 'slots'); got {axes}")
    return mesh


def _select(out: RoundOut, records: Any) -> RoundOut:
    """`out` with the records a program keeps: all, or those named in `records`."""
    if records == ALL:
        return out
    return out.replace(records={k: v for k, v in out.records.items() if k in records})


def _block(alg: Algorithm, kmax: int, records: Any, state, ctx, evals, hp, root, start, n):
    """One run: rounds `start ..` `start + n - 1` (`n <= kmax`); returns `(state, RoundOut
    [kmax, ...])`, rows past `n` zero."""
    root = jax.random.wrap_key_data(root)
    step = functools.partial(_round, alg, records, hp, ctx=ctx, evals=evals)
    idle_out = zeros_like_out(jax.eval_shape(step, state, jax.random.fold_in(root, 0))[1])

    def body(state, i):
        live = lambda s: step(s, jax.random.fold_in(root, start + i))
        return jax.lax.cond(i < n, live, lambda s: (s, idle_out), state)

    return jax.lax.scan(body, state, jnp.arange(kmax, dtype=jnp.int32))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _round(alg, records, hp, state, key, *, ctx, evals):
    """`round_step` with the kept records (jitted: its trace is reused by `_block`'s shape
    probe and its scan; inlined into the block's program)."""
    state, out = round_step(alg, hp, state, key, ctx, evals)
    return state, _select(out, records)


def _init_block(alg: Algorithm, hp, key_data, ctx, params):
    """One run's initial `RunState`, the model's initial `params` computed already."""
    key = jax.random.wrap_key_data(key_data)
    return init_state(alg, hp, key, ctx.replace(init_params=params))


def _model_init(model: Any, key_data: jax.Array) -> Any:
    return model.init(jax.random.wrap_key_data(key_data))


def _single(fn: Any, in_axes: tuple, out_axes: Any) -> Any:
    """`vmap(fn, in_axes, out_axes)` for a run axis of size one."""

    def each(f: Any, axes: Any, tree: Any) -> Any:
        axes = jax.tree.broadcast(axes, tree, is_leaf=is_none)
        return jax.tree.map(lambda ax, a: a if ax is None else f(a), axes, tree, is_leaf=is_none)

    def one(*args: Any) -> Any:
        out = fn(*(each(lambda a: a[0], ax, a) for ax, a in zip(in_axes, args, strict=True)))
        return each(lambda o: o[None], out_axes, out)

    return one


def _specs(axes: Any) -> Any:
    """`shard_map` specs of `vmap` axes: run-axis leaves split over `"runs"`, others whole."""
    return jax.tree.map(lambda ax: P() if ax is None else P(RUNS), axes, is_leaf=is_none)


def is_none(x: Any) -> bool:
    return x is None


def _sharded(fn: Any, in_axes: tuple, out_axes: Any, mesh: Mesh, runs: int) -> Any:
    """`fn` over the run axis of `runs` runs: `vmap`, under `shard_map` over `"runs"` when it
    has several devices (each device runs its own runs as a local program: nothing inside a
    round, such as the engine's per-slot loops, is left to the SPMD partitioner, which would
    gather their operands). One run: `fn` itself on the run's slice (a `vmap` of size one,
    without the batching: the slots split over `"slots"` exactly as the engine places them)."""
    if runs == 1:
        return _single(fn, in_axes, out_axes)
    vmapped = jax.vmap(fn, in_axes=in_axes, out_axes=out_axes)
    if mesh.shape[RUNS] == 1:
        return vmapped
    # manual over both axes: with several slot devices each holds its runs whole and the
    # engine splits the slots by hand (`engine.sharding.manual_slots`)
    return jax.shard_map(
        vmapped,
        mesh=mesh,
        in_specs=_specs(in_axes),
        out_specs=_specs(out_axes),
        check_vma=False,
    )


@functools.lru_cache(maxsize=64)
def block_program(
    alg: Algorithm, kmax: int, records: Any, axes_key: AxesKey, mesh: Mesh, runs: int, slots: int
):
    """The jitted, run-vmapped block of `runs` runs of `slots` slots (cached per method, block
    capacity, kept records, which leaves are per run (`axes_key` of `(state, ctx, evals, hp)`
    axes, `AxesKey`), mesh and shape). Call it as `(state, ctx, evals, hp, round_roots, start,
    n)`; the state comes out placed as it went in (`place`)."""
    state_axes, ctx_axes, evals_axes, hp_axes = axes_key.axes
    fn = functools.partial(_block, alg, kmax, records)
    in_axes = (state_axes, ctx_axes, evals_axes, hp_axes, 0, None, None)
    local = _sharded(fn, in_axes, (state_axes, 0), mesh, runs)

    def placed(*args: Any) -> Any:
        state, out = local(*args)
        axes = jax.tree.broadcast(state_axes, state, is_leaf=is_none)
        keep = lambda ax, a: jax.lax.with_sharding_constraint(a, sharding(ax, a, mesh, slots))
        return jax.tree.map(keep, axes, state, is_leaf=is_none), out

    return _jit(placed, mesh, donate_argnums=0)


def _eval_params(alg: Algorithm, state, ctx, hp):
    """One run's personalised models `[S, ...]` (what its slots are evaluated with)."""
    return alg.eval_params(state.alg, ctx, hp)


@functools.lru_cache(maxsize=64)
def params_program(alg: Algorithm, axes_key: AxesKey, mesh: Mesh, runs: int, slots: int):
    """The jitted, run-vmapped `alg.eval_params`: `(state, ctx, hp) -> params [R, S, ...]`,
    placed like the state (runs over `"runs"`, slots over `"slots"`): the models a run
    keeps (`save_models`), computed where the state lives, nothing gathered."""
    state_axes, ctx_axes, _, hp_axes = axes_key.axes
    fn = functools.partial(_eval_params, alg)
    local = _sharded(fn, (state_axes, ctx_axes, hp_axes), 0, mesh, runs)

    def placed(*args: Any) -> Any:
        keep = lambda a: jax.lax.with_sharding_constraint(a, sharding(0, a, mesh, slots))
        return jax.tree.map(keep, local(*args))

    return _jit(placed, mesh)


@functools.lru_cache(maxsize=64)
def init_program(alg: Algorithm, axes_key: AxesKey, mesh: Mesh, runs: int):
    """The jitted, run-vmapped `init_state` of `alg`: `(hp, init_keys, ctx, params) ->
    state`, every leaf with the run axis (`params`: `model_init_program`'s)."""
    _, ctx_axes, _, hp_axes = axes_key.axes
    fn = functools.partial(_init_block, alg)
    return _jit(_sharded(fn, (hp_axes, 0, ctx_axes, 0), 0, mesh, runs), mesh)


@functools.lru_cache(maxsize=16)
def model_init_program(model: Any, mesh: Mesh, runs: int):
    """The jitted, run-vmapped `model.init`: `init_keys [R, 2] -> params [R, ...]`, the one
    initial model of each run that every method starts from (compiled once per model)."""
    return _jit(_sharded(functools.partial(_model_init, model), (0,), 0, mesh, runs), mesh)


class AxesKey:
    """A hashable wrapper of a tuple of `vmap` axes trees (leaves 0 or None)."""

    def __init__(self, *axes: Any) -> None:
        self.axes = axes
        flat = [jax.tree.flatten(a, is_leaf=is_none) for a in axes]
        self._key = tuple((tuple(leaves), treedef) for leaves, treedef in flat)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AxesKey) and self._key == other._key


def state_axes(state: Any) -> Any:
    """`vmap` axes of a run-stacked state: 0, but None for the integer scalars the runs share
    (round counters: the runs of a program advance in lockstep). Kept unbatched, a counter
    keeps `lax.cond` on it a branch (pFedWN's EM round) instead of a select that would run
    both branches every round."""
    return jax.tree.map(lambda a: None if jnp.ndim(a) == 0 else 0, state)


def share_counters(state: Any) -> Any:
    """A run-stacked state whose integer `[R]` leaves (round counters, equal in every run at
    any round) become one shared scalar (`state_axes` None)."""

    def one(a: Any) -> Any:
        if a.ndim != 1 or not jnp.issubdtype(a.dtype, jnp.integer):
            return a
        if isinstance(a, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct((), a.dtype, weak_type=a.weak_type)
        return a[0]

    return jax.tree.map(one, state)


def place(tree: Any, axes: Any, mesh: Mesh, num_slots: int | None = None) -> Any:
    """Put a run-stacked tree on `mesh`: run-axis leaves split over `"runs"` (and, with
    `num_slots` and several devices on `"slots"`, a slot axis after it over `"slots"`), shared
    leaves replicated. A leaf with run axis must have a multiple of the mesh's run size.

    A mesh over several processes: every process passes the same host tree (each sets up every
    run) and copies only its own devices' rows (`distributed.from_host`, no communication); a
    device array is resharded where it is."""

    def put(ax: Any, a: Any) -> Any:
        if a is None:  # an unset optional field (momentum, links) shared by every run
            return None
        where = sharding(ax, a, mesh, num_slots)
        if not mesh.is_multi_process or isinstance(a, jax.Array):
            return jax.device_put(a, where)
        return from_host(np.asarray(a), where)

    return jax.tree.map(put, axes, tree, is_leaf=is_none)


def sharding(ax: Any, a: Any, mesh: Mesh, num_slots: int | None) -> NamedSharding:
    """Where a run-stacked leaf `a` (`vmap` axis `ax`) lives: split over `"runs"` (with a run
    axis and several run devices) and, where its axis after the run axis has `num_slots`
    entries and several slot devices, over `"slots"`. A mesh of one run device is the engine's
    own slot mesh (`engine.sharding.slot_mesh`: the same devices, axis `"slots"` alone)."""
    slots, runs = mesh.shape[SLOTS], mesh.shape[RUNS]
    if runs == 1:
        mesh = Mesh(mesh.devices.reshape(-1), (SLOTS,))
    if ax is None:
        return NamedSharding(mesh, P())
    run = RUNS if runs > 1 else None
    # several run devices: a run lives whole on each of its row's slot devices
    split = slots > 1 and runs == 1 and num_slots is not None and np.ndim(a) > 1
    if split and a.shape[1] == num_slots and num_slots % slots == 0:
        return NamedSharding(mesh, P(run, SLOTS))
    return NamedSharding(mesh, P(run))
