"""The front door: `run(config | [configs]) -> Result | [Result]` and
`sweep(config | [configs], seeds, grid) -> SweepResult`, both over the one job runner.

How a job runs is one `Options` object (checkpoint, writers, block, records, ...); each of its
fields is also accepted as a keyword (`run(config, progress=False)`), the keywords replacing
the object's fields. Nothing inside the package imports this module: the command line and
the studies sit above it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.grid import expand, key_method, run_config
from pfedwn_jax.experiment.setup import Experiment, data_info
from pfedwn_jax.results.entries import method_entry
from pfedwn_jax.results.result import Result
from pfedwn_jax.results.sweep import SweepResult, owned_columns
from pfedwn_jax.results.table import Table
from pfedwn_jax.runner.job import compiled_block, config_list, run_job
from pfedwn_jax.runner.links import mobility_summary
from pfedwn_jax.runner.options import ALL, Options, options_from

__all__ = ["Options", "compiled_block", "run", "sweep"]


def run(configs: Any, options: Options | None = None, **keywords: Any) -> Any:
    """Run every method of each config on that config's network and partition.

    Args:
      configs: one `ExperimentConfig`, or a list of them run as one job (runs whose shapes
        allow it share compiled programs, one checkpoint covers them all).
      options: how the job runs (`Options`; default `Options()`, every record kept).
      **keywords: any `Options` field (`progress=False`, `checkpoint=DIR`, `writers=[...]`,
        ...), replacing the field of `options`.

    Returns:
      The `Result` of `configs` (see `docs/experiments.md`), or one per config of a list.
    """
    single = isinstance(configs, ExperimentConfig)
    t0 = time.perf_counter()
    cfgs = config_list(configs)
    job = run_job(cfgs, case_labels(cfgs), options_from(options, keywords, records=ALL))
    results = [result_of(job.table, i, e, job.meta, t0) for i, e in enumerate(job.exps)]
    return results[0] if single else results


def sweep(
    configs: Any,
    seeds: str | int | Sequence[int] = (0,),
    grid: Mapping[str, Sequence[Any]] | None = None,
    *,
    zip: bool = False,
    labels: Sequence[Mapping[str, Any]] | None = None,
    options: Options | None = None,
    **keywords: Any,
) -> SweepResult:
    """Many runs as few compiled programs; the tidy `SweepResult` (one row per run x method
    x round; by default no per-round records kept, `records=("pi",)` keeps some).

    One config: every run of `seeds` x `grid` (`experiment.grid.expand`; `zip=True` pairs
    the grid's lists instead of their product), each computing what
    `run(grid.run_config(config, spec))` computes; a key `"<method>.<field>"` multiplies
    that method's runs alone (the others run once per seed, the key missing in their rows).
    A list of configs: one run each, named in the table by `labels` (one dict per config;
    `seed` defaults to `config.seed`; the keys other than `seed` are the swept columns).
    `options` / `**keywords` as in `run` (one TensorBoard directory or W&B run per run;
    `load_models` run i is the table's run i). See docs/sweeps.md.
    """
    opt = options_from(options, keywords, records=())
    if isinstance(configs, ExperimentConfig):
        if labels is not None:
            raise ValueError("labels name the runs of a list of configs; got one config")
        specs = expand(configs, seeds, grid, zip=zip)
        cfgs = [run_config(configs, s) for s in specs]
        labs = [{"seed": s.seed, **s.values} for s in specs]
        swept: tuple[str, ...] = tuple(grid or {})
        owners = {k: m for k in swept if (m := key_method(k)) is not None}
        about: dict[str, Any] = {"config": configs.to_dict(), "owners": owners}
        about |= {"seeds": sorted({s.seed for s in specs})}
        about |= {"grid": {k: list(v) for k, v in (grid or {}).items()}, "zip": zip}
    else:
        if grid is not None or seeds != (0,):
            raise ValueError("seeds and grid expand one config; give a list of configs alone")
        cfgs = config_list(configs)
        labs = [{"seed": c.seed} for c in cfgs]
        if labels is not None:
            if len(labels) != len(cfgs):
                raise ValueError(f"labels: one per config ({len(cfgs)}); got {len(labels)}")
            labs = [{**labs[i], **dict(x)} for i, x in enumerate(labels)]  # `zip`: a keyword
        swept, about = tuple(k for k in labs[0] if k != "seed") if labs else (), {}
        owners = {}
    job = run_job(cfgs, labs, opt)
    job.meta.update(about, block=opt.block)
    kept: dict[str, Any] = {
        f"{run}/{method}/{key}": track.record(key)
        for (run, method), track in job.table.tracks.items()
        for key in track.records
    }
    rows = owned_columns(job.table.columns(), owners) if owners else job.table.columns()
    return SweepResult(rows, swept, job.meta, kept)


def result_of(table: Table, run: int, exp: Experiment, meta: dict[str, Any], t0: float) -> Result:
    """The `Result` of run `run` (its experiment `exp`) of a job's table."""
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
    timings = {"setup_s": meta["timings"]["setup_s"], "total_s": time.perf_counter() - t0}
    timings |= meta["timings"]
    return Result(c, network, data_info(exp.data), methods, meta["environment"], timings)


def case_labels(configs: Sequence[ExperimentConfig]) -> list[dict[str, Any]]:
    """Each run's labels for `run`: its seed and the top-level config values that differ
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
