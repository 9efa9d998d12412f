"""`pfedwn run`: run FL methods on one wireless network and print a Table II-style table.

Writes `DIR/results.json` (schema in docs/experiments.md) and `DIR/learning_curve.png`.
Values come from the defaults, then `--config file.toml`, then the flags given.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

# flag -> (config field, type, help)
FLAGS: dict[str, tuple[str, Any, str]] = {
    "--dataset": ("dataset", str, "dataset name (default: the embedded MNIST subset)"),
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
    "--gamma-th": ("gamma_th", float, "SINR threshold"),
    "--eps": ("eps", float, "P_err selection threshold"),
    "--moments": ("moments", str, "moment mode of the error probability"),
    "--topology-seed": ("topology_seed", int, "seed of the node placement"),
    "--target": ("target", str, "target data client index or 'random'"),
}

RESULTS = "results.json"
CURVE = "learning_curve.png"
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
    p.add_argument("--out", type=Path, default=Path("runs/latest"),
                   help="output directory (default: runs/latest)")
    p.add_argument("--resume", action="store_true",
                   help="continue from DIR/checkpoint.npz (same config) if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--no-plot", action="store_true", help="skip the learning-curve PNG")
    p.set_defaults(func=main)


def _config_defaults() -> dict[str, Any]:
    import dataclasses

    from pfedwn_jax.experiment.config import ExperimentConfig

    return {f.name: f.default for f in dataclasses.fields(ExperimentConfig)
            if f.default is not dataclasses.MISSING}


def config_from_args(args: argparse.Namespace):
    """`ExperimentConfig` from defaults, `--config` and the flags (flags win)."""
    from pfedwn_jax.experiment import ExperimentConfig

    overrides: dict[str, Any] = {}
    for field, _, _ in FLAGS.values():
        value = getattr(args, field, None)
        if value is not None:
            overrides[field] = value
    target = overrides.get("target")
    if target is not None and target != "random":
        try:
            overrides["target"] = int(target)
        except ValueError:
            raise ValueError(f"target must be an integer or 'random'; got {target!r}") from None
    if args.config is not None:
        return ExperimentConfig.from_toml(args.config, **overrides)
    return ExperimentConfig(**overrides)


def main(args: argparse.Namespace) -> int:
    from pfedwn_jax.experiment import format_table, plot_learning_curves, run

    config = config_from_args(args)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / CHECKPOINT
    if checkpoint.exists() and not args.resume:
        checkpoint.unlink()
    try:
        result = run(config, progress=not args.quiet, checkpoint=checkpoint,
                     resume=args.resume)
    except KeyboardInterrupt:
        if checkpoint.exists():
            print(f"checkpoint kept: continue with `pfedwn run ... --out {out} --resume`",
                  file=sys.stderr)
        raise
    result.save(out / RESULTS)
    with contextlib.suppress(FileNotFoundError):
        checkpoint.unlink()
    print(format_table(result))
    written = [out / RESULTS]
    if not args.no_plot:
        png = plot_learning_curves(result, out / CURVE)
        if png is None:
            print("(matplotlib not installed: no learning-curve plot)", file=sys.stderr)
        else:
            written.append(png)
    print(f"total {result.timings['total_s']:.1f} s; wrote " + ", ".join(map(str, written)))
    return 0
