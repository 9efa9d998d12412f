"""Many runs as few compiled programs: group, pad, stack, then scan blocks of rounds.

`run_configs(configs)` runs every method of every config. Runs are set up on the host one by
one (`runner.setup`: data, federation, context), grouped by `batch.program_key` (what fixes
the program), padded and stacked (`batch`), and each method of a group is one compiled
program over all its runs (`program.block_program`) called once per block of rounds. Each
run computes what `pfedwn_jax.run(config)` computes (up to float reassociation).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from pfedwn_jax.algorithms import get_algorithm, hparam_values, static_hparams
from pfedwn_jax.distributed import gather_to_host
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.runner import Experiment, setup
from pfedwn_jax.sweeps import memory
from pfedwn_jax.sweeps.batch import Shapes, pad_context, program_key, stack_runs
from pfedwn_jax.sweeps.program import (
    RUNS,
    axes_key,
    block_program,
    default_mesh,
    place,
    state_axes,
)

#: Rounds per block by default: the host sees the device every ~10 rounds (progress, saves).
DEFAULT_BLOCK = 10

# on_block(method, run_ids, rounds_done, state): after each block (checkpoints)
BlockHook = Callable[[str, tuple[int, ...], int, Any], None]


@dataclasses.dataclass(eq=False)
class Group:
    """Runs that share a program: their experiments, padded and stacked contexts."""

    ids: tuple[int, ...]  # indices into the sweep's runs (padding runs repeat the last)
    real: int  # the first `real` entries of `ids` are real runs
    exps: list[Experiment]
    shapes: Shapes
    ctx: Any  # stacked RoundContext
    ctx_axes: Any
    test: Any
    test_axes: Any
    round_roots: jax.Array  # [R] keys


def block_sizes(rounds: int, block: int | None) -> list[int]:
    """Rounds of each block: equal blocks of at most `block` (default `DEFAULT_BLOCK`)
    rounds, the last one shorter when `rounds` is not a multiple."""
    block = DEFAULT_BLOCK if block is None else block
    k = math.ceil(rounds / math.ceil(rounds / block))
    return [min(k, rounds - lo) for lo in range(0, rounds, k)]


def make_groups(
    exps: Sequence[Experiment], mesh: Mesh, *, max_runs: int | None = None
) -> list[Group]:
    """Group runs by `run_key`, then split each group into programs of at most `max_runs`
    runs (None: as many as the memory plan fits, `runs_that_fit`), a multiple of the mesh's
    run axis; each program is padded to such a multiple by repeating its last run."""
    by_key: dict[tuple, list[int]] = {}
    for i, e in enumerate(exps):
        by_key.setdefault(run_key(e), []).append(i)
    per_device = mesh.shape[RUNS]
    groups = []
    for ids in by_key.values():
        if max_runs is None:
            size = runs_that_fit([exps[i] for i in ids], per_device)
        else:
            size = per_device * max(1, math.ceil(max_runs / per_device))
        for lo in range(0, len(ids), size):
            groups.append(_make_group(ids[lo : lo + size], exps, mesh))
    return groups


def runs_that_fit(members: Sequence[Experiment], devices: int) -> int:
    """Runs per program the memory plan allows (`memory.plan`, the most demanding method);
    a `ValueError` saying what to reduce when not even one run fits."""
    e = members[0]
    shared = len({id(m.data) for m in members}) == 1
    ests = [
        memory.estimate(e.ctx, e.test, name, e.config.hparams_for(name), shared_data=shared)
        for name in e.config.method_names
    ]
    worst = max(ests, key=lambda est: est.total(len(members)))
    budget = memory.available_bytes()
    if jax.process_count() > 1:  # every process must plan the same programs: the tightest
        budget = int(np.min(multihost_utils.process_allgather(np.float32(budget))))  # x64 off
    return memory.plan(len(members), worst, devices=devices, budget=budget)


def run_key(exp: Experiment) -> tuple:
    """Runs with equal keys share programs: `program_key` plus every method's static
    hyperparameters."""
    c = exp.config
    return program_key(exp) + tuple(static_hparams(c.hparams_for(m)) for m in c.method_names)


def _make_group(ids: list[int], exps: Sequence[Experiment], mesh: Mesh) -> Group:
    """One group: padded to a multiple of the run axis, contexts padded, stacked, placed."""
    real = len(ids)
    ids = ids + [ids[-1]] * (-real % mesh.shape[RUNS])
    members = [exps[i] for i in ids]
    shapes = Shapes(members)
    padded = [pad_context(e, shapes) for e in members]
    ctx, ctx_axes = stack_runs([p[0] for p in padded])
    test, test_axes = stack_runs([p[1] for p in padded])
    roots = jax.numpy.stack([e.round_root for e in members])
    return Group(
        tuple(ids),
        real,
        members,
        shapes,
        place(ctx, ctx_axes, mesh),
        ctx_axes,
        place(test, test_axes, mesh),
        test_axes,
        place(roots, 0, mesh),
    )


def _stacked(
    trees: Sequence[Any], mesh: Mesh, *, pad_ragged: bool = False, share_counters: bool = False
) -> Any:
    """Per-run trees stacked along the run axis (every run evolves its own), placed.

    `share_counters`: an integer scalar leaf equal in every run (a round counter) stays one
    unstacked scalar (`program.state_axes`)."""
    tree, axes = stack_runs(trees, pad_ragged=pad_ragged)

    def counter(a: Any) -> bool:
        return share_counters and a.ndim == 0 and jax.numpy.issubdtype(a.dtype, jax.numpy.integer)

    tree = jax.tree.map(
        lambda ax, a: (
            jax.numpy.broadcast_to(a, (len(trees), *a.shape))
            if ax is None and not counter(a)
            else a
        ),
        axes,
        tree,
        is_leaf=lambda x: x is None,
    )
    return place(tree, state_axes(tree) if share_counters else 0, mesh)


def init_states(group: Group, name: str, mesh: Mesh) -> Any:
    """Every run's initial state of method `name` (padded contexts), stacked and placed."""
    alg = get_algorithm(name)
    states = []
    for r, e in enumerate(group.exps):
        hp = e.config.hparams_for(name)
        states.append(alg.init(e.init_key, _run_context(group, r), hp))
    return _stacked(states, mesh, pad_ragged=True, share_counters=True)


