"""The robustness experiment: target accuracy vs gamma_th, eps, link loss and node speed.

For pFedWN and every baseline, with and without channel-aware selection, several seeds with
95% intervals (`pfedwn_jax.experiment.robustness`; docs/robustness.md, "Results").

    python scripts/robustness.py --preset small --out docs/img/robustness
    python scripts/robustness.py --preset gpu --out runs/robustness --only gamma,speed

Writes runs.csv (every number with its seed and config), summary.csv, robustness.json and
robustness.png into --out.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pfedwn_jax.experiment.robustness import AXES, PRESETS, parse_axes, run_robustness


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--preset",
        choices=list(PRESETS),
        default="small",
        help="small: 2-core CPU, < 15 min; gpu: larger; tiny: smoke test",
    )
    p.add_argument("--out", required=True, help="output directory")
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
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import pfedwn_jax

    pfedwn_jax.use_cpu_devices(args.cpu_devices)
    res = run_robustness(
        args.preset,
        parse_axes(args.only),
        seeds=None if args.seeds is None else [int(s) for s in args.seeds.split(",")],
        methods=None if args.methods is None else args.methods.split(","),
        progress=args.progress,
    )
    for name, path in res.save(args.out).items():
        print(f"wrote {name}: {path}")
    print(
        f"{res.meta['distinct_runs']} distinct runs in {res.meta['wall_s']:.0f} s "
        f"(load average before/after: {res.meta['loadavg_before'][0]:.1f} / "
        f"{res.meta['loadavg_after'][0]:.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
