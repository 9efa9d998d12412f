"""One method on `mnist-full`'s Case 1 (the config of the method's first row of
docs/results/mnist-full/table2.csv; Local by default): one run at a few learning rates (the
first compiles) and one 10-run sweep (seeds 0-4 x lr {0.03, 0.1}, one program), wall
seconds. Run it from two checkouts in the same minute to compare code versions on the
Table II workload:

    PYTHONPATH=CHECKOUT python benchmarks/bench_local_sweep.py --label NAME [--method M]
        [--out FILE.json]

`--set KEY=VALUE` changes a config field (e.g. `--set link_model=physical`: links drawn from
the channel every round).
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

from bench_scaling import setting

import pfedwn_jax
from pfedwn_jax.experiment import ExperimentConfig

TABLE = Path(__file__).resolve().parents[1] / "docs/results/mnist-full/table2.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--method", default="local", help="a method of the table")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="another config field"
    )
    args = parser.parse_args()
    rows = list(csv.DictReader(TABLE.open()))
    methods = sorted({r["method"] for r in rows})
    if args.method not in methods:
        parser.error(f"--method must be one of {methods}; got {args.method!r}")
    base = json.loads(next(r for r in rows if r["method"] == args.method)["config"])
    base |= dict(setting(s) for s in args.set)
    out: dict = {"label": args.label, "method": args.method, "set": args.set, "run_s": {}}
    for lr in (0.1, 0.03):
        start = time.perf_counter()
        pfedwn_jax.run(ExperimentConfig.from_dict({**base, "lr": lr}), progress=False)
        out["run_s"][str(lr)] = round(time.perf_counter() - start, 1)
    start = time.perf_counter()
    pfedwn_jax.sweep(
        ExperimentConfig.from_dict(base), seeds="0-4", grid={"lr": [0.03, 0.1]},
        progress=False, max_runs=10,
    )  # fmt: skip
    out["sweep_10_runs_s"] = round(time.perf_counter() - start, 1)
    print(json.dumps(out))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
