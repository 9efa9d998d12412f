"""`pfedwn run`: run FL methods on one wireless network and print a Table II-style table.

Writes `DIR/results.json` (schema in docs/experiments.md), `DIR/learning_curve.png` and, when
pFedWN runs, `DIR/pi_history.png` (its EM weights, the paper's Fig. 8).
Values come from the defaults, then `--config file.toml`, then the flags given.

Several cases: `--dataset a,b` and/or `--gamma-th 5,10,15` (with `--target` either one value
or one per gamma_th) run every case (gamma_th, target: a zipped grid, `experiment.grid.expand`)
on every dataset as one job (runs that share shapes share compiled programs), each case's
results in its own `DIR/<case>/` directory, and print the paper's Table II layout with one
column per case/dataset (also written to `DIR/table.txt`, with `DIR/cases.json` listing the
runs).

Checkpoints: `DIR/checkpoint/` holds the job's progress (every `--checkpoint-every` rounds)
until the results are written. `--save-models` keeps every slot's final models in
`DIR/models/` (all cases of the job; `pfedwn_jax.load_models`), `--log-to tensorboard,csv`
logs every round to `DIR/logs/` (or `--log-dir`). A directory that holds an interrupted
job's checkpoint is refused unless `--resume` (continue it) or `--overwrite` (discard it).

`--out DIR` is checked before any work (it must be, or be creatable as, a writable directory).
A rerun into the same directory removes the files of `OUTPUTS` a previous run wrote there that
this run does not write again (a stale `pi_history.png` beside a new `results.json`).

Exit status `EXIT_DIVERGED` (3) when a method diverged (its results are still written; stderr
names the methods and rounds), so a script notices without reading the table.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import os
import re
import sys
import tomllib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pfedwn_jax import api, distributed
from pfedwn_jax._checks import split_list
from pfedwn_jax.cli.common import (
    LOGS,
    MODELS,
    add_output_flags,
    models_dir,
    out_path,
    refuse_eps_flag,
    writers_from_args,
)
from pfedwn_jax.distributed import is_writer
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.grid import expand, run_config
from pfedwn_jax.io import (
    atomic_write_json,
    atomic_write_text,
    check_writable_dir,
    check_writable_file,
)
from pfedwn_jax.plotting import MISSING
from pfedwn_jax.results.report import (
    format_table,
    format_table_cases,
    plot_learning_curves,
    plot_pi_history,
)
from pfedwn_jax.results.result import Result
from pfedwn_jax.runner.checkpoint import holds_checkpoint, remove

# Fields whose flag takes a comma-separated list: each value is its own case (see above).
CASE_FIELDS = {
    "dataset": "comma-separated for several columns",
    "gamma_th": "comma-separated for several cases",
    "target": "one value, or one per case",
}
# Mapping fields: each flag is one TOML `key = value` line, e.g. `--hparams fedprox.mu=0.1`.
TABLE_HELP = "a TOML entry such as %s; repeat the flag for more (merged into --config's table)"
TABLE_EXAMPLES = {"hparams": "fedprox.mu=0.1", "channel": "num_subchannels=20"}

RESULTS = "results.json"
ARRAYS = "results.npz"  # per-client arrays of a network-mode result (`Result.save`)
CURVE = "learning_curve.png"
PI_PLOT = "pi_history.png"
TABLE = "table.txt"
CASES = "cases.json"
CHECKPOINT = "checkpoint"  # a directory (pfedwn_jax.runner.checkpoint)
EXIT_DIVERGED = 3  # a method diverged; distinct from usage (2) and system (1) errors
# every file `pfedwn run` writes into an output directory (the checkpoint has its own rules)
OUTPUTS = (RESULTS, ARRAYS, CURVE, PI_PLOT, TABLE, CASES)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run",
        help="run FL methods on a wireless network, print a table, save JSON and a plot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, help="TOML file of ExperimentConfig fields")
    add_config_flags(p)
    p.add_argument(
        "--out",
        type=out_path,
        default=Path("runs/latest"),
        help="output directory (default: runs/latest)",
    )
    add_checkpoint_flags(p)
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=5,
        metavar="N",
        help=(
            "save DIR/checkpoint/ every N rounds and when a method ends (default: 5: an orbax "
            "save costs about 100 ms, a default round 50-100 ms); 0: no checkpoint"
        ),
    )
    p.add_argument(
        "--keep-going-on-divergence",
        action="store_true",
        help=(
            "run every round of a method that diverged (default: stop it at that round); "
            "either way the exit status is 3 when a method diverged"
        ),
    )
    add_output_flags(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--no-plot", action="store_true", help="skip the learning-curve PNG")
    p.set_defaults(func=main)


def add_checkpoint_flags(p: argparse.ArgumentParser) -> None:
    """`--resume` and `--overwrite`: what to do with a checkpoint already in the directory."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--resume",
        action="store_true",
        help="continue the interrupted job in DIR/checkpoint/ (same config and data)",
    )
    group.add_argument(
        "--overwrite",
        action="store_true",
        help="discard an interrupted job's DIR/checkpoint/ and start over",
    )