def _run_context(group: Group, r: int) -> Any:
    """Run `r`'s padded context, padded again on the host rather than sliced from the placed
    stack: a slice of an array split over devices is a collective program, and dispatching
    one per run without waiting can fill the CPU client's thread pool with collectives each
    waiting for a device that gets no thread (XLA aborts after 40 s); on a mesh over several
    processes run `r`'s rows live on one process only."""
    return pad_context(group.exps[r], group.shapes)[0]


def run_method(
    group: Group,
    name: str,
    mesh: Mesh,
    sizes: Sequence[int],
    on_block: Callable[[int, int, dict[str, np.ndarray], Any], None],
    *,
    state: Any = None,
    start: int = 0,
) -> None:
    """Rounds `start ..` of method `name` for the runs of `group`, block by block.

    `state`: the stacked state after `start` rounds (a checkpoint's), or None to start from
    round 0. After each block, `on_block(rounds_done, k, metrics, state)` gets the block's
    host metrics (`accuracy`, `loss`, `finite`, each `[R, k, S]`) and the state.
    """
    alg = get_algorithm(name)
    hps = [e.config.hparams_for(name) for e in group.exps]
    hvalues = _stacked([hparam_values(hp) for hp in hps], mesh)
    if state is None:
        state = init_states(group, name, mesh)
    done = 0
    for k in sizes:
        if done + k <= start:
            done += k
            continue
        program = block_program(
            alg,
            static_hparams(hps[0]),
            k,
            axes_key(group.ctx_axes, group.test_axes),
            axes_key(state_axes(state), None),
            mesh,
        )
        state, metrics = program(
            state, group.ctx, group.test, hvalues, group.round_roots, np.int32(done)
        )
        done += k
        on_block(done, k, gather_to_host(metrics), state)


def setup_all(configs: Sequence[ExperimentConfig]) -> tuple[list[Experiment], float]:
    """Every run's host-side setup (validation first: a bad run fails before any compile)."""
    t0 = time.perf_counter()
    return [setup(c, shards=1) for c in configs], time.perf_counter() - t0


def check_mesh(mesh: Mesh | None) -> Mesh:
    """The mesh of the sweep: `default_mesh()` or a user's with axes ("runs", "slots")."""
    if mesh is None:
        return default_mesh()
    if tuple(mesh.axis_names) != (RUNS, "slots"):
        raise ValueError(f"mesh axes must be ('runs', 'slots'); got {mesh.axis_names}")
    if mesh.shape["slots"] != 1:
        raise ValueError(
            f"a sweep splits runs, not slots, over devices: mesh 'slots' must be 1; "
            f"got {mesh.shape['slots']}"
        )
    return mesh


#: Columns of the tidy table besides the run labels (see `SweepResult`).
METRIC_COLUMNS = ("target_accuracy", "target_loss", "mean_client_accuracy", "diverged")


class Table:
    """The tidy table under construction: one row per run x method x round."""

    def __init__(self, labels: Sequence[dict[str, Any]]) -> None:
        self.labels = list(labels)
        self.rows: list[dict[str, Any]] = []
        self.diverged: dict[tuple[int, str], int] = {}  # (run, method) -> first diverged round

    def add_block(
        self, group: Group, name: str, done: int, k: int, metrics: dict[str, np.ndarray]
    ) -> None:
        """The rows of rounds `done - k + 1 .. done` of the group's real runs."""
        for r in range(group.real):
            run, fed = group.ids[r], group.exps[r].federation
            s, target = fed.num_slots, np.asarray(fed.is_target, bool)
            for j in range(k):
                rnd = done - k + j + 1
                acc = np.asarray(metrics["accuracy"][r, j, :s], np.float64)
                loss = np.asarray(metrics["loss"][r, j, :s], np.float64)
                if not metrics["finite"][r, j, :s].all():
                    self.diverged.setdefault((run, name), rnd)
                row = {
                    "run": run,
                    **self.labels[run],
                    "method": name,
                    "round": rnd,
                    "target_accuracy": float(acc[target].mean()),
                    "target_loss": float(loss[target].mean()),
                    "mean_client_accuracy": float(acc.mean()),
                    "diverged": (run, name) in self.diverged,
                }
                if "val_accuracy" in metrics:
                    val = np.asarray(metrics["val_accuracy"][r, j, :s], np.float64)
                    row["target_val_accuracy"] = float(val[target].mean())
                self.rows.append(row)

    def columns(self) -> dict[str, np.ndarray]:
        """Columnar form, rows sorted by (run, method order, round)."""
        if not self.rows:
            return {}
        keys = dict.fromkeys(k for row in self.rows for k in row)  # a run without val: NaN
        return {k: np.asarray([row.get(k, np.nan) for row in self.rows]) for k in keys}
