"""Setup time and memory of a large network: placement + candidate links + sparse P_err.

For each N (default 100, 1,000, 10,000, 100,000) a fresh subprocess places N nodes uniformly
at a fixed density (default the demo's 11 per 50 m x 50 m, so the square grows with N), finds
each node's K nearest (`candidate_neighbors`) and their P_err with interference truncated at
--cutoff metres plus the mean field beyond it (--tail; `sparse_error_probability`, float32,
Table I). Each stage is run twice: the
first run includes JIT compilation ("cold"), the second is "warm". Peak memory is the
subprocess's max RSS (so it includes the ~0.3 GB of an imported JAX; the baseline after import
is reported too). For N <= --dense-max the dense `network_perr` (O(N^3)) is timed for
comparison. Writes JSON (--out), prints a table and the fitted growth exponent of the warm
total time (log-log least squares).

    python benchmarks/bench_network_setup.py [--sizes 100,1000,10000,100000] [--cutoff 100]
        [--tail mean]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

DEMO_DENSITY = 11 / 50.0**2  # nodes per m^2 of the default network


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: kB


def _timed(fn: object) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def one_size(n: int, density: float, k: int, cutoff: float, tail: str, dense: bool) -> dict:
    """Stage timings (cold, warm) and peak RSS for one network size (run in a subprocess)."""
    import jax

    from pfedwn_jax.wireless import (
        ChannelParams,
        candidate_neighbors,
        place_uniform,
        sparse_error_probability,
    )

    base = _rss_mb()
    params = ChannelParams(area_m=math.sqrt(n / density))

    def place() -> np.ndarray:
        t, nb = place_uniform(jax.random.key(0), n - 1, params)
        return np.concatenate([np.asarray(t)[None], np.asarray(nb)])

    def perr() -> np.ndarray:
        p = sparse_error_probability(
            xy, idx, mask, 5.0, params, interference="radius", cutoff=cutoff, tail=tail
        )
        return np.asarray(p)

    out: dict = {"num_nodes": n, "area_m": float(params.area_m), "baseline_rss_mb": base}
    for run in ("cold", "warm"):
        t_place, xy = _timed(place)
        t_cand, (idx, mask) = _timed(lambda: candidate_neighbors(xy, k=k))  # noqa: B023
        t_perr, p = _timed(perr)
        out[run] = {"place_s": t_place, "candidates_s": t_cand, "perr_s": t_perr}
        out[run]["total_s"] = t_place + t_cand + t_perr
    out["links"] = int(mask.sum())
    out["mean_perr"] = float(p[mask].mean())
    out["selected_per_node"] = float((p[mask] < 0.05).sum() / n)
    out["peak_rss_mb"] = _rss_mb()
    if dense:
        from pfedwn_jax.experiment.federation import network_perr

        t_dense, _ = _timed(lambda: network_perr(xy, 5.0, params, "paper"))
        out["dense_network_perr_s"] = t_dense
        out["peak_rss_with_dense_mb"] = _rss_mb()
    return out


def growth_exponent(sizes: list[int], seconds: list[float]) -> float:
    """Slope of log(seconds) against log(N) (least squares)."""
    return float(np.polyfit(np.log(sizes), np.log(seconds), 1)[0])


def run_sizes(args: argparse.Namespace) -> list[dict]:
    """One subprocess per size (clean peak memory), each printing its JSON row."""
    rows = []
    for n in args.sizes:
        cmd = [sys.executable, __file__, "--one", str(n), "--density", str(args.density)]
        cmd += ["--k", str(args.k), "--cutoff", str(args.cutoff), "--tail", args.tail]
        cmd += ["--dense"] if n <= args.dense_max else []
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print_row(rows[-1])
    return rows


def print_row(r: dict) -> None:
    w, c = r["warm"], r["cold"]
    dense = f"{r['dense_network_perr_s']:9.2f}" if "dense_network_perr_s" in r else f"{'-':>9}"
    print(
        f"{r['num_nodes']:>7} {r['area_m']:>7.0f} {w['place_s']:>8.3f} {w['candidates_s']:>8.3f} "
        f"{w['perr_s']:>8.3f} {w['total_s']:>8.3f} {c['total_s']:>8.3f} "
        f"{r['peak_rss_mb']:>8.0f} {r['baseline_rss_mb']:>6.0f} {dense}",
        flush=True,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ints = lambda s: [int(x) for x in s.split(",")]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=ints, default=[100, 1000, 10000, 100000])
    ap.add_argument("--density", type=float, default=DEMO_DENSITY, help="nodes per m^2")
    ap.add_argument("--k", type=int, default=10, help="candidate links per node")
    ap.add_argument("--cutoff", type=float, default=100.0, help="interference cutoff (m)")
    ap.add_argument("--tail", default="mean", help="far nodes beyond the cutoff: mean / none")
    ap.add_argument("--dense-max", type=int, default=1000, help="time network_perr up to this N")
    ap.add_argument("--out", default="benchmarks/results/bench_network_setup.json")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--dense", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one is not None:
        row = one_size(args.one, args.density, args.k, args.cutoff, args.tail, args.dense)
        print(json.dumps(row))
        return 0
    from pfedwn_jax.io import atomic_write_json

    print(f"{'N':>7} {'side m':>7} {'place':>8} {'cand':>8} {'perr':>8} {'warm s':>8} "
          f"{'cold s':>8} {'peak MB':>8} {'base':>6} {'dense s':>9}")  # fmt: skip
    rows = run_sizes(args)
    sizes = [r["num_nodes"] for r in rows]
    warm = [r["warm"]["total_s"] for r in rows]
    fits = {"all": growth_exponent(sizes, warm)} if len(rows) > 1 else {}
    big = [(n, s) for n, s in zip(sizes, warm, strict=True) if n >= 1000]
    if len(big) > 1:
        fits["from_1000"] = growth_exponent(*map(list, zip(*big, strict=True)))
    print("growth exponent of the warm setup time:", {k: round(v, 2) for k, v in fits.items()})
    result = {
        "benchmark": "network_setup",
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "one", "dense")},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "rows": rows,
        "growth_exponent_warm": fits,
    }
    print(f"wrote {atomic_write_json(args.out, result, indent=2)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
