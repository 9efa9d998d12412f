"""Throughput of the vectorized P_err quadrature vs scipy.integrate.quad link by link.

Same links for both, measured side by side in one run: the public `error_probability`
(float32 and float64, one call for all links including host-side validation, compile
excluded) against `scipy.integrate.quad` of the same integrand link by link (the reference
in `pfedwn_jax.wireless.reference`, epsabs 1e-14 / epsrel 1e-12; only quad is timed, the
interference moments it needs are precomputed, which favours scipy). Timing rounds
interleave scipy and JAX so a busy machine slows both alike; within a round each side is
timed --best-of times and keeps its fastest; the speed-up is the median over rounds of
(JAX links/s) / (scipy links/s). Writes a table and JSON (--out).

    python benchmarks/bench_perr.py [--targets 20000] [--scipy-links 1400] [--out runs/...]
        [--fading nakagami:2] [--dtypes float32]

`--fading kind[:param]` times another fading model (`wireless.fading`; Rayleigh, the paper's,
by default): its P_err by Gauss-Legendre quadrature against scipy quad of the same integral
with scipy.stats' amplitude law (`reference.link_integral`).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import jax
import numpy as np

from pfedwn_jax.io import atomic_write_json
from pfedwn_jax.wireless import ChannelParams, Fading, error_probability
from pfedwn_jax.wireless.reference import QUAD_OPTS, link_integral, link_statistics


def _topologies(targets: int, neighbors: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    area = ChannelParams().area_m
    return rng.uniform(0, area, (targets, 2)), rng.uniform(0, area, (targets, neighbors, 2))


def channel(spec: str) -> ChannelParams:
    """Table I with the fading model `spec` ("rayleigh", "nakagami:2", "rician:4")."""
    kind, _, param = spec.partition(":")
    return ChannelParams(fading=Fading.of(kind, float(param) if param else None))


def _vectorized_seconds(
    t: np.ndarray, nb: np.ndarray, gamma_th: float, moments: str, x64: bool, params: ChannelParams
) -> tuple[float, np.ndarray]:
    """Wall time of one call (already compiled) and its result in float64."""
    with jax.enable_x64(x64):
        start = time.perf_counter()
        out = error_probability(t, nb, gamma_th, params, moments=moments).block_until_ready()
        return time.perf_counter() - start, np.asarray(out, np.float64)


def _scipy_seconds(stats: list, gamma_th: float, params: ChannelParams) -> tuple[float, np.ndarray]:
    """Wall time of quad over every link in `stats` (moments precomputed) and the values."""
    start = time.perf_counter()
    vals = [
        link_integral(c[s], mean[s], var[s], gamma_th, params)
        for c, mean, var in stats
        for s in range(len(c))
    ]
    return time.perf_counter() - start, np.array(vals).reshape(len(stats), -1)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=20000, help="targets for the JAX timing")
    ap.add_argument("--neighbors", type=int, default=10)
    ap.add_argument("--scipy-links", type=int, default=1400, help="links timed with quad")
    ap.add_argument("--gamma-th", type=float, default=10.0)
    ap.add_argument("--moments", default="paper")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    ap.add_argument(
        "--best-of",
        type=int,
        default=3,
        help="each round times scipy and JAX this often and keeps the fastest",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fading", default="rayleigh", help="kind[:param], e.g. rician:4")
    ap.add_argument("--dtypes", default="float32,float64", help="comma-separated")
    ap.add_argument("--out", default="runs/bench_perr.json")
    return ap.parse_args(argv)


def measure(args: argparse.Namespace) -> dict:
    """Interleaved rounds: scipy, then both JAX dtypes, so load changes hit all of them alike.

    Each round's scipy links are the first links of a fresh block of targets. Returns the raw
    per-round seconds, speed-ups and max differences.
    """
    t, nb = _topologies(args.targets, args.neighbors, args.seed)
    links = t.shape[0] * args.neighbors
    per_round = max(1, args.scipy_links // args.neighbors // args.rounds)
    params = channel(args.fading)
    dtypes = [(d, d == "float64") for d in args.dtypes.split(",")]
    for _, x64 in dtypes:  # compile every dtype before timing
        _vectorized_seconds(t, nb, args.gamma_th, args.moments, x64, params)
    m = {"links": links, "sp_secs": [], "sp_links": 0}
    m.update(vec_secs={d: [] for d, _ in dtypes}, speed={d: [] for d, _ in dtypes})
    m["diffs"] = {d: 0.0 for d, _ in dtypes}
    for r in range(args.rounds):
        idx = range(r * per_round, (r + 1) * per_round)
        stats = [link_statistics(t[i], nb[i], params, args.moments) for i in idx]
        runs = [_scipy_seconds(stats, args.gamma_th, params) for _ in range(args.best_of)]
        secs, ref = min(r[0] for r in runs), runs[0][1]
        m["sp_secs"].append(secs)
        m["sp_links"] += ref.size
        for name, x64 in dtypes:
            runs = [
                _vectorized_seconds(t, nb, args.gamma_th, args.moments, x64, params)
                for _ in range(args.best_of)
            ]
            vsecs, vals = min(r[0] for r in runs), runs[0][1]
            m["vec_secs"][name].append(vsecs)
            m["speed"][name].append((links / vsecs) / (ref.size / secs))
            diff = float(np.max(np.abs(vals[idx.start : idx.stop] - ref)))
            m["diffs"][name] = max(m["diffs"][name], diff)
    return m


def summarize(args: argparse.Namespace, m: dict) -> dict:
    """The JSON result: one row per dtype, the scipy baseline and the machine."""
    rows = []
    for name in m["vec_secs"]:
        secs, speed = m["vec_secs"][name], m["speed"][name]
        rows.append(
            {
                "dtype": name,
                "links": m["links"],
                "seconds_best": min(secs),
                "seconds_median": float(np.median(secs)),
                "links_per_s": m["links"] / min(secs),
                "speedup_median": float(np.median(speed)),
                "speedup_min": float(np.min(speed)),
                "speedup_max": float(np.max(speed)),
                "max_abs_diff_vs_scipy": m["diffs"][name],
            }
        )
    sp_secs = sum(m["sp_secs"])
    return {
        "benchmark": "perr_quadrature",
        "fading": args.fading,
        "moments": args.moments,
        "gamma_th": args.gamma_th,
        "neighbors_per_target": args.neighbors,
        "rounds": args.rounds,
        "best_of": args.best_of,
        "scipy": {
            "links": m["sp_links"],
            "seconds": sp_secs,
            "links_per_s": m["sp_links"] / sp_secs,  # from each round's fastest pass
            "quad_options": QUAD_OPTS,
        },
        "vectorized": rows,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "jax": jax.__version__,
            "backend": jax.default_backend(),
        },
    }


def print_table(result: dict) -> None:
    sp = result["scipy"]
    print(
        f"scipy quad, link by link: {sp['links']} links in {sp['seconds']:.2f} s "
        f"= {sp['links_per_s']:,.0f} links/s ({result['rounds']} interleaved rounds)"
    )
    print(
        f"{'dtype':8} {'links':>8} {'best s':>8} {'links/s':>12} {'x scipy (median, range)':>25} "
        f"{'max |diff|':>10}"
    )
    for r in result["vectorized"]:
        rng = f"{r['speedup_median']:.0f} ({r['speedup_min']:.0f}-{r['speedup_max']:.0f})"
        print(
            f"{r['dtype']:8} {r['links']:>8} {r['seconds_best']:>8.4f} "
            f"{r['links_per_s']:>12,.0f} {rng:>25} {r['max_abs_diff_vs_scipy']:>10.1e}"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = summarize(args, measure(args))
    print_table(result)
    out = atomic_write_json(args.out, result, indent=2)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
