"""Runs grouped into programs: what shares a compiled program, how many runs fit, placement.

Runs share a program when `run_key` is equal (`batch.program_key`: model, data shapes, the
schedule, the link model; plus the methods run and each one's static hyperparameters). A
group is split into programs of as many runs as the memory plan fits (`runner.memory`), a
multiple of the mesh's run axis, each padded to it by repeating its last run; its contexts
are padded to common shapes, stacked along a run axis (shared leaves kept once) and placed
on the mesh.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from pfedwn_jax.algorithms import get_algorithm, hparam_leaves, static_hparams
from pfedwn_jax.experiment.setup import Experiment
from pfedwn_jax.runner import memory
from pfedwn_jax.runner.batch import Shapes, pad_context, program_key, stack_data, stack_runs
from pfedwn_jax.runner.program import (
    RUNS,
    SLOTS,
    AxesKey,
    init_program,
    is_none,
    model_init_program,
    place,
    sharding,
    share_counters,
)
from pfedwn_jax.runner.program import state_axes as counter_axes


@dataclasses.dataclass(eq=False)
class Group:
    """Runs that share a program, padded, stacked and placed.

    Attributes:
      ids: indices of the job's runs (padding runs repeat the last); `real` of them are real.
      exps: the experiments of `ids`.
      shapes: the group's common shapes.
      ctx, ctx_axes: the stacked, placed `RoundContext` and its `vmap` axes.
      evals, evals_axes: `(test, val)` stacked and placed, and their axes.
      init_keys, round_roots: `[R, 2]` key data, placed.
      init_params: each run's initial model `[R, ...]` (`model_init_program`), once computed.
    """

    ids: tuple[int, ...]
    real: int
    exps: list[Experiment]
    shapes: Shapes
    ctx: Any
    ctx_axes: Any
    evals: Any
    evals_axes: Any
    init_keys: Any
    round_roots: Any
    init_params: Any = None

    @property
    def real_ids(self) -> tuple[int, ...]:
        return self.ids[: self.real]


def run_key(exp: Experiment) -> tuple:
    """Runs with equal keys share programs: `program_key` plus the methods run and each
    one's static hyperparameters."""
    c = exp.config
    return program_key(exp) + tuple((m, static_hparams(c.hparams_for(m))) for m in c.method_names)


def plan_programs(
    exps: Sequence[Experiment], mesh: Mesh, *, max_runs: int | None = None
) -> list[list[int]]:
    """The real runs of each program: runs grouped by `run_key`, each group split into
    programs of at most `max_runs` runs (None: as many as the memory plan fits, `runs_that_fit`),
    a multiple of the mesh's run axis."""
    by_key: dict[tuple, list[int]] = {}
    for i, e in enumerate(exps):
        by_key.setdefault(run_key(e), []).append(i)
    per_device = mesh.shape[RUNS]
    programs = []
    for ids in by_key.values():
        worst, budget = _plan_inputs([exps[i] for i in ids])
        if max_runs is None:  # as many as fit; a ValueError when not one does
            size = memory.plan(len(ids), worst, devices=per_device, budget=budget)
        else:
            size = per_device * max(1, math.ceil(max_runs / per_device))
            memory.check_fits(worst, budget, runs=math.ceil(min(size, len(ids)) / per_device))
        programs += [ids[lo : lo + size] for lo in range(0, len(ids), size)]
    return programs


def _plan_inputs(members: Sequence[Experiment]) -> tuple[memory.MemoryEstimate, int]:
    """`(estimate, budget)`: one run's memory plan of the most demanding method, and the free
    bytes of a device (over several processes the tightest: all must plan alike)."""
    e = members[0]
    shared = len({id(m.data) for m in members}) == 1
    ests = [
        memory.estimate(e.ctx, e.test, name, e.config.hparams_for(name), shared_data=shared)
        for name in e.config.method_names
    ]
    worst = max(ests, key=lambda est: est.total(len(members)))
    budget = memory.available_bytes()
    if jax.process_count() > 1:
        budget = int(np.min(multihost_utils.process_allgather(np.float32(budget))))  # x64 off
    return worst, budget


