"""`run_configs(configs)`: every method of many runs, as few compiled programs as shapes allow."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh

from pfedwn_jax._checks import check_int
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.runner import _progress_bar, environment
from pfedwn_jax.sweep.runner import (
    Table,
    block_sizes,
    check_mesh,
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
    """
    if not configs:
        raise ValueError("a sweep needs at least one run; got no configs")
    methods = configs[0].method_names
    for c in configs:
        if c.method_names != methods:
            raise ValueError(
                f"every run needs the same methods; got {methods} and {c.method_names}"
            )
    if block is not None:
        block = check_int("block", block, 1)
    mesh = check_mesh(mesh)
    labels = list(labels) if labels is not None else [{"seed": c.seed} for c in configs]
    exps, setup_s = setup_all(configs)
    t0 = time.perf_counter()
    groups = make_groups(exps, mesh, max_runs=max_runs)
    table = Table(labels)
    sizes = {id(g): block_sizes(g.exps[0].config.rounds, block) for g in groups}
    bar = _progress_bar("sweep", sum(len(sizes[id(g)]) * len(methods) for g in groups), 0, progress)
    try:
        for g in groups:
            for name in methods:

                def on_block(done, k, metrics, state, g=g, name=name):
                    table.add_block(g, name, done, k, metrics)
                    bar.update(1)

                run_method(g, name, mesh, sizes[id(g)], on_block)
    finally:
        bar.close()
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
