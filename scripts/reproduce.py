"""Reproduce the paper's tables and figures: `python scripts/reproduce.py --only table2,fig8
--preset quick --out runs/repro`. A thin CLI over `pfedwn_jax.reproduce.learning.reproduce`
(the wireless figures come from `pfedwn_jax.reproduce.wireless_figs` where it is installed).

Presets: `tiny` (seconds, a test), `quick` (2 CPU cores, under 20 minutes, the shared real
data, MLPs) and `paper` (TFDS full datasets, CNN/ResNet18, 100 rounds: a GPU). Writes PNG
figures, CSV/JSON tables with the config and seed of every number, and `OUT/REPORT.md`.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    from pfedwn_jax.reproduce.learning import ALL_ITEMS, PRESETS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="all", help=f"comma-separated items of {list(ALL_ITEMS)}")
    ap.add_argument("--preset", default="quick", choices=sorted(PRESETS))
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument(
        "--cpu-devices", type=int, default=None, help="JAX CPU devices (default: cores)"
    )
    args = ap.parse_args(argv)

    import pfedwn_jax

    pfedwn_jax.use_cpu_devices(args.cpu_devices)
    from pfedwn_jax.reproduce.learning import reproduce

    t0 = time.perf_counter()
    try:
        result = reproduce(args.only, args.preset, args.out)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {result['report']} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