def make_group(ids: Sequence[int], exps: Sequence[Experiment], mesh: Mesh) -> Group:
    """One program's group: padded to a multiple of the run axis, contexts padded, stacked,
    placed (slots of a run split over the mesh's `"slots"` axis)."""
    real = len(ids)
    ids = list(ids) + [ids[-1]] * (-real % mesh.shape[RUNS])
    members = [exps[i] for i in ids]
    shapes = Shapes(members)
    ctx, ctx_axes = stack_runs([pad_context(e, shapes).replace(shards=mesh.shape[SLOTS])
                                for e in members])  # fmt: skip
    splits = [
        stack_data([getattr(e.data, split) for e in members], shapes.clients, samples)
        for split, samples in (("train", shapes.train), ("test", shapes.test), ("val", shapes.val))
    ]
    ctx, ctx_axes = ctx.replace(train=splits[0][0]), ctx_axes.replace(train=splits[0][1])
    evals, evals_axes = (splits[1][0], splits[2][0]), (splits[1][1], splits[2][1])
    keys = [np.stack([getattr(e, k) for e in members]) for k in ("init_key", "round_root")]
    return Group(
        tuple(ids),
        real,
        members,
        shapes,
        place(ctx, ctx_axes, mesh),
        ctx_axes,
        place(evals, evals_axes, mesh),
        evals_axes,
        *(place(k, 0, mesh) for k in keys),
    )


def stacked_hparams(group: Group, name: str, mesh: Mesh) -> tuple[Any, Any]:
    """`(hp, axes)`: the runs' hyperparameters of method `name`, stacked (leaves equal in
    every run kept once) and placed. A single run's stay uncommitted scalars: a loss that
    closes over one inside the engine's slot `shard_map` must not carry the mesh in its
    type (its constant would clash with the manual axis there)."""
    hps = [hparam_leaves(e.config.hparams_for(name)) for e in group.exps]
    hp, axes = stack_runs(hps)
    if len(group.ids) == 1:
        return jax.tree.map(jax.numpy.asarray, hp), axes
    return place(hp, axes, mesh), axes


def axes_key(group: Group, state: Any, hp_axes: Any) -> AxesKey:
    """The `AxesKey` of a group's program for a state like `state` (run-stacked)."""
    return AxesKey(counter_axes(state), group.ctx_axes, group.evals_axes, hp_axes)


def _init_inputs(group: Group, name: str, mesh: Mesh) -> tuple[Any, tuple, tuple[Any, Any]]:
    """`(program, args, (hp, hp_axes))`: the initial state of method `name` is
    `program(*args)` (the group's initial models computed first, once for every method)."""
    alg = get_algorithm(name)
    hp, hp_axes = stacked_hparams(group, name, mesh)
    key = AxesKey(None, group.ctx_axes, group.evals_axes, hp_axes)
    runs = len(group.ids)
    if group.init_params is None:  # once per group: every method starts from these
        model = group.exps[0].ctx.model
        group.init_params = model_init_program(model, mesh, runs)(group.init_keys)
    program = init_program(alg, key, mesh, runs)
    return program, (hp, group.init_keys, group.ctx, group.init_params), (hp, hp_axes)


def init_states(group: Group, name: str, mesh: Mesh) -> tuple[Any, Any]:
    """`(state, (hp, hp_axes))`: every run's initial `RunState` of method `name` (one
    vmapped program), round counters shared, placed (slots split over `"slots"`), and the
    runs' stacked hyperparameters."""
    program, args, hp = _init_inputs(group, name, mesh)
    state = share_counters(program(*args))
    state = place(state, counter_axes(state), mesh, group.shapes.slots)
    return state, hp


def state_shapes(group: Group, name: str, mesh: Mesh) -> tuple[Any, Any]:
    """`init_states` as shapes: the state's `ShapeDtypeStruct`s with the shardings
    `init_states` places it on (nothing computed or allocated), to compile its program
    ahead (`runner.ahead`)."""
    program, args, hp = _init_inputs(group, name, mesh)
    state = share_counters(jax.eval_shape(program, *args))

    def spec(ax: Any, a: Any) -> Any:
        if a is None:
            return None
        where = sharding(ax, a, mesh, group.shapes.slots)
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=where, weak_type=a.weak_type)

    return jax.tree.map(spec, counter_axes(state), state, is_leaf=is_none), hp
