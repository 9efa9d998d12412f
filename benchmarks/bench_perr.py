"""Throughput of the vectorized P_err quadrature vs scipy.integrate.quad link by link.

Same links for both, measured side by side in one run: the vectorized `error_probability`
(float32 and float64, one jitted call for all links, compile excluded, best of several
repeats) against `scipy.integrate.quad` of the same integrand per link (the reference in
`pfedwn_jax.wireless.reference`, tolerances epsabs 1e-14 / epsrel 1e-12; only the quad call
is timed, the interference moments it needs are precomputed, which favours scipy).
Writes a table to stdout and JSON to --out.

    python benchmarks/bench_perr.py [--targets 20000] [--scipy-links 300] [--out runs/...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from pfedwn_jax.wireless import ChannelParams, error_probability
from pfedwn_jax.wireless.reference import link_integral, link_statistics


def _topologies(targets: int, neighbors: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    area = ChannelParams().area_m
    return rng.uniform(0, area, (targets, 2)), rng.uniform(0, area, (targets, neighbors, 2))


def _time_vectorized(t: np.ndarray, nb: np.ndarray, gamma_th: float, moments: str,
                     repeats: int) -> tuple[float, np.ndarray]:
    out = error_probability(t, nb, gamma_th, moments=moments).block_until_ready()  # compile
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        out = error_probability(t, nb, gamma_th, moments=moments).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return best, np.asarray(out, np.float64)


def _time_scipy(t: np.ndarray, nb: np.ndarray, gamma_th: float, moments: str,
                num_targets: int) -> tuple[float, np.ndarray, int]:
    params = ChannelParams()
    stats = [link_statistics(t[i], nb[i], params, moments) for i in range(num_targets)]
    vals, elapsed = [], 0.0
    for c, mean, var in stats:
        for s in range(len(c)):
            start = time.perf_counter()
            vals.append(link_integral(c[s], mean[s], var[s], gamma_th, params))
            elapsed += time.perf_counter() - start
    return elapsed, np.array(vals).reshape(num_targets, -1), len(vals)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=20000, help="targets for the JAX timing")
    ap.add_argument("--neighbors", type=int, default=10)
    ap.add_argument("--scipy-links", type=int, default=300, help="links timed with quad")
    ap.add_argument("--gamma-th", type=float, default=10.0)
    ap.add_argument("--moments", default="paper")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/bench_perr.json")
    args = ap.parse_args(argv)

    t, nb = _topologies(args.targets, args.neighbors, args.seed)
    n_scipy = max(1, args.scipy_links // args.neighbors)
    sp_time, sp_vals, sp_links = _time_scipy(t, nb, args.gamma_th, args.moments, n_scipy)
    sp_rate = sp_links / sp_time
    rows = []
    for name, x64 in (("float32", False), ("float64", True)):
        with jax.enable_x64(x64):
            secs, vals = _time_vectorized(t, nb, args.gamma_th, args.moments, args.repeats)
        rate = t.shape[0] * args.neighbors / secs
        rows.append({
            "dtype": name, "links": int(t.shape[0] * args.neighbors), "seconds": secs,
            "links_per_s": rate, "speedup_vs_scipy": rate / sp_rate,
            "max_abs_diff_vs_scipy": float(np.max(np.abs(vals[:n_scipy] - sp_vals))),
        })
    result = {
        "benchmark": "perr_quadrature", "moments": args.moments, "gamma_th": args.gamma_th,
        "neighbors_per_target": args.neighbors,
        "scipy": {"links": sp_links, "seconds": sp_time, "links_per_s": sp_rate},
        "vectorized": rows,
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "jax": jax.__version__,
                    "backend": jax.default_backend()},
    }
    print(f"scipy quad, link by link: {sp_links} links in {sp_time:.2f} s "
          f"= {sp_rate:,.0f} links/s")
    print(f"{'dtype':8} {'links':>9} {'seconds':>9} {'links/s':>14} {'x scipy':>9} "
          f"{'max |diff|':>11}")
    for r in rows:
        print(f"{r['dtype']:8} {r['links']:>9} {r['seconds']:>9.4f} {r['links_per_s']:>14,.0f} "
              f"{r['speedup_vs_scipy']:>9.0f} {r['max_abs_diff_vs_scipy']:>11.1e}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=out.parent, delete=False, suffix=".tmp") as f:
        json.dump(result, f, indent=2)
    os.replace(f.name, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