# --------------------------------------------------------------------------- config flags
def add_config_flags(
    parser: argparse.ArgumentParser, *, cases: bool = True, skip: Iterable[str] = ()
) -> None:
    """One flag per `ExperimentConfig` field: `--field-name`, typed from its annotation.

    Help comes from the field's entry in the class docstring. Every default is None (unset),
    so only the flags given override the defaults and `--config`. `cases`: say in the help
    of `CASE_FIELDS` that a list gives several cases (`pfedwn run`); `skip`: fields without
    a flag.
    """
    hints = typing.get_type_hints(ExperimentConfig)
    helps = field_docs(ExperimentConfig)
    for field in dataclasses.fields(ExperimentConfig):
        if field.name in skip:
            continue
        name, kind = field.name, flag_type(field.name, hints[field.name])
        notes = [helps.get(name, name.replace("_", " ")).rstrip(".")]
        if cases and name in CASE_FIELDS:
            notes.append(CASE_FIELDS[name])
        if kind is None:
            notes.append(TABLE_HELP % TABLE_EXAMPLES.get(name, "key=value"))
        if field.default not in (None, (), dataclasses.MISSING) and "default" not in notes[0]:
            notes.append(f"default: {field.default}")
        text = "; ".join(notes).replace("%", "%%")  # argparse %-formats help
        if kind is None:  # a mapping: TOML entries, repeatable
            parser.add_argument(
                flag(name), dest=name, action="append", metavar="KEY=VALUE", help=text
            )
        else:
            parser.add_argument(flag(name), dest=name, type=kind, default=None, help=text)


def flag(field: str) -> str:
    """The flag of config field `field`: `batch_size` -> `--batch-size`."""
    return "--" + field.replace("_", "-")


def field_docs(cls: type) -> dict[str, str]:
    """`field -> text` from the `  name: text` entries of `cls`'s docstring (lines joined)."""
    names = {f.name for f in dataclasses.fields(cls)}
    docs: dict[str, str] = {}
    current = None
    for line in (inspect.getdoc(cls) or "").splitlines():
        entry = re.match(r"^  (\w+): (.*)$", line)
        if entry and entry.group(1) in names:
            current = entry.group(1)
            docs[current] = entry.group(2).strip()
        elif current is not None and line.startswith("    "):
            docs[current] += " " + line.strip()
        else:
            current = None
    return docs


def flag_type(name: str, hint: Any) -> Callable[[str], Any] | None:
    """The argparse `type` of a field's flag (None: a mapping, given as TOML entries)."""
    origin = typing.get_origin(hint)
    if name in CASE_FIELDS or origin is tuple:
        return str  # comma-separated; split into cases here or by `ExperimentConfig`
    if origin in (types.UnionType, typing.Union):
        kinds = [k for k in typing.get_args(hint) if k is not type(None)]
        if len(kinds) == 1:
            return flag_type(name, kinds[0])
    if hint is bool:
        return _boolean
    if hint in (int, float, str):
        return hint
    if origin is not None and issubclass(origin, Mapping):
        return None
    raise TypeError(f"ExperimentConfig.{name}: no command-line flag type for {hint!r}")


