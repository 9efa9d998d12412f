"""`run(config) -> Result` and `sweep(config, seeds, grid) -> SweepResult`: one engine.

A run is a sweep of one: both set every run up on the host (`experiment.setup`), hand the
runs to the one driver (`execute`: programs, blocks, progress, checkpoints, divergence,
writers) on a `("runs", "slots")` mesh, and read their result from the driver's table. A
single run splits its slots over the devices (`"slots"`); several runs split the runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
from jax.sharding import Mesh

from pfedwn_jax._checks import check_bool, check_int
from pfedwn_jax.data.batching import clamp_notes_once
from pfedwn_jax.distributed import make_mesh
from pfedwn_jax.engine import resolve_shards
from pfedwn_jax.engine.sharding import slot_mesh
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.divergence import check_policy
from pfedwn_jax.experiment.setup import Experiment, environment, setup
from pfedwn_jax.interrupts import interrupt_guard
from pfedwn_jax.io import check_writable_dir
from pfedwn_jax.results.table import Table
from pfedwn_jax.runner.checkpoint import Checkpoint, check_available, fingerprint, job_of
from pfedwn_jax.runner.execute import Options, execute
from pfedwn_jax.runner.program import ALL, RUNS, check_mesh
from pfedwn_jax.runner.writers import CallbackWriter


def default_mesh(exps: Sequence[Experiment], shards: int | None = None) -> Mesh:
    """One run: its slots over `resolve_shards(shards, S)` devices; several: every device on
    the run axis (slots unsplit)."""
    if len(exps) == 1:
        slots = resolve_shards(shards, exps[0].federation.num_slots)
        return make_mesh(1, slots, devices=list(slot_mesh(slots).devices.flat))
    return make_mesh(len(jax.devices()), 1)


def check_records(records: Any) -> Any:
    """`"all"` or a tuple of record names; a ValueError otherwise."""
    if records == ALL:
        return ALL
    if (
        isinstance(records, str)
        or not isinstance(records, Sequence)
        or not all(isinstance(k, str) and k.strip() for k in records)
    ):
        raise ValueError(f"records must be 'all' or a list of record names; got {records!r}")
    if len(set(records)) < len(records):
        raise ValueError(f"records must not repeat a name; got {list(records)!r}")
    return tuple(records)


def _open_checkpoint(
    path: str | Path | None, exps: Sequence[Experiment], extra: dict, resume: bool, overwrite: bool
) -> contextlib.AbstractContextManager:
    if path is None:
        return contextlib.nullcontext()
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other; give one of them")
    runs = [{"config": e.config.to_dict(), "data": e.data_fingerprint} for e in exps]
    mode = "resume" if resume else "overwrite" if overwrite else "new"
    return Checkpoint(path, fingerprint(runs, extra), mode, job_of(runs, extra))


def execute_runs(
    exps: Sequence[Experiment],
    labels: Sequence[dict[str, Any]],
    *,
    mesh: Mesh,
    options: Options,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> tuple[Table, dict[str, Any]]:
    """`execute` under a checkpoint (if any) and the interrupt guard; meta with environment."""
    _check_same(exps)
    extra = {"records": options.records, "mesh_runs": mesh.shape[RUNS]}
    with interrupt_guard(), _open_checkpoint(checkpoint, exps, extra, resume, overwrite) as ck:
        table, meta = execute(exps, labels, mesh, options, ck)
    meta["environment"] = environment()
    return table, meta


def _check_same(exps: Sequence[Experiment]) -> None:
    """Every run has the same methods and rounds (one table, one round axis)."""
    if not exps:
        raise ValueError("a job needs at least one run; got none")
    first = exps[0].config
    for e in exps[1:]:
        if e.config.method_names != first.method_names:
            raise ValueError(
                f"every run needs the same methods; got {first.method_names} and "
                f"{e.config.method_names}"
            )
        if e.config.rounds != first.rounds:
            raise ValueError(
                f"every run needs the same rounds; got {first.rounds} and {e.config.rounds}"
            )


def options_of(
    *,
    block: int | None,
    records: Any,
    progress: bool,
    on_divergence: str,
    checkpoint_every: int,
    max_runs: int | None = None,
    writers: Sequence[Any] = (),
    block_seconds: float = 2.0,
    save_models: str | Path | None = None,
) -> Options:
    """Checked `Options` (`save_models`: a directory this process can write, or None)."""
    for w in writers:
        if not (callable(getattr(w, "log", None)) and callable(getattr(w, "close", None))):
            raise ValueError(
                f"writers must have log(event) and close() (runner.writers); got {w!r}"
            )
    if save_models is not None:
        save_models = check_writable_dir(save_models, "save_models")
    return Options(
        block=None if block is None else check_int("block", block, 1),
        block_seconds=block_seconds,
        records=check_records(records),
        progress=check_bool("progress", progress),
        on_divergence=check_policy(on_divergence),
        checkpoint_every=check_int("checkpoint_every", checkpoint_every, 1),
        max_runs=None if max_runs is None else check_int("max_runs", max_runs, 1),
        writers=tuple(writers),
        save_models=save_models,
    )


def check_checkpoint_path(
    path: str | Path | None, resume: bool = False, overwrite: bool = False
) -> None:
    """Before any work: a checkpoint directory that cannot be written, that another process
    is writing, or (without `resume` or `overwrite`) that holds an interrupted job fails."""
    resume, overwrite = check_bool("resume", resume), check_bool("overwrite", overwrite)
    if path is not None:
        check_writable_dir(path, "checkpoint")
        if resume and overwrite:
            raise ValueError("resume and overwrite exclude each other; give one of them")
        check_available(path, "resume" if resume else "overwrite" if overwrite else "new")


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


def mesh_for(exps: Sequence[Experiment], mesh: Mesh | None, shards: int | None = None) -> Mesh:
    return default_mesh(exps, shards) if mesh is None else check_mesh(mesh)


def labels_of(configs: Sequence[ExperimentConfig]) -> list[dict[str, Any]]:
    return [{"seed": c.seed} for c in configs]


def case_labels(configs: Sequence[ExperimentConfig]) -> list[dict[str, Any]]:
    """Each run's labels for `runs`: its seed and the top-level config values that differ
    between the runs (the CLI's cases: `dataset`, `gamma_th`, `target`), so that every run
    has its own name in the metric writers (its TensorBoard directory, its W&B run); `run`
    (the index) is added where two runs would still share one."""
    dicts = [c.to_dict() for c in configs]
    keys = [
        k
        for k, v in dicts[0].items()
        if k != "seed"
        and not isinstance(v, dict | list)
        and len({repr(d.get(k)) for d in dicts}) > 1
    ]
    labels = [
        {"seed": c.seed, **{k: d[k] for k in keys}} for c, d in zip(configs, dicts, strict=True)
    ]
    if len({repr(lbl) for lbl in labels}) < len(labels):
        labels = [{**lbl, "run": i} for i, lbl in enumerate(labels)]
    return labels


def writers_with(writers: Sequence[Any], callback: Any) -> tuple:
    if callback is not None and not callable(callback):  # before any set-up or compile
        raise ValueError(
            f"callback must be a function callback(method, rounds_done, metrics); got {callback!r}"
        )
    return (*writers, CallbackWriter(callback)) if callback is not None else tuple(writers)


def config_list(configs: Any) -> list[ExperimentConfig]:
    if isinstance(configs, ExperimentConfig):
        return [configs]
    if not isinstance(configs, Sequence) or isinstance(configs, (str, Mapping)):
        raise ValueError(f"configs must be a list of ExperimentConfigs; got {configs!r}")
    return list(configs)


# --------------------------------------------------------------------------- run
def result_of(
    table: Table, run: int, exp: Experiment, meta: dict[str, Any], setup_s: float, t0: float
):
    """The `Result` of run `run` (its experiment `exp`) of a job's table."""
    from pfedwn_jax.experiment.links import mobility_summary
    from pfedwn_jax.experiment.results import Result
    from pfedwn_jax.experiment.setup import data_info
    from pfedwn_jax.results.entries import method_entry

    c = exp.config
    methods = {
        m: method_entry(table.track(run, m), c.hparams_for(m), c.record_every, c.rounds)
        for m in c.method_names
    }
    network = {
        **exp.federation.to_dict(),
        "slot_neighbors": exp.ctx.neighbors.tolist(),
        "slot_neighbor_mask": exp.ctx.neighbor_mask.tolist(),
    }
    if c.mobility != "none":  # positions and lists per re-selection
        network["mobility"] = mobility_summary(methods)
    timings = {"setup_s": setup_s, "total_s": time.perf_counter() - t0, **meta["timings"]}
    return Result(c, network, data_info(exp.data), methods, meta["environment"], timings)


def runs(
    configs: Sequence[ExperimentConfig],
    *,
    progress: bool = True,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    callback: Any = None,
    shards: int | None = None,
    checkpoint_every: int = 1,
    on_divergence: str = "stop",
    block: int | None = None,
    records: Any = ALL,
    writers: Sequence[Any] = (),
    mesh: Mesh | None = None,
    save_models: str | Path | None = None,
) -> list:
    """`run` of several configs as one job (one `Result` each; arguments as `run`'s): runs
    whose shapes allow it share compiled programs, and one checkpoint covers them all."""
    t0 = time.perf_counter()
    configs = config_list(configs)
    options = options_of(
        block=block,
        records=records,
        progress=progress,
        on_divergence=on_divergence,
        checkpoint_every=checkpoint_every,
        writers=writers_with(writers, callback),
        save_models=save_models,
    )
    check_checkpoint_path(checkpoint, resume, overwrite)
    exps, setup_s = setup_runs(configs)
    table, meta = execute_runs(
        exps,
        case_labels(configs),
        mesh=mesh_for(exps, mesh, shards),
        options=options,
        checkpoint=checkpoint,
        resume=resume,
        overwrite=overwrite,
    )
    return [result_of(table, i, e, meta, setup_s, t0) for i, e in enumerate(exps)]


def run(
    config: ExperimentConfig,
    *,
    progress: bool = True,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    callback: Any = None,
    shards: int | None = None,
    checkpoint_every: int = 1,
    on_divergence: str = "stop",
    block: int | None = None,
    records: Any = ALL,
    writers: Sequence[Any] = (),
    mesh: Mesh | None = None,
    save_models: str | Path | None = None,
):
    """Run every method of `config` on the same network and partition: a sweep of one run.

    Args:
      config: the experiment (validated on construction).
      progress: a bar per method (rounds, current target accuracy); where stderr is not a
        terminal (a log file), a plain line every tenth of the rounds instead.
      checkpoint: a checkpoint directory (`runner.checkpoint`), saved every
        `checkpoint_every` rounds and when a method ends; None: no checkpoints. A directory
        that already holds a checkpoint is refused unless `resume` or `overwrite`.
      resume: continue from `checkpoint` (same config and data) where it stopped.
      overwrite: discard a checkpoint already in `checkpoint` and start over.
      callback: `callback(method, rounds_done, metrics)` after each round (after the block's
        checkpoint files are written; a resumed run calls it again for the rounds after the
        last complete step); `metrics` holds every registered metric (`target_accuracy`,
        `target_loss`, ...) and `client_accuracy [S]`.
      shards: devices the slots are split over (None: all devices of the default backend
        that get at least `engine.sharding.MIN_SLOTS_PER_SHARD` slots; on a CPU call
        `pfedwn_jax.use_cpu_devices()` first to get one per core). Results do not depend
        on it. Ignored with `mesh`.
      checkpoint_every: rounds between saves (>= 1).
      on_divergence: `"stop"` a method at its first diverged round (`divergence`; the entry
        keeps the rounds so far and says `diverged`); `"continue"` records it and runs on.
      block: rounds per compiled call (None: adapted so the progress moves about every two
        seconds; 1: the host sees every round). Results do not depend on it.
      records: the per-round records kept (`"all"`, or names such as `("pi",)`).
      writers: metric writers (`runner.writers`: `TensorBoardWriter`, `WandbWriter`,
        `CSVWriter`, or any object with `log(event)` and `close()`); each round reaches them
        once, after the checkpoint step that holds it is complete on disk (a resumed run
        does not log a round twice).
      mesh: a `Mesh(("runs", "slots"))` (default: this run's slots over `shards` devices).
      save_models: a directory for every slot's final personalised parameters of every
        method (`runner.saved_models`; read them back with `pfedwn_jax.load_models`).

    Returns:
      The `Result` (see `docs/experiments.md`).
    """
    options = {k: v for k, v in locals().items() if k != "config"}  # every keyword, as given
    if not isinstance(config, ExperimentConfig):
        raise ValueError(f"config must be an ExperimentConfig; got {type(config).__name__}")
    return runs([config], **options)[0]


# --------------------------------------------------------------------------- sweeps
def run_configs(
    configs: Sequence[ExperimentConfig],
    labels: Sequence[dict[str, Any]] | None = None,
    *,
    block: int | None = None,
    progress: bool = True,
    mesh: Mesh | None = None,
    max_runs: int | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    records: Any = (),
    on_divergence: str = "stop",
    writers: Sequence[Any] = (),
    checkpoint_every: int = 1,
    save_models: str | Path | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Every method of every config (one run each); `(columns, meta, records)`: the tidy
    table's columns, the job's description and the kept records (`"run/method/key" ->
    [rounds, ...]`). Arguments as `sweep`'s; `labels` name each run in the table (default
    `{"seed": config.seed}`)."""
    configs = config_list(configs)
    options = options_of(
        block=block,
        records=records,
        progress=progress,
        on_divergence=on_divergence,
        checkpoint_every=checkpoint_every,
        max_runs=max_runs,
        writers=writers,
        save_models=save_models,
    )
    check_checkpoint_path(checkpoint, resume, overwrite)
    exps, setup_s = setup_runs(configs)
    labels = list(labels) if labels is not None else labels_of(configs)
    table, meta = execute_runs(
        exps,
        labels,
        mesh=mesh_for(exps, mesh),
        options=options,
        checkpoint=checkpoint,
        resume=resume,
        overwrite=overwrite,
    )
    meta["timings"]["setup_s"] = setup_s
    kept = {
        f"{run}/{method}/{key}": track.record(key)
        for (run, method), track in table.tracks.items()
        for key in track.records
    }
    return table.columns(), meta, kept


def sweep(
    config: ExperimentConfig,
    seeds: str | int | Sequence[int] = (0,),
    grid: Mapping[str, Sequence[Any]] | None = None,
    *,
    zip: bool = False,
    block: int | None = None,
    progress: bool = True,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    mesh: Mesh | None = None,
    max_runs: int | None = None,
    records: Any = (),
    on_divergence: str = "stop",
    writers: Sequence[Any] = (),
    checkpoint_every: int = 1,
    save_models: str | Path | None = None,
):
    """Every run of `seeds` x `grid` (`sweeps.grid.expand`), as few compiled programs as
    shapes allow; returns the tidy `SweepResult` (one row per run x method x round).

    Each run computes what `pfedwn_jax.run(grid.run_config(config, spec))` computes. `block`
    rounds run per compiled call (None: adapted so the bar moves every couple of seconds);
    `records` names the per-round records kept for every run (e.g. `("pi",)`; `"all"`),
    read back with `SweepResult.record`; `checkpoint`/`resume`/`overwrite` as in `run()`;
    `mesh` a `Mesh(("runs", "slots"))` (default: every device on the run axis); `max_runs`
    caps the runs of one program; `on_divergence="stop"` drops a diverged run's rounds after
    its diverged round (the others go on), `"continue"` keeps them; `writers` and
    `save_models` as in `run()` (one TensorBoard directory or W&B run per grid point and
    seed; `load_models` run i is the table's run i). See docs/sweeps.md.
    """
    from pfedwn_jax.sweeps.grid import expand, run_config
    from pfedwn_jax.sweeps.result import SweepResult

    if not isinstance(config, ExperimentConfig):
        raise ValueError(f"config must be an ExperimentConfig; got {type(config).__name__}")
    specs = expand(config, seeds, grid, zip=zip)
    columns, meta, kept = run_configs(
        [run_config(config, s) for s in specs],
        [{"seed": s.seed, **s.values} for s in specs],
        block=block,
        progress=progress,
        mesh=mesh,
        max_runs=max_runs,
        checkpoint=checkpoint,
        resume=resume,
        overwrite=overwrite,
        records=records,
        on_divergence=on_divergence,
        writers=writers,
        checkpoint_every=checkpoint_every,
        save_models=save_models,
    )
    meta.update(config=config.to_dict(), seeds=sorted({s.seed for s in specs}))
    meta.update(grid={k: list(v) for k, v in (grid or {}).items()}, zip=zip, block=block)
    return SweepResult(columns, tuple(grid or {}), meta, kept)


def compiled_block(
    config: ExperimentConfig, method: str, *, shards: int | None = None, block: int = 1
) -> Any:
    """The compiled program of `method` for one run of `config` (set-up, placement and
    ahead-of-time compile, nothing run): to inspect what a block does (`as_text()` for its
    HLO, `memory_analysis()` for its bytes)."""
    import numpy as np

    from pfedwn_jax.algorithms import get_algorithm
    from pfedwn_jax.runner.groups import axes_key, init_states, make_group
    from pfedwn_jax.runner.program import block_program

    exps, _ = setup_runs([config])
    mesh = default_mesh(exps, shards)
    group = make_group([0], exps, mesh)
    state, (hp, hp_axes) = init_states(group, method, mesh)
    key = axes_key(group, state, hp_axes)
    program = block_program(get_algorithm(method), block, (), key, mesh, 1, group.shapes.slots)
    args = (group.ctx, group.evals, hp, group.round_roots, np.int32(0), np.int32(block))
    return program.lower(state, *args).compile()
