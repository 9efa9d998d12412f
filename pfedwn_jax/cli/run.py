"""`pfedwn run`: run FL methods on one wireless network and print a Table II-style table.

Writes `DIR/results.json` (schema in docs/experiments.md), `DIR/learning_curve.png` and, when
pFedWN runs, `DIR/pi_history.png` (its EM weights, the paper's Fig. 8).
Values come from the defaults, then `--config file.toml`, then the flags given.

Several cases: `--dataset a,b` and/or `--gamma-th 5,10,15` (with `--target` either one value
or one per gamma_th) run every case (gamma_th, target) on every dataset, each into its own
`DIR/<case>/` directory, and print the paper's Table II layout with one column per
case/dataset (also written to `DIR/table.txt`, with `DIR/cases.json` listing the runs).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

# flag -> (config field, type, help)
FLAGS: dict[str, tuple[str, Any, str]] = {
    "--dataset": (
        "dataset",
        str,
        "dataset name(s), comma-separated for several columns (default: the embedded MNIST subset)",
    ),
    "--data-dir": ("data_dir", str, "TFDS data directory"),
    "--partition": ("partition", str, "partition scheme (default: paper)"),
    "--model": ("model", str, "cnn, resnet18, mlp or logreg"),
    "--algorithms": ("algorithms", str, "comma-separated methods (default: all registered)"),
    "--rounds": ("rounds", int, "communication rounds"),
    "--local-epochs": ("local_epochs", int, "local epochs per round"),
    "--batch-size": ("batch_size", int, "local batch size"),
    "--lr": ("lr", float, "SGD learning rate"),
    "--seed": ("seed", int, "seed of initialisation, batches and partition"),
    "--mode": ("mode", str, "single (one target, the paper) or network (every client)"),
    "--num-neighbors": ("num_neighbors", int, "neighbors around the target"),
    "--gamma-th": ("gamma_th", str, "SINR threshold(s), comma-separated for several cases"),
    "--eps": ("eps", float, "P_err selection threshold"),
    "--moments": ("moments", str, "moment mode of the error probability"),
    "--topology-seed": ("topology_seed", int, "seed of the node placement"),
    "--target": ("target", str, "target data client index or 'random' (one per case)"),
}

RESULTS = "results.json"
CURVE = "learning_curve.png"
PI_PLOT = "pi_history.png"
TABLE = "table.txt"
CASES = "cases.json"
CHECKPOINT = "checkpoint.npz"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run",
        help="run FL methods on a wireless network, print a table, save JSON and a plot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, help="TOML file of ExperimentConfig fields")
    defaults = _config_defaults()
    for flag, (field, typ, text) in FLAGS.items():
        shown = defaults.get(field)
        if shown is not None and "default" not in text:
            text = f"{text} (default: {shown})"
        p.add_argument(flag, dest=field, type=typ, default=None, help=text)
    p.add_argument(
        "--out",
        type=Path,
        default=Path("runs/latest"),
        help="output directory (default: runs/latest)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from DIR/checkpoint.npz (same config) if it exists",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--no-plot", action="store_true", help="skip the learning-curve PNG")
    p.set_defaults(func=main)


def _config_defaults() -> dict[str, Any]:
    import dataclasses

    from pfedwn_jax.experiment.config import ExperimentConfig

    return {
        f.name: f.default
        for f in dataclasses.fields(ExperimentConfig)
        if f.default is not dataclasses.MISSING
    }


def config_from_args(args: argparse.Namespace):
    """`ExperimentConfig` from defaults, `--config` and the flags (flags win)."""
    from pfedwn_jax.experiment import ExperimentConfig

    overrides: dict[str, Any] = {}
    for field, _, _ in FLAGS.values():
        value = getattr(args, field, None)
        if value is not None:
            overrides[field] = value
    if isinstance(overrides.get("gamma_th"), str):
        overrides["gamma_th"] = _number("gamma_th", overrides["gamma_th"])
    target = overrides.get("target")
    if target is not None and target != "random":
        try:
            overrides["target"] = int(target)
        except ValueError:
            raise ValueError(f"target must be an integer or 'random'; got {target!r}") from None
    if args.config is not None:
        return ExperimentConfig.from_toml(args.config, **overrides)
    return ExperimentConfig(**overrides)


def _number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number; got {text!r}") from None


def _split(value: Any) -> list[Any]:
    """`None` -> `[None]`; "a, b" -> ["a", "b"]."""
    if value is None:
        return [None]
    items = [v.strip() for v in str(value).split(",") if v.strip()]
    return items or [None]


def configs_from_args(args: argparse.Namespace) -> list:
    """One `ExperimentConfig` per (case, dataset): cases are the zipped `--gamma-th` and
    `--target` lists (a single value is used for every case), in paper Table II order."""
    datasets = _split(getattr(args, "dataset", None))
    gammas = _split(getattr(args, "gamma_th", None))
    targets = _split(getattr(args, "target", None))
    num_cases = max(len(gammas), len(targets))
    for name, values in (("gamma_th", gammas), ("target", targets)):
        if len(values) not in (1, num_cases):
            raise ValueError(
                f"{name}: give one value or one per case ({num_cases}); got {len(values)}"
            )
    configs = []
    for k in range(num_cases):
        for dataset in datasets:
            one = argparse.Namespace(**vars(args))
            one.dataset = dataset
            one.gamma_th = gammas[k if len(gammas) > 1 else 0]
            one.target = targets[k if len(targets) > 1 else 0]
            configs.append(config_from_args(one))
    return configs


def _run_one(config: Any, out: Path, args: argparse.Namespace) -> tuple[Any, list[Path]]:
    """Run one experiment into `out`: results JSON, learning curve and pi plot."""
    from pfedwn_jax.experiment import plot_learning_curves, plot_pi_history, run

    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / CHECKPOINT
    if checkpoint.exists() and not args.resume:
        checkpoint.unlink()
    try:
        result = run(config, progress=not args.quiet, checkpoint=checkpoint, resume=args.resume)
    except KeyboardInterrupt:
        if checkpoint.exists():
            print(
                f"checkpoint kept: continue with `pfedwn run ... --out {out} --resume`",
                file=sys.stderr,
            )
        raise
    result.save(out / RESULTS)
    with contextlib.suppress(FileNotFoundError):
        checkpoint.unlink()
    written = [out / RESULTS]
    if not args.no_plot:
        png = plot_learning_curves(result, out / CURVE)
        if png is None:
            print("(matplotlib not installed: no plots)", file=sys.stderr)
        else:
            written.append(png)
            pi_png = plot_pi_history(result, out / PI_PLOT)
            if pi_png is not None:
                written.append(pi_png)
    return result, written


def _case_dir(k: int, config: Any, several_cases: bool) -> str:
    name = config.dataset or "default"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return f"case{k + 1}_{safe}" if several_cases else safe


def main(args: argparse.Namespace) -> int:
    from pfedwn_jax.experiment import format_table, format_table_cases
    from pfedwn_jax.experiment.io import atomic_write_json, atomic_write_text

    configs = configs_from_args(args)
    out: Path = args.out
    if len(configs) == 1:
        result, written = _run_one(configs[0], out, args)
        print(format_table(result))
        print(f"total {result.timings['total_s']:.1f} s; wrote " + ", ".join(map(str, written)))
        return 0

    num_datasets = len(_split(getattr(args, "dataset", None)))
    several_cases = len(configs) > num_datasets
    results, dirs, total = [], [], 0.0
    for i, config in enumerate(configs):
        sub = out / _case_dir(i // num_datasets, config, several_cases)
        result, _ = _run_one(config, sub, args)
        print(format_table(result), "\n")
        results.append(result)
        dirs.append(sub)
        total += result.timings["total_s"]
    labels = [
        (f"case {i // num_datasets + 1}: " if several_cases else "") + result.data["name"]
        for i, result in enumerate(results)
    ]
    table = format_table_cases(results, labels)
    legend = [
        f"{lbl}: gamma_th {r.config.gamma_th:g}, target {r.network.get('target')}, "
        f"{len(r.network.get('selected_neighbors', []))} selected neighbor(s)"
        for lbl, r in zip(labels, results, strict=True)
    ]
    text = table + "\n" + "\n".join(legend) + "\n"
    atomic_write_text(out / TABLE, text)
    atomic_write_json(
        out / CASES,
        {
            "cases": [
                {
                    "label": lbl,
                    "dir": str(d.relative_to(out)),
                    "config": r.config.to_dict(),
                    "summary": r.summary(),
                }
                for lbl, d, r in zip(labels, dirs, results, strict=True)
            ]
        },
    )
    print(text, end="")
    print(f"total {total:.1f} s; wrote {out / TABLE}, {out / CASES} and one directory per case")
    return 0
