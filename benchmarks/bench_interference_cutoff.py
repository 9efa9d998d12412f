"""Truncation error of the interference cutoff: "radius" / "nearest" against the full sum.

Networks small enough for interference="all" (N = 100, 300, 1000 nodes, uniform in a square
at a fixed node density, default the demo's 11 nodes per 50 m x 50 m), each node's K = 10
nearest as candidate links, Table I channel, "paper" moments, float32. For each cutoff:
max / mean / 99th-percentile |P_err(cutoff) - P_err(all)| over all candidate links of all
seeds, and the fraction of links whose selection `P_err < eps` changes; each with the far
nodes dropped (tail "none") or replaced by their mean field (tail "mean"). Writes JSON (--out)
and prints a table.

    python benchmarks/bench_interference_cutoff.py [--sizes 100,300,1000] [--seeds 3]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time

import numpy as np

from pfedwn_jax.io import atomic_write_json
from pfedwn_jax.wireless import ChannelParams, candidate_neighbors, sparse_error_probability

DEMO_DENSITY = 11 / 50.0**2  # nodes per m^2 of the default network (10 neighbors + target)


def placement(num_nodes: int, density: float, seed: int) -> np.ndarray:
    """[N, 2] uniform positions in the square of side sqrt(N / density) metres."""
    side = math.sqrt(num_nodes / density)
    return np.random.default_rng(seed).uniform(0.0, side, (num_nodes, 2))


def compare(approx: np.ndarray, exact: np.ndarray, mask: np.ndarray, eps: float) -> dict:
    """Errors of `approx` against `exact` [N, K] over the candidate links `mask`."""
    err = np.abs(approx - exact)[mask]
    flips = ((approx < eps) != (exact < eps))[mask]
    return {
        "max_abs": float(err.max()),
        "mean_abs": float(err.mean()),
        "p99_abs": float(np.quantile(err, 0.99)),
        "decision_flips": float(flips.mean()),
        "links": int(mask.sum()),
    }


def cutoffs(args: argparse.Namespace) -> list[dict]:
    """The truncations measured: radius cutoffs (m) and nearest-I counts, each tail mode."""
    radius = [{"interference": "radius", "cutoff": c} for c in args.radii]
    nearest = [{"interference": "nearest", "num_interferers": i} for i in args.nearest]
    return [{**m, "tail": t} for m in radius + nearest for t in args.tails]


def measure(args: argparse.Namespace) -> list[dict]:
    """Rows: one per (N, gamma_th, truncation), pooled over seeds."""
    params, rows = ChannelParams(), []
    for n in args.sizes:
        pooled: dict = {}
        for seed in range(args.seeds):
            xy = placement(n, args.density, seed)
            idx, mask = candidate_neighbors(xy, k=args.k)
            for g in args.gamma_th:
                exact = np.asarray(sparse_error_probability(xy, idx, mask, g, params))
                for mode in cutoffs(args):
                    if mode.get("num_interferers", 0) >= n:
                        continue
                    p = np.asarray(sparse_error_probability(xy, idx, mask, g, params, **mode))
                    key = (g, *mode.items())
                    pooled.setdefault(key, []).append((p, exact, mask))
        for (g, *mode), runs in pooled.items():
            p, e, m = (np.concatenate(x) for x in zip(*runs, strict=True))
            rows.append({"num_nodes": n, "gamma_th": g, **dict(mode), **compare(p, e, m, args.eps)})
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'N':>5} {'gamma':>5} {'truncation':>14} {'tail':>5} {'max|dP|':>9} {'mean|dP|':>9} "
          f"{'p99|dP|':>9} {'flips':>7}")  # fmt: skip
    for r in rows:
        what = (
            f"r={r['cutoff']:g} m" if r["interference"] == "radius" else f"I={r['num_interferers']}"
        )
        print(
            f"{r['num_nodes']:>5} {r['gamma_th']:>5g} {what:>14} {r['tail']:>5} "
            f"{r['max_abs']:>9.2e} {r['mean_abs']:>9.2e} {r['p99_abs']:>9.2e} "
            f"{r['decision_flips']:>7.2%}"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ints = lambda s: [int(x) for x in s.split(",")]
    floats = lambda s: [float(x) for x in s.split(",")]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=ints, default=[100, 300, 1000])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--density", type=float, default=DEMO_DENSITY, help="nodes per m^2")
    ap.add_argument("--k", type=int, default=10, help="candidate links per node")
    ap.add_argument("--gamma-th", type=floats, default=[5.0, 15.0])
    ap.add_argument("--eps", type=float, default=0.05)
    ap.add_argument("--radii", type=floats, default=[25.0, 50.0, 100.0, 150.0, 200.0])
    ap.add_argument("--nearest", type=ints, default=[10, 30, 100, 300])
    ap.add_argument("--tails", type=lambda s: s.split(","), default=["none", "mean"])
    ap.add_argument("--out", default="benchmarks/results/bench_interference_cutoff.json")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    rows = measure(args)
    print_table(rows)
    meta = {k: v for k, v in vars(args).items() if k != "out"}
    result = {
        "benchmark": "interference_cutoff",
        "settings": meta,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "seconds": time.perf_counter() - start,
        "rows": rows,
    }
    print(f"wrote {atomic_write_json(args.out, result, indent=2)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
