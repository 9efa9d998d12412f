"""Reproduce the paper's tables and figures: `python scripts/reproduce.py --only table2,fig8
--preset quick --out runs/repro`. A thin CLI over `pfedwn_jax.reproduce.learning.reproduce`
(the wireless figures come from `pfedwn_jax.reproduce.wireless_figs` where it is installed).

Presets: `tiny` (seconds, a test), `quick` (2 CPU cores, under 20 minutes, the shared real
data subsets, MLPs), `mnist-full` (full MNIST, Table II in under an hour on 2 CPU cores; the
CNN where JAX has an accelerator) and `paper` (full datasets, CNN/ResNet18, 100 rounds: a
GPU). `--data-dir DIR` reads every dataset of the preset from DIR (`mnist.npz`,
`cifar10.npz`, `cifar100.npz`, or TFDS data prepared there), so a machine without network
runs from files; `--criterion` overrides how the cases' targets are chosen; `--datasets`
keeps some of the preset's datasets (e.g. `MNIST`). `--only field` is the comparison table
of every registered method (or `--methods`), each tuned with the same budget
(`pfedwn_jax.reproduce.field`). Writes PNG figures, CSV/JSON tables with the config and
seed of every number, and `OUT/REPORT.md`.
Every argument, --out included, is checked before any work: a bad one ends the script with
one line and exit status 2 (as the `pfedwn` CLI).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pfedwn_jax.cli.common import OneLineParser, as_flag, check_out_dir, out_path, run_command

PROG = Path(__file__).name


def main(argv: list[str] | None = None) -> int:
    from pfedwn_jax.reproduce.cases import CRITERIA
    from pfedwn_jax.reproduce.learning import ALL_ITEMS, EXTRA_ITEMS
    from pfedwn_jax.reproduce.presets import PRESETS

    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only",
        default="all",
        help=f"comma-separated items of {list(ALL_ITEMS + EXTRA_ITEMS)} (all: all but the last)",
    )
    ap.add_argument(
        "--methods", default=None, help="the field table's methods, comma-separated (default: all)"
    )
    ap.add_argument("--preset", default="quick", choices=sorted(PRESETS))
    ap.add_argument("--out", required=True, type=out_path, help="output directory")
    ap.add_argument(
        "--data-dir", default=None, help="read the datasets from NAME.npz or TFDS data here"
    )
    ap.add_argument(
        "--criterion", default=None, choices=CRITERIA, help="cases' targets (default: preset's)"
    )
    ap.add_argument(
        "--datasets", default=None, help="only these of the preset's datasets, e.g. MNIST"
    )
    ap.add_argument(
        "--cpu-devices", type=int, default=None, help="JAX CPU devices (default: cores)"
    )
    args = ap.parse_args(argv)
    return run_command(PROG, lambda: run(args))


def run(args: argparse.Namespace) -> int:
    """Check every argument, then reproduce the items into --out."""
    import dataclasses

    from pfedwn_jax.reproduce.learning import parse_items
    from pfedwn_jax.reproduce.presets import get_preset, with_data_dir, with_datasets

    out = check_out_dir(args.out)
    as_flag("--only", "only", parse_items, args.only)
    methods = None if args.methods is None else [m.strip() for m in args.methods.split(",")]
    if methods is not None:
        from pfedwn_jax.reproduce.field import field_methods

        as_flag("--methods", "methods", field_methods, methods)
    if args.cpu_devices is not None and args.cpu_devices < 1:
        raise ValueError(f"--cpu-devices must be >= 1; got {args.cpu_devices}")
    preset = get_preset(args.preset)
    if args.data_dir is not None:
        preset = with_data_dir(preset, args.data_dir)
    if args.criterion is not None:
        preset = dataclasses.replace(preset, criterion=args.criterion)
    if args.datasets is not None:
        preset = as_flag("--datasets", "datasets", with_datasets, preset, args.datasets)
    import pfedwn_jax

    pfedwn_jax.use_cpu_devices(args.cpu_devices)
    from pfedwn_jax.reproduce.learning import reproduce

    t0 = time.perf_counter()
    result = reproduce(args.only, preset, out, methods=methods)
    print(f"wrote {result['report']} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
