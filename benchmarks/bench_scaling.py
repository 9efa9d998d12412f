"""Network mode at N = 10 .. 10,000 nodes: setup, seconds per round, samples/s, peak memory.

Every node is a target with its own neighbors (candidate lists: the 10 nearest, interference
within 100 m plus the mean-field tail, the demo's node density), pFedWN and FedAvg, logistic
regression, the small MLP and the CNN. Each (N, model, method) runs in a fresh subprocess, so
its peak memory (`ru_maxrss`) is its own; before running, the memory plan (`runner.memory`)
says whether one run fits this machine, and a case that does not is recorded as stopped, with
the plan's message. Each row notes the 1-minute load average when it started (a shared machine).

    python benchmarks/bench_scaling.py                      # N = 10, 100, 1000, 10000
    python benchmarks/bench_scaling.py --nodes 10 100 --models logreg --rounds 2
    python benchmarks/bench_scaling.py --plot-from results/bench_scaling_A.json B.json

Writes benchmarks/results/bench_scaling_<UTC>.json and a log-log plot of round time against
nodes next to it (`.png`), and prints the fitted growth exponent of the per-round time from
100 nodes up. `--plot-from` redraws the plot (and exponents) from the rows of earlier files.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DENSITY = 11 / 2500  # the demo's 11 nodes on 50 m x 50 m
# full MNIST: $PFEDWN_DATA_DIR, else the repository's ../shared/data
DATA_DIR = Path(os.environ.get("PFEDWN_DATA_DIR", HERE.parent.parent / "shared" / "data"))


def one_case(nodes: int, model: str, method: str, rounds: int, plan_only: bool = False) -> dict:
    """Set up and run one network-mode experiment in this process; its measurements
    (`plan_only`: set up and ask the memory plan, run nothing)."""
    import jax
    from pfedwn_jax.experiment.runner import setup

    from pfedwn_jax import ExperimentConfig, use_cpu_devices
    from pfedwn_jax.runner import memory

    use_cpu_devices()
    load = os.getloadavg()[0]
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
        dataset="npz:" + str(DATA_DIR / "mnist.npz"),
    )
    t0 = time.perf_counter()
    exp = setup(config)
    setup_s = time.perf_counter() - t0
    est = memory.estimate(exp.ctx, exp.test, method, config.hparams_for(method))
    # one run's slots are split over the CPU devices, which share the host's memory: the
    # budget of the whole run is the host's (`available_bytes` is one device's share)
    avail = memory.available_bytes() * len(jax.local_devices(backend="cpu"))
    out = {
        "nodes": nodes,
        "model": model,
        "method": method,
        "load_avg_1m": load,
        "setup_s": setup_s,
        "estimate_bytes": est.total(1),
        "available_bytes": avail,
    }
    if plan_only:  # the plan alone (cases too slow to time here)
        fits = est.total(1) <= 0.8 * avail
        return {**out, "stopped": f"plan only: {est.total(1) / 2**30:.1f} GiB, fits: {fits}"}
    if est.total(1) > 0.8 * avail:
        need, have = est.total(1) / 2**30, avail / 2**30
        return {
            **out,
            "stopped": f"memory plan: needs {need:.1f} GiB > 80% of the {have:.1f} GiB "
            f"available (largest part: {est.largest()})",
        }
    from pfedwn_jax.experiment.runner import compile_round, get_algorithm, init_state

    from pfedwn_jax.algorithms import hparam_values

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


def exponents(rows: list[dict]) -> dict[str, float | None]:
    """`"model/method" -> fit_exponent` of every (model, method) in `rows`."""
    pairs = dict.fromkeys((r["model"], r["method"]) for r in rows)
    return {
        f"{m}/{a}": fit_exponent([r for r in rows if r["model"] == m and r["method"] == a])
        for m, a in pairs
    }


def plot(rows: list[dict], path: Path) -> Path | None:
    """Log-log plot of seconds per round against nodes, one line per (model, method), with
    a dashed linear reference through each line's 100-node point; None without matplotlib."""
    from pfedwn_jax.plotting import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    slopes = exponents(rows)
    pairs = dict.fromkeys((r["model"], r["method"]) for r in rows)
    for i, (model, method) in enumerate(pairs):
        style = "os^vDx"[i % 6] + ("-" if method == "pfedwn" else "--")
        mine = [r for r in rows if r["model"] == model and r["method"] == method]
        pts = sorted((r["nodes"], r["round_s"]) for r in mine if "round_s" in r)
        if not pts:
            continue
        n, t = np.array(pts, dtype=float).T
        slope = slopes[f"{model}/{method}"]
        label = f"{model} {method}" + (f" (slope {slope:.2f})" if slope is not None else "")
        (line,) = ax.loglog(n, t, style, label=label, lw=1.5, ms=4)
        if 100 in n:
            t100 = t[n == 100][0]
            ax.loglog(n[n >= 100], t100 * n[n >= 100] / 100, ":", color=line.get_color(), lw=1)
    ax.set_xlabel("nodes N (every node a target)")
    ax.set_ylabel("seconds per round")
    ax.set_title("network mode on a 2-core CPU (dotted: linear from N=100)", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000, 10000])
    ap.add_argument("--models", nargs="+", default=["logreg", "mlp", "cnn"])
    ap.add_argument("--methods", nargs="+", default=["pfedwn", "fedavg"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--one", nargs=3, metavar=("N", "MODEL", "METHOD"), help=argparse.SUPPRESS)
    ap.add_argument("--plan-only", action="store_true", help="memory plan only, no rounds")
    ap.add_argument("--plot-from", type=Path, nargs="+", help="redraw from these raw JSONs")
    args = ap.parse_args()
    if args.plot_from:
        rows = [r for f in args.plot_from for r in json.loads(f.read_text())["rows"]]
        out = args.plot_from[-1].with_suffix(".png")
        print("growth exponents (N >= 100):", exponents(rows), "plot:", plot(rows, out))
        return
    if args.one:
        n, model, method = int(args.one[0]), args.one[1], args.one[2]
        print(json.dumps(one_case(n, model, method, args.rounds, args.plan_only)))
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
                    *(["--plan-only"] if args.plan_only else []),
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
        "exponents": exponents(rows),
    }
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = HERE / "results" / f"bench_scaling_{stamp}.json"
    out.write_text(json.dumps(report, indent=1))
    print("growth exponents (round time vs nodes, N >= 100):", report["exponents"])
    print("wrote", out, plot(rows, out.with_suffix(".png")))


def _line(r: dict) -> str:
    head = f"{r['model']:>6} {r['method']:>7} N={r['nodes']:>6} load {r.get('load_avg_1m', 0):4.1f}"
    if "stopped" in r:
        return f"{head}  stopped: {r['stopped']}"
    return (
        f"{head}  setup {r['setup_s']:7.2f} s  compile {r['compile_s']:6.1f} s  "
        f"round {r['round_s']:8.3f} s  {r['samples_per_s']:9.0f} samples/s  "
        f"peak {r['peak_rss_bytes'] / 2**30:5.2f} GiB"
    )


if __name__ == "__main__":
    main()
