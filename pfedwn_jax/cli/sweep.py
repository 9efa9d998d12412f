"""`pfedwn sweep`: many runs of one experiment (seeds x a grid of values) as one program.

    pfedwn sweep --seeds 0-15 --grid lr=0.01,0.05 --grid pfedwn.a=0.3,0.5,0.7 --out DIR

runs every grid point (the product of the --grid lists, or with --zip the lists paired) with
every seed, seeds innermost, and writes the sweep's table, summary and plots into DIR. Grid
keys are config fields (lr, momentum, eps, gamma_th, topology_seed, data_seed, ...) and
METHOD.FIELD hyperparameters of the methods run (pfedwn.a, fedprox.mu, ...); a bad key
lists the allowed ones. Each run sets `seed` to its own seed (the config's `seed` is
ignored); the partition follows it unless data_seed is set; the network (topology_seed) does
not, unless swept.

The base config comes from the defaults, then `--config file.toml`, then the flags given, as
in `pfedwn run`. The file may hold a `[sweep]` table:

    [sweep]
    seeds = "0-15"      # or a list of seeds
    zip = false
    block = 5           # rounds per compiled block (default: the library's choice)
    [sweep.grid]
    lr = [0.01, 0.05]
    pfedwn.a = [0.3, 0.5, 0.7]

--seeds, --zip, --block replace the table's values; a --grid key replaces the table's list
of that key. The state is checkpointed into DIR/checkpoint/ after each block until the
results are written; --resume goes on from there with the same final numbers, --overwrite
discards it (a directory holding an interrupted sweep's checkpoint is refused otherwise).
--records pi keeps pFedWN's per-round weights of every run (DIR/records.npz).
--save-models keeps every run's final models in DIR/models/ (pfedwn_jax.load_models; run i
is the table's run i); --log-to tensorboard,wandb,csv logs every run (one per grid point and
seed, with its config) to DIR/logs/ (or --log-dir).
"""

from __future__ import annotations

import argparse
import os
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from pfedwn_jax import api, distributed
from pfedwn_jax._checks import check_bool, check_int, split_list
from pfedwn_jax.cli.common import (
    add_output_flags,
    models_dir,
    out_path,
    refuse_eps_flag,
    writers_from_args,
)
from pfedwn_jax.cli.run import (
    CASE_FIELDS,
    add_checkpoint_flags,
    add_config_flags,
    config_from_args,
    flag,
)
from pfedwn_jax.distributed import is_writer
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.grid import GRID_FIELDS, RunSpec, expand, parse_grid_arg, parse_seeds
from pfedwn_jax.io import check_writable_dir, check_writable_file
from pfedwn_jax.results.result import to_jsonable
from pfedwn_jax.results.sweep import SweepResult
from pfedwn_jax.runner.checkpoint import holds_checkpoint, remove

CHECKPOINT = "checkpoint"  # a directory under --out (the sweep library's format)
DEFAULT_SEEDS = "0"
SWEEP_TABLE_KEYS = ("seeds", "zip", "block", "grid")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sweep",
        help="run seeds x a grid of values in one compiled program; table, summary, plots",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config", type=Path, help="TOML file of ExperimentConfig fields and a [sweep] table"
    )
    add_config_flags(p, cases=False, skip=("seed",))  # each run's seed comes from --seeds
    p.add_argument(
        "--seeds",
        metavar="SPEC",
        help=f'seeds: "0-15" (inclusive), "0,3,7", "0-3,8" or "5" (default: [sweep] seeds, '
        f"else {DEFAULT_SEEDS})",
    )
    p.add_argument(
        "--grid",
        action="append",
        metavar="KEY=V1,V2",
        help="a swept key and its values, e.g. lr=0.01,0.05 or pfedwn.a=0.3,0.5; repeat for "
        "more keys (runs: their product)",
    )
    p.add_argument("--zip", action="store_true", help="pair the --grid lists position by position")
    p.add_argument(
        "--block",
        type=int,
        metavar="K",
        help="rounds per compiled block: the host sees the device, shows progress and "
        "checkpoints once per block (default: the library's choice)",
    )
    p.add_argument(
        "--out",
        type=out_path,
        default=Path("runs/sweep"),
        help="output directory (default: runs/sweep)",
    )
    add_checkpoint_flags(p)
    p.add_argument(
        "--records",
        metavar="KEYS",
        help="per-round records to keep for every run, comma-separated (e.g. pi), or all "
        "(default: none; pi with --log-to)",
    )
    add_output_flags(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=main)


