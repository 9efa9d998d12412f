"""`run_job(configs, labels, options)`: set every run up on the host, run them as one job.

A run is a sweep of one: every run is set up on the host (`experiment.setup`), then the one
driver (`execute`: programs, blocks, progress, checkpoints, divergence, writers) runs them on
a `("runs", "slots")` mesh and fills one table. A single run splits its slots over the
devices (`"slots"`); several runs split the runs. The front door (`pfedwn_jax.api`) turns
the table into a `Result` per run or one `SweepResult`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh

from pfedwn_jax.algorithms import get_algorithm
from pfedwn_jax.data.batching import clamp_notes_once
from pfedwn_jax.distributed import make_mesh
from pfedwn_jax.engine import resolve_shards
from pfedwn_jax.engine.sharding import slot_mesh
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.setup import Experiment, environment, setup
from pfedwn_jax.interrupts import interrupt_guard
from pfedwn_jax.results.table import Table
from pfedwn_jax.runner.checkpoint import Checkpoint, fingerprint, job_of
from pfedwn_jax.runner.execute import execute
from pfedwn_jax.runner.groups import axes_key, init_states, make_group
from pfedwn_jax.runner.options import Options, checked, mode
from pfedwn_jax.runner.program import RUNS, block_program, check_mesh


class Job(NamedTuple):
    """What a job leaves: each run's set-up, the filled table and the job's description
    (programs, timings with `setup_s`, environment)."""

    exps: list[Experiment]
    table: Table
    meta: dict[str, Any]


def run_job(
    configs: Sequence[ExperimentConfig], labels: Sequence[dict[str, Any]], options: Options
) -> Job:
    """Check `options`, set every run up, run them all (`run_experiments`). A bad option or
    run fails before anything compiles."""
    options = checked(options)
    exps, setup_s = setup_runs(configs)
    job = run_experiments(exps, labels, options)
    job.meta["timings"]["setup_s"] = setup_s
    return job


def run_experiments(
    exps: Sequence[Experiment], labels: Sequence[dict[str, Any]], options: Options
) -> Job:
    """Runs already set up, under a checkpoint (if any) and the interrupt guard; `options`
    as `checked` returns them."""
    mesh = default_mesh(exps, options.shards) if options.mesh is None else check_mesh(options.mesh)
    _check_same(exps)
    extra = {"records": options.records, "mesh_runs": mesh.shape[RUNS]}
    with interrupt_guard(), _open_checkpoint(options, exps, extra) as ck:
        table, meta = execute(exps, list(labels), mesh, options, ck)
    meta["environment"] = environment()
    meta["timings"].setdefault("setup_s", 0.0)
    return Job(list(exps), table, meta)


def default_mesh(exps: Sequence[Experiment], shards: int | None = None) -> Mesh:
    """One run: its slots over `resolve_shards(shards, S)` devices; several: every device on
    the run axis (slots unsplit)."""
    if len(exps) == 1:
        slots = resolve_shards(shards, exps[0].federation.num_slots)
        return make_mesh(1, slots, devices=list(slot_mesh(slots).devices.flat))
    return make_mesh(len(jax.devices()), 1)


def _open_checkpoint(
    options: Options, exps: Sequence[Experiment], extra: dict
) -> contextlib.AbstractContextManager:
    if options.checkpoint is None:
        return contextlib.nullcontext()
    runs = [{"config": e.config.to_dict(), "data": e.data_fingerprint} for e in exps]
    return Checkpoint(
        options.checkpoint, fingerprint(runs, extra), mode(options), job_of(runs, extra)
    )


def _check_same(exps: Sequence[Experiment]) -> None:
    """Every run has the same rounds (one table, one round axis); a run may run fewer methods
    than another (a sweep over one method's hyperparameter runs the others once)."""
    if not exps:
        raise ValueError("a job needs at least one run; got none")
    first = exps[0].config
    for e in exps[1:]:
        if e.config.rounds != first.rounds:
            raise ValueError(
                f"every run needs the same rounds; got {first.rounds} and {e.config.rounds}"
            )


def setup_runs(configs: Sequence[ExperimentConfig]) -> tuple[list[Experiment], float]:
    """Every run's host set-up (a bad run fails here, before anything compiles); seconds."""
    t0 = time.perf_counter()
    for c in configs:
        if not isinstance(c, ExperimentConfig):
            raise ValueError(f"configs must be ExperimentConfigs; got {type(c).__name__}")
    loaded: dict[tuple, Any] = {}  # one host copy per distinct partition
    with clamp_notes_once():
        exps = [setup(c, loaded) for c in configs]
    return exps, time.perf_counter() - t0


def config_list(configs: Any) -> list[ExperimentConfig]:
    """`configs` (one `ExperimentConfig` or a sequence of them) as a list."""
    if isinstance(configs, ExperimentConfig):
        return [configs]
    if not isinstance(configs, Sequence) or isinstance(configs, (str, Mapping)):
        raise ValueError(f"configs must be an ExperimentConfig or a list of them; got {configs!r}")
    return list(configs)


def compiled_block(
    config: ExperimentConfig, method: str, *, shards: int | None = None, block: int = 1
) -> Any:
    """The compiled program of `method` for one run of `config` (set-up, placement and
    ahead-of-time compile, nothing run): to inspect what a block does (`as_text()` for its
    HLO, `memory_analysis()` for its bytes)."""
    exps, _ = setup_runs([config])
    mesh = default_mesh(exps, shards)
    group = make_group([0], exps, mesh)
    state, (hp, hp_axes) = init_states(group, method, mesh)
    key = axes_key(group, state, hp_axes)
    program = block_program(get_algorithm(method), block, (), key, mesh, 1, group.shapes.slots)
    args = (group.ctx, group.evals, hp, group.round_roots, np.int32(0), np.int32(block))
    return program.lower(state, *args).compile()
