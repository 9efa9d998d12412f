"""Network mode at N = 10 .. 10,000 nodes: setup, seconds per round, samples/s, peak memory.

Every node is a target with its own neighbors (candidate lists: the 10 nearest, interference
within 100 m plus the mean-field tail, the demo's node density), pFedWN and FedAvg, logistic
regression and the small MLP. Each (N, model, method) runs in a fresh subprocess, so its peak
memory (`ru_maxrss`) is its own; before running, the memory plan (`sweeps.memory`) says
whether one run fits this machine, and a case that does not is recorded as stopped, with why.

    python benchmarks/bench_scaling.py                      # N = 10, 100, 1000, 10000
    python benchmarks/bench_scaling.py --nodes 10 100 --models logreg --rounds 2

Writes benchmarks/results/bench_scaling_<UTC>.json (and a log-log plot next to it) and prints
a table with the fitted growth exponent of the per-round time from 100 nodes up.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DENSITY = 11 / 2500  # the demo's 11 nodes on 50 m x 50 m


def one_case(nodes: int, model: str, method: str, rounds: int) -> dict:
    """Set up and run one network-mode experiment in this process; its measurements."""
    import jax

    from pfedwn_jax import ExperimentConfig, use_cpu_devices
    from pfedwn_jax.experiment.runner import setup
    from pfedwn_jax.sweeps import memory

    use_cpu_devices()
    config = ExperimentConfig(
        mode="network",
        num_neighbors=nodes - 1,
        candidates=min(10, nodes - 1),
        interference_cutoff=100.0,
        node_density=DENSITY,
        model=model,
        algorithms=(method,),
        rounds=rounds,
        partition="dirichlet",
        alpha=0.5,
        batch_size=32,
        min_samples=5,  # 10,000 clients x 5 <= 70,000 samples
        dataset="npz:" + str(HERE.parent.parent / "shared" / "data" / "mnist.npz"),
    )
    t0 = time.perf_counter()
    exp = setup(config)
    setup_s = time.perf_counter() - t0
    est = memory.estimate(exp.ctx, exp.test, method, config.hparams_for(method))
    avail = memory.available_bytes()
    out = {
        "nodes": nodes,
        "model": model,
        "method": method,
        "setup_s": setup_s,
        "estimate_bytes": est.total(1),
        "available_bytes": avail,
    }
    if est.total(1) > 0.8 * avail:
        return {
            **out,
            "stopped": f"memory plan: needs {est.total(1)} B > 80% of {avail} B "
            f"(largest part: {est.largest()})",
        }
    from pfedwn_jax.algorithms import hparam_values
    from pfedwn_jax.experiment.runner import compile_round, get_algorithm, init_state

    alg, hp = get_algorithm(method), config.hparams_for(method)
    state = init_state(exp, alg, hp)
    compiled, compile_s = compile_round(exp, alg, hp, state)
    hv = hparam_values(hp)
    times = []
    for r in range(rounds):
        t = time.perf_counter()
        state, metrics, _ = compiled(state, exp.round_key(r), exp.ctx, exp.test, hv)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t)
    samples = float(np.asarray(exp.data.train.count).sum()) * config.local_epochs
    per_round = float(np.median(times[1:] if len(times) > 1 else times))
    return {
        **out,
        "compile_s": compile_s,
        "round_s": per_round,
        "samples_per_s": samples / per_round,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def fit_exponent(rows: list[dict], lo: int = 100) -> float | None:
    """Slope of log(round_s) against log(nodes) over the cases with nodes >= lo."""
    pts = [(r["nodes"], r["round_s"]) for r in rows if "round_s" in r and r["nodes"] >= lo]
    if len(pts) < 2:
        return None
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000, 10000])
    ap.add_argument("--models", nargs="+", default=["logreg", "mlp"])
    ap.add_argument("--methods", nargs="+", default=["pfedwn", "fedavg"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--one", nargs=3, metavar=("N", "MODEL", "METHOD"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_case(int(args.one[0]), args.one[1], args.one[2], args.rounds)))
        return
    rows = []
    for model in args.models:
        for method in args.methods:
            for n in args.nodes:
                cmd = [
                    sys.executable,
                    __file__,
                    "--one",
                    str(n),
                    model,
                    method,
                    "--rounds",
                    str(args.rounds),
                ]
                try:
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                    row = (
                        json.loads(p.stdout.strip().splitlines()[-1])
                        if p.returncode == 0
                        else {
                            "nodes": n,
                            "model": model,
                            "method": method,
                            "stopped": p.stderr.strip().splitlines()[-1][:300],
                        }
                    )
                except subprocess.TimeoutExpired:
                    row = {
                        "nodes": n,
                        "model": model,
                        "method": method,
                        "stopped": f"over {args.timeout} s",
                    }
                rows.append(row)
                print(_line(row), flush=True)
    report = {
        "machine": {"cpu": platform.processor() or platform.machine(), "python": sys.version},
        "rows": rows,
        "exponents": {
            f"{m}/{a}": fit_exponent([r for r in rows if r["model"] == m and r["method"] == a])
            for m in args.models
            for a in args.methods
        },
    }
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = HERE / "results" / f"bench_scaling_{stamp}.json"
    out.write_text(json.dumps(report, indent=1))
    print("growth exponents (round time vs nodes, N >= 100):", report["exponents"])
    print("wrote", out)


def _line(r: dict) -> str:
    head = f"{r['model']:>6} {r['method']:>7} N={r['nodes']:>6}"
    if "stopped" in r:
        return f"{head}  stopped: {r['stopped']}"
    return (
        f"{head}  setup {r['setup_s']:7.2f} s  compile {r['compile_s']:6.1f} s  "
        f"round {r['round_s']:8.3f} s  {r['samples_per_s']:9.0f} samples/s  "
        f"peak {r['peak_rss_bytes'] / 2**30:5.2f} GiB"
    )


if __name__ == "__main__":
    main()
