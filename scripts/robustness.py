"""The robustness experiment: target accuracy vs gamma_th, eps, link loss and node speed.

For pFedWN and every baseline, with and without channel-aware selection, several seeds with
95% intervals (`pfedwn_jax.reproduce.robustness`; docs/robustness.md, "Results").

    python scripts/robustness.py --preset small --out docs/img/robustness
    python scripts/robustness.py --preset gpu --out runs/robustness --only gamma,speed

Writes runs.csv (every number with its seed and config), summary.csv, robustness.json and
robustness.png into --out. Every argument, --out included, is checked before any work: a
bad one ends the script with one line and exit status 2 (as the `pfedwn` CLI).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pfedwn_jax.cli.common import (
    OneLineParser,
    as_flag,
    check_out_dir,
    out_path,
    parse_methods,
    parse_seed_list,
    run_command,
)
from pfedwn_jax.reproduce.robustness import AXES, PRESETS, parse_axes, run_robustness

PROG = Path(__file__).name


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument(
        "--preset",
        choices=list(PRESETS),
        default="small",
        help="small: 2-core CPU, < 15 min; gpu: larger; tiny: smoke test",
    )
    p.add_argument("--out", required=True, type=out_path, help="output directory")
    p.add_argument("--only", default=",".join(AXES), help="axes, e.g. gamma,eps,loss,speed")
    p.add_argument("--seeds", default=None, help="replace the preset's seeds, e.g. 0,1,2")
    p.add_argument("--methods", default=None, help="replace the methods, e.g. local,pfedwn")
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        help="CPU devices (default: one per core); 1 turns it off",
    )
    p.add_argument("--progress", action="store_true", help="progress bars")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted study from its checkpoint (OUT/checkpoint)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="discard an interrupted study's checkpoint"
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_command(PROG, lambda: run(args))


def run(args: argparse.Namespace) -> int:
    """Check every argument, then run the experiment and write its files."""
    out = check_out_dir(args.out)
    axes = as_flag("--only", "only", parse_axes, args.only)
    seeds = None if args.seeds is None else parse_seed_list(args.seeds)
    methods = None if args.methods is None else parse_methods(args.methods)
    if args.cpu_devices is not None and args.cpu_devices < 1:
        raise ValueError(f"--cpu-devices must be >= 1; got {args.cpu_devices}")
    import pfedwn_jax

    pfedwn_jax.use_cpu_devices(args.cpu_devices)
    from pfedwn_jax.runner import checkpoint as ckpt

    where = out / "checkpoint"
    try:
        res = run_robustness(
            args.preset,
            axes,
            seeds=seeds,
            methods=methods,
            progress=args.progress,
            checkpoint=where,
            resume=args.resume,
            overwrite=args.overwrite,
        )
    except KeyboardInterrupt:
        if ckpt.holds_checkpoint(where):
            print(
                f"checkpoint kept: continue with `{PROG} ... --out {out} --resume`", file=sys.stderr
            )
        raise
    for name, path in res.save(out).items():
        print(f"wrote {name}: {path}")
    ckpt.remove(where)  # the study's files are written: its checkpoint is done
    print(
        f"{res.meta['distinct_runs']} distinct runs in {res.meta['wall_s']:.0f} s "
        f"(load average before/after: {res.meta['loadavg_before'][0]:.1f} / "
        f"{res.meta['loadavg_after'][0]:.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