def _boolean(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false; got {text!r}")


def config_from_args(
    args: argparse.Namespace, file_fields: Mapping[str, Any] | None = None
) -> ExperimentConfig:
    """`ExperimentConfig` from defaults, `--config` and the flags (flags win).

    `file_fields`: the config file's fields, where the caller has read `--config` itself
    (`pfedwn sweep` takes its `[sweep]` table out first); None: read `args.config`.
    """
    overrides: dict[str, Any] = {}
    tables: dict[str, Any] = {}  # ExperimentConfig's mapping fields (channel, hparams)
    for name in ExperimentConfig.field_names():
        value = getattr(args, name, None)
        if isinstance(value, list):
            tables[name] = _table(name, value)
        elif value is not None:
            overrides[name] = value
    if isinstance(overrides.get("gamma_th"), str):
        overrides["gamma_th"] = _number("gamma_th", overrides["gamma_th"])
    if overrides.get("target") is not None:
        overrides["target"] = _target(overrides["target"])
    if args.config is None and file_fields is None:
        return ExperimentConfig(**overrides, **tables)
    if file_fields is None:
        config = ExperimentConfig.from_toml(args.config, **overrides)
    else:
        config = ExperimentConfig.from_dict({**file_fields, **overrides})
    if not tables:
        return config
    return config.replace(**{k: _merge(getattr(config, k), v) for k, v in tables.items()})


def _table(name: str, entries: list[str]) -> dict[str, Any]:
    """The `--name KEY=VALUE` entries as one nested dict (TOML syntax, dotted keys)."""
    out: dict[str, Any] = {}
    for entry in entries:
        try:
            out = _merge(out, tomllib.loads(entry))
        except tomllib.TOMLDecodeError as e:
            raise ValueError(
                f"{name}: {entry!r} is not a TOML entry like {TABLE_EXAMPLES.get(name)!r}: {e}"
            ) from None
    return out


def _merge(base: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """`base` updated with `new`, nested mappings merged key by key."""
    out = dict(base)
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            value = _merge(out[key], value)
        out[key] = value
    return out


def _number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number; got {text!r}") from None


def _split(value: Any, flag: str = "--dataset", unique: bool = True) -> list[Any]:
    """`None` -> `[None]`; "a, b" -> ["a", "b"] (an empty item, or a repeated one where
    `unique`, is a `ValueError` naming `flag`)."""
    if value is None:
        return [None]
    return list(split_list(flag, str(value), unique=unique))


def configs_from_args(args: argparse.Namespace) -> list[ExperimentConfig]:
    """One `ExperimentConfig` per (case, dataset): the cases are the zipped grid of the
    `--gamma-th` and `--target` lists (`experiment.grid.expand`; a single value is used for every
    case), in paper Table II order (case-major)."""

    datasets = _split(getattr(args, "dataset", None))
    gammas = _split(getattr(args, "gamma_th", None), "--gamma-th", unique=False)  # zipped
    targets = _split(getattr(args, "target", None), "--target", unique=False)
    num_cases = max(len(gammas), len(targets))
    for name, values in (("gamma_th", gammas), ("target", targets)):
        if len(values) not in (1, num_cases):
            raise ValueError(
                f"{name}: give one value or one per case ({num_cases}); got {len(values)}"
            )
    per_dataset = []
    for dataset in datasets:
        one = argparse.Namespace(**vars(args))
        one.dataset, one.gamma_th, one.target = dataset, gammas[0], targets[0]
        base = config_from_args(one)
        grid: dict[str, list[Any]] = {}
        if len(gammas) > 1:
            grid["gamma_th"] = [_number("gamma_th", g) for g in gammas]
        if len(targets) > 1:
            grid["target"] = [_target(t) for t in targets]
        if grid:
            grid = {k: v * (num_cases // len(v)) for k, v in grid.items()}
        specs = expand(base, [base.seed], grid, zip=True)
        per_dataset.append([run_config(base, spec) for spec in specs])
    return [cfgs[k] for k in range(num_cases) for cfgs in per_dataset]


def _target(text: Any) -> int | str:
    if text is None or text == "random":
        return "random" if text == "random" else 0
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"target must be an integer or 'random'; got {text!r}") from None


def _write_case(result: Result, out: Path, args: argparse.Namespace) -> list[Path]:
    """One case's results JSON, learning curve and pi plot into `out`; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    result.save(out / RESULTS)
    written = [out / RESULTS, *([out / ARRAYS] if result.compact else [])]
    if not args.no_plot:
        png = plot_learning_curves(result, out / CURVE)
        if png is None:
            print(MISSING, file=sys.stderr)
        else:
            written.append(png)
            pi_png = plot_pi_history(result, out / PI_PLOT)
            if pi_png is not None:
                written.append(pi_png)
    remove_stale_outputs(out, written)
    return written


def _run_all(
    configs: list[ExperimentConfig], out: Path, args: argparse.Namespace
) -> tuple[list[Result], Path | None]:
    """Every config as one job (`pfedwn_jax.api.run`), checkpointed in `out/checkpoint`;
    `(results, checkpoint directory or None)`."""

    every = args.checkpoint_every
    if every < 0:
        raise ValueError(f"--checkpoint-every must be >= 0 (0: no checkpoint); got {every}")
    if every == 0 and args.resume:
        raise ValueError("--resume needs a checkpoint: --checkpoint-every must be >= 1; got 0")
    checkpoint = out / CHECKPOINT if every else None
    writers = writers_from_args(args, out)
    try:
        results = api.run(
            list(configs),
            progress=not args.quiet,
            checkpoint=checkpoint,
            resume=args.resume,
            overwrite=args.overwrite,
            checkpoint_every=max(every, 1),
            on_divergence="continue" if args.keep_going_on_divergence else "stop",
            writers=writers,
            save_models=models_dir(args, out),
        )
    except KeyboardInterrupt:
        if checkpoint is not None and checkpoint.exists():
            print(
                f"checkpoint kept: continue with `pfedwn run ... --out {out} --resume`",
                file=sys.stderr,
            )
        raise
    return results, checkpoint


def remove_stale_outputs(out: Path, written: Iterable[Path]) -> list[Path]:
    """Remove the `OUTPUTS` files in `out` that are not in `written` (a previous run's)."""
    keep = {Path(p) for p in written}
    stale = [out / name for name in OUTPUTS if out / name not in keep and (out / name).is_file()]
    for path in stale:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return stale


def _case_dir(k: int, config: ExperimentConfig, several_cases: bool) -> str:
    name = config.dataset or "default"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return f"case{k + 1}_{safe}" if several_cases else safe


def _join() -> None:
    """Several hosts (`JAX_COORDINATOR_ADDRESS` set, as for `pfedwn sweep`): join the job, so
    the slots of each run are split over every process's devices."""
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        distributed.initialize()


def main(args: argparse.Namespace) -> int:
    _join()
    out: Path = check_writable_dir(args.out, "--out")
    configs = refuse_eps_flag(args.eps, lambda: configs_from_args(args))
    done = _finished(configs, out, args) if args.resume else None
    if done is not None:  # a finished job has no checkpoint left: nothing runs again
        print(f"nothing to resume: the job in {out} finished; its results: " + ", ".join(done))
        return 0
    for name in (RESULTS, ARRAYS, CURVE, PI_PLOT, TABLE, CASES):  # before any training
        check_writable_file(out / name, "output file")
    results, checkpoint = _run_all(configs, out, args)
    if not is_writer():  # every process ran the same job; process 0 writes it
        return 0
    if len(configs) == 1:
        written = _write_case(results[0], out, args)
        if checkpoint is not None:  # once every result is written
            remove(checkpoint)
        print(format_table(results[0]))
        total = results[0].timings["total_s"]
        print(f"total {total:.1f} s; wrote " + ", ".join(map(str, written)))
        _say_kept(args, out)
        return _status(results)
    num_datasets = len(_split(getattr(args, "dataset", None)))
    several_cases = len(configs) > num_datasets
    dirs = _case_dirs(configs, out, args)
    for result, sub in zip(results, dirs, strict=True):
        _write_case(result, sub, args)
        print(format_table(result), "\n")
    labels = [
        (f"case {i // num_datasets + 1}: " if several_cases else "") + result.data["name"]
        for i, result in enumerate(results)
    ]
    text = _write_cases(results, labels, dirs, out)
    if checkpoint is not None:  # once every result is written
        remove(checkpoint)
    print(text, end="")
    total = results[-1].timings["total_s"]
    print(f"total {total:.1f} s; wrote {out / TABLE}, {out / CASES} and one directory per case")
    _say_kept(args, out)
    return _status(results)


def _case_dirs(configs: list[ExperimentConfig], out: Path, args: argparse.Namespace) -> list[Path]:
    """Each case's directory of a job of several configs."""
    num_datasets = len(_split(getattr(args, "dataset", None)))
    several_cases = len(configs) > num_datasets
    return [out / _case_dir(i // num_datasets, c, several_cases) for i, c in enumerate(configs)]


def _finished(
    configs: list[ExperimentConfig], out: Path, args: argparse.Namespace
) -> list[str] | None:
    """The results files of `configs` in `out` when the job wrote them all and left no
    checkpoint (it finished), else None."""
    if (out / CHECKPOINT).is_dir() and holds_checkpoint(out / CHECKPOINT):
        return None
    one = len(configs) == 1
    paths = [out / RESULTS] if one else [d / RESULTS for d in _case_dirs(configs, out, args)]
    for path, config in zip(paths, configs, strict=True):
        try:
            if Result.load(path).config.to_dict() != config.to_dict():
                return None
        except (OSError, ValueError, KeyError):
            return None
    return [str(p) for p in paths]


def _say_kept(args: argparse.Namespace, out: Path) -> None:
    """Where `--save-models` and `--log-to` wrote (nothing without them)."""
    if getattr(args, "save_models", False):
        print(f"models: {out / MODELS} (pfedwn_jax.load_models)")
    if getattr(args, "log_to", None):
        print(f"logs ({args.log_to}): {args.log_dir or out / LOGS}")


def _write_cases(results: list[Result], labels: list[str], dirs: list[Path], out: Path) -> str:
    """`table.txt` (the cases side by side) and `cases.json` (where each case is)."""
    table = format_table_cases(results, labels)
    legend = [
        f"{lbl}: gamma_th {r.config.gamma_th:g}, target {r.network.get('target')}, "
        f"{len(r.network.get('selected_neighbors', []))} selected neighbor(s)"
        for lbl, r in zip(labels, results, strict=True)
    ]
    text = table + "\n" + "\n".join(legend) + "\n"
    atomic_write_text(out / TABLE, text)
    cases = [
        {
            "label": lbl,
            "dir": str(d.relative_to(out)),
            "config": r.config.to_dict(),
            "summary": r.summary(),
        }
        for lbl, d, r in zip(labels, dirs, results, strict=True)
    ]
    atomic_write_json(out / CASES, {"cases": cases})
    remove_stale_outputs(out, [out / TABLE, out / CASES])
    return text


def _status(results: list[Result]) -> int:
    """`EXIT_DIVERGED` when a method diverged in any result (named on stderr), else 0."""
    bad = [
        f"{name} (round {m['diverged']['round']})"
        for r in results
        for name, m in r.methods.items()
        if m.get("diverged")
    ]
    if not bad:
        return 0
    print(f"pfedwn run: diverged: {', '.join(bad)}; results written", file=sys.stderr)
    return EXIT_DIVERGED
