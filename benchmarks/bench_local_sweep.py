"""Local on `mnist-full`'s Case 1 (the config of the first `local` row of
docs/results/mnist-full/table2.csv): one run at a few learning rates (the first compiles) and
one 10-run sweep (seeds 0-4 x lr {0.03, 0.1}, one program), wall seconds. Run it from two
checkouts in the same minute to compare code versions on the Table II workload:

    PYTHONPATH=CHECKOUT python benchmarks/bench_local_sweep.py --label NAME [--out FILE.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import pfedwn_jax
from pfedwn_jax.experiment import ExperimentConfig

TABLE = Path(__file__).resolve().parents[1] / "docs/results/mnist-full/table2.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = list(csv.DictReader(TABLE.open()))
    base = json.loads(next(r for r in rows if r["method"] == "local")["config"])
    out: dict = {"label": args.label, "run_s": {}}
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