# ------------------------------------------------------------------------- sweep options
def read_config_file(path: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(config fields, [sweep] table)` of the TOML file `path` (both empty without one)."""
    if path is None:
        return {}, {}
    try:
        with Path(path).open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config file {path}: {e}") from None
    table = data.pop("sweep", {})
    if not isinstance(table, Mapping):
        raise ValueError(f"config file {path}: `sweep` must be a [sweep] table; got {table!r}")
    unknown = sorted(set(table) - set(SWEEP_TABLE_KEYS))
    if unknown:
        raise ValueError(
            f"config file {path}: [sweep] has unknown key(s) {unknown}; "
            f"allowed: {list(SWEEP_TABLE_KEYS)}"
        )
    return data, dict(table)


def flatten_grid(table: Any) -> dict[str, Any]:
    """A `[sweep.grid]` table as `key -> values`; TOML reads `pfedwn.a = [...]` as the nested
    `{"pfedwn": {"a": [...]}}`, which becomes `"pfedwn.a"`."""
    if not isinstance(table, Mapping):
        raise ValueError(f"[sweep.grid] must be a table of key = [values]; got {table!r}")
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            for field, values in value.items():
                out[f"{key}.{field}"] = values
        else:
            out[key] = value
    return out


def grid_from_args(entries: list[str] | None, base: Mapping[str, Any]) -> dict[str, Any]:
    """`base` (the file's grid) with each `--grid KEY=V1,V2` replacing or adding its key."""
    grid = dict(base)
    given: set[str] = set()
    for entry in entries or []:
        key, values = parse_grid_arg(entry)
        if key in given:
            raise ValueError(f"--grid {key} is given twice; give its values once: {key}=V1,V2")
        given.add(key)
        grid[key] = values
    return grid


def _check_single_values(args: argparse.Namespace) -> None:
    """`pfedwn run`'s case lists (`--gamma-th 5,10`) are grid lists here: one value each."""
    for name in CASE_FIELDS:
        value = getattr(args, name, None)
        if isinstance(value, str) and "," in value:
            how = f"--grid {name}=V1,V2" if name in GRID_FIELDS else "one sweep per value"
            raise ValueError(
                f"{flag(name)} takes one value in pfedwn sweep; got {value!r}; "
                f"for several, use {how}"
            )


class SweepOptions(NamedTuple):
    """What the command line asks `sweep()` for, validated: `seeds` parsed, `grid` as given
    (key -> list), `runs` the `RunSpec`s `expand` lists (checked before any work)."""

    config: ExperimentConfig
    seeds: tuple[int, ...]
    grid: dict[str, list[Any]]
    zip: bool
    block: int | None
    runs: tuple[RunSpec, ...]


def sweep_options(args: argparse.Namespace) -> SweepOptions:
    """The base config and the sweep options of `args`: defaults < `--config` < flags."""
    _check_single_values(args)
    fields, table = read_config_file(args.config)
    config = refuse_eps_flag(getattr(args, "eps", None), lambda: config_from_args(args, fields))
    seeds = parse_seeds(args.seeds if args.seeds is not None else table.get("seeds", DEFAULT_SEEDS))
    grid = grid_from_args(args.grid, flatten_grid(table.get("grid", {})))
    zip_ = args.zip or check_bool("[sweep] zip", table.get("zip", False))
    block = args.block if args.block is not None else table.get("block")
    if block is not None:
        block = check_int("--block" if args.block is not None else "[sweep] block", block, 1)
    runs = expand(config, seeds, grid, zip=zip_)
    return SweepOptions(config, seeds, grid, zip_, block, runs)


def _finished(opts: SweepOptions, out: Path) -> bool:
    """Whether `out` holds the results of the sweep `opts` and no checkpoint (it finished)."""
    if holds_checkpoint(out / CHECKPOINT):
        return False
    try:
        meta = SweepResult.load(out).meta
    except (OSError, ValueError, KeyError):
        return False
    about: dict[str, Any] = {"config": opts.config.to_dict()}
    about |= {"seeds": sorted({s.seed for s in opts.runs})}
    about |= {"grid": {k: list(v) for k, v in (opts.grid or {}).items()}, "zip": opts.zip}
    return all(meta.get(k) == v for k, v in to_jsonable(about).items())


def _written(paths: Any, out: Path) -> list[str]:
    """What `SweepResult.save` returned (paths, a mapping of them, or one) as strings."""
    if isinstance(paths, Mapping):
        paths = list(paths.values())
    elif paths is None or isinstance(paths, str | Path):
        paths = [paths or out]
    return [str(p) for p in paths]


def _records(text: str | None, logged: bool = False) -> Any:
    """`--records`: "all", or the comma-separated names (none: (), or `("pi",)` when the
    rounds are `logged`: the writers show pFedWN's weights)."""
    if text is None:
        return ("pi",) if logged else ()
    if text.strip() == "all":
        return "all"
    return tuple(split_list("--records", text))


# ---------------------------------------------------------------------------------- main
def _mesh() -> Any:
    """Several hosts (`JAX_COORDINATOR_ADDRESS` set): join them and span every process's
    devices; otherwise None (the sweep's default mesh of this host)."""
    if not os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return None

    distributed.initialize()
    return distributed.make_mesh()


def main(args: argparse.Namespace) -> int:
    opts = sweep_options(args)
    out: Path = check_writable_dir(args.out, "--out")
    if args.resume and _finished(opts, out):  # a finished job has no checkpoint left
        print(f"nothing to resume: the sweep in {out} finished; its results: {out / 'sweep.json'}")
        return 0
    for name in ("rows.csv", "sweep.json", "summary.json", "curves.png", "records.npz"):
        check_writable_file(out / name, "output file")  # before any training
    mesh = _mesh()

    writer = is_writer()
    if writer:
        out.mkdir(parents=True, exist_ok=True)
    print(
        f"sweep: {len(opts.runs)} run(s) = {len(opts.runs) // len(opts.seeds)} grid point(s) x "
        f"{len(opts.seeds)} seed(s); methods (runs): "
        + ", ".join(
            f"{m} ({sum(m in r.methods for r in opts.runs)})" for m in opts.config.method_names
        )
    )

    checkpoint = out / CHECKPOINT
    writers = writers_from_args(args, out)
    records = _records(args.records, logged=bool(writers))
    try:
        result = api.sweep(
            opts.config,
            seeds=opts.seeds,
            grid=opts.grid,
            zip=opts.zip,
            block=opts.block,
            progress=not args.no_progress,
            checkpoint=checkpoint,
            resume=args.resume,
            overwrite=args.overwrite,
            mesh=mesh,
            records=records,
            writers=writers,
            save_models=models_dir(args, out),
        )
    except KeyboardInterrupt:
        if checkpoint.exists():
            print(
                f"checkpoint kept: continue with `pfedwn sweep ... --out {out} --resume`",
                file=sys.stderr,
            )
        raise
    if not writer:  # every process computed the same table; process 0 writes it
        return 0
    paths = result.save(out)

    remove(checkpoint)
    print(result.summary_table())
    print("wrote " + ", ".join(_written(paths, out)))
    return 0
