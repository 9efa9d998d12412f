"""`run_configs(configs)`: every method of many runs, as few compiled programs as shapes allow."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jax.sharding import Mesh

from pfedwn_jax._checks import check_int
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.runner import _progress_bar, environment
from pfedwn_jax.sweeps.grid import expand, run_config
from pfedwn_jax.sweeps.result import SweepResult
from pfedwn_jax.sweeps.resume import SweepCheckpoint, fingerprint
from pfedwn_jax.sweeps.runner import (
    Table,
    block_sizes,
    check_mesh,
    init_states,
    make_groups,
    run_method,
    setup_all,
)


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
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run every method of every config; `(columns, meta)` of the tidy table.

    Args:
      configs: one `ExperimentConfig` per run (all with the same methods).
      labels: per run, the values that name it in the table (e.g. `{"seed": 3, "lr": 0.1}`);
        default `{"seed": config.seed}`.
      block: rounds per compiled block (default `runner.DEFAULT_BLOCK`).
      progress: a bar over blocks.
      mesh: `Mesh(("runs", "slots"))`, default every device on the run axis.
      max_runs: at most this many runs in one program (memory).
      checkpoint: a directory saved after every block (`resume.SweepCheckpoint`).
      resume: continue from `checkpoint` (same runs, devices and block).
    """
    methods = _check_runs(configs)
    if block is not None:
        block = check_int("block", block, 1)
    mesh = check_mesh(mesh)
    labels = list(labels) if labels is not None else [{"seed": c.seed} for c in configs]
    saved = None
    if checkpoint is not None:
        saved = SweepCheckpoint(
            checkpoint, fingerprint(list(configs), mesh.shape["runs"], block), resume
        )
    exps, setup_s = setup_all(configs)
    t0 = time.perf_counter()
    groups = make_groups(exps, mesh, max_runs=max_runs)
    table = Table(labels)
    if saved is not None:
        table.rows.extend(saved.rows)
    _run_groups(groups, methods, mesh, block, table, saved, progress)
    order = {m: i for i, m in enumerate(methods)}
    table.rows.sort(key=lambda row: (row["run"], order[row["method"]], row["round"]))
    meta = {
        "methods": list(methods),
        "runs": len(configs),
        "programs": len(groups),
        "devices": int(mesh.devices.size),
        "environment": environment(),
        "timings": {"setup_s": setup_s, "run_s": time.perf_counter() - t0},
    }
    return table.columns(), meta


def _check_runs(configs: Sequence[ExperimentConfig]) -> tuple[str, ...]:
    """The methods every run shares (ValueError for no runs or different methods)."""
    if not configs:
        raise ValueError("a sweep needs at least one run; got no configs")
    methods = configs[0].method_names
    for c in configs:
        if not isinstance(c, ExperimentConfig):
            raise ValueError(f"configs must be ExperimentConfigs; got {type(c).__name__}")
        if c.method_names != methods:
            raise ValueError(
                f"every run needs the same methods; got {methods} and {c.method_names}"
            )
    return methods


def _run_groups(groups, methods, mesh, block, table, saved, progress) -> None:
    """Every (group, method) not finished in `saved`, block by block, saving after each."""
    sizes = [block_sizes(g.exps[0].config.rounds, block) for g in groups]
    total = sum(len(z) * len(methods) for z in sizes)
    done_blocks = 0
    todo = []
    for gi, g in enumerate(groups):
        for name in methods:
            start = saved.rounds_done(gi, name) if saved is not None else 0
            if saved is not None and saved.finished(gi, name):
                done_blocks += len(sizes[gi])
                continue
            done_blocks += sum(1 for lo in itertools.accumulate(sizes[gi]) if lo <= start)
            todo.append((gi, g, name, start))
    bar = _progress_bar("sweep", total, done_blocks, progress)
    try:
        for gi, g, name, start in todo:
            rounds = g.exps[0].config.rounds

            def on_block(done, k, metrics, state, gi=gi, g=g, name=name, rounds=rounds):
                before = len(table.rows)
                table.add_block(g, name, done, k, metrics)
                if saved is not None:
                    new = table.rows[before:]
                    saved.save(gi, name, done, done == rounds, state, new)
                bar.update(1)

            state = None
            if start > 0:
                state = saved.restore(init_states(g, name, mesh))
            run_method(g, name, mesh, sizes[gi], on_block, state=state, start=start)
    finally:
        bar.close()


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
    mesh: Mesh | None = None,
    max_runs: int | None = None,
) -> SweepResult:
    """Every run of `seeds` x `grid` (see `grid.expand`), as few compiled programs as shapes
    allow; returns the tidy `SweepResult` (one row per run x method x round).

    Each run computes what `pfedwn_jax.run(grid.run_config(config, spec))` computes.
    `block` rounds run per compiled call (the host syncs, the bar moves and a checkpoint is
    saved once per block); `checkpoint`/`resume` as in `run()`, at block granularity;
    `mesh` a `Mesh(("runs", "slots"))` (default: every device on the run axis); `max_runs`
    caps the runs of one program. See docs/sweeps.md.
    """
    if not isinstance(config, ExperimentConfig):
        raise ValueError(f"config must be an ExperimentConfig; got {type(config).__name__}")
    specs = expand(config, seeds, grid, zip=zip)
    configs = [run_config(config, s) for s in specs]
    labels = [{"seed": s.seed, **s.values} for s in specs]
    columns, meta = run_configs(
        configs,
        labels,
        block=block,
        progress=progress,
        mesh=mesh,
        max_runs=max_runs,
        checkpoint=checkpoint,
        resume=resume,
    )
    swept = tuple(grid or {})
    meta.update(
        config=config.to_dict(),
        seeds=sorted({s.seed for s in specs}),
        grid={k: list(v) for k, v in (grid or {}).items()},
        zip=zip,
        block=block,
    )
    return SweepResult(columns, swept, meta)
