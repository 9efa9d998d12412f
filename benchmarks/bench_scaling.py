"""Network mode at N = 10 .. 100,000 nodes: setup, seconds per round, peak memory, the plan.

Every node is a target with its own neighbors (candidate lists: the 10 nearest, interference
within 100 m plus the mean-field tail, the demo's node density), pFedWN and FedAvg, logistic
regression, the small MLP and the CNN, full MNIST. Each (N, model, method) runs in a fresh
subprocess through the one driver (`runner.job.run_experiments`, one run on one CPU device, so
nothing is replicated per device), so its memory is its own:

- `rss_before`: the process's RSS after set-up (interpreter, JAX, host data), `rss_peak`: the
  highest RSS while the run ran (sampled every 20 ms), `run_bytes = rss_peak - rss_before`;
- `plan_bytes`: the memory plan of the run (`runner.memory.estimate(...).total(1)`);
- with `--xla`: XLA's `memory_analysis()` of the compiled block (arguments + temporaries +
  outputs not aliased), compiled again after the run;
- `gpu_plan_bytes`: the plan for an accelerator (256 slots trained at once, no CPU runtime).

`--mobile` moves the nodes (`MOBILE`: random waypoint, lists re-selected every round);
`--data FILE` takes another dataset file of DATA_DIR (e.g. the 12,000-image
`mnist_10k_2k.npz`); `--plan-only` sets up and plans without running; `--set KEY=VALUE`
(repeatable, the value read as JSON where it parses) sets any other config field, e.g.
`--set cost=true` for the cost accounting or `--set fading=nakagami --set fading_param=2`;
the row records them under `"set"`, and the plot and growth exponents leave such rows out.

Before running, the plan is compared with 80 % of the host's available memory; a case over it
is recorded as stopped. Each row notes the 1-minute load average when it started.

Data: with N <= 10,000 node `n` holds data client `n` of a Dirichlet(0.5) partition of the
70,000 MNIST images into N clients (`min_samples=5`; at 10,000 nodes 4-14 training samples
each). Above 10,000 nodes MNIST has too few images for one client each, so the partition is
into 10,000 clients and node `n` holds data client `n mod 10,000`: a replicated assignment
(3 nodes share a client's data at 30,000, 10 at 100,000); the row says `data_clients`.

    python benchmarks/bench_scaling.py                       # N = 10, 100, 1000, 10000
    python benchmarks/bench_scaling.py --nodes 10 100 --models logreg --rounds 2 --xla
    python benchmarks/bench_scaling.py --one 10000 mlp pfedwn --rounds 2   # one case, JSON
    python benchmarks/bench_scaling.py --nodes 10000 --models mlp --methods pfedwn --set cost=true
    python benchmarks/bench_scaling.py --plot-from results/bench_scaling_A.json B.json

Writes benchmarks/results/bench_scaling_<UTC>.json and a log-log plot of round time against
nodes next to it (`.png`), and prints the fitted growth exponents of round time and memory
from 1,000 nodes up. `--plot-from` redraws the plot (and exponents) from earlier files.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
# full MNIST: $PFEDWN_DATA_DIR, else the repository's ../shared/data
DATA_DIR = Path(os.environ.get("PFEDWN_DATA_DIR", HERE.parent.parent / "shared" / "data"))
#: Most data clients a partition of MNIST gets (min_samples=5); more nodes share them.
MAX_DATA_CLIENTS = 10_000
#: The dataset file in DATA_DIR (`--data`).
DATA_FILE = os.environ.get("PFEDWN_BENCH_DATA", "mnist.npz")


class RssSampler:
    """The highest resident set size of this process while running (a 20 ms sampling thread)."""

    def __init__(self) -> None:
        self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def rss() -> int:
    """The process's resident set size now, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def config_of(nodes: int, model: str, method: str, rounds: int, **extra):
    """The decentralized study's network (`reproduce.decentralized.network_config`) on this
    benchmark's data: one client per node up to `MAX_DATA_CLIENTS`."""
    from pfedwn_jax.reproduce.decentralized import network_config

    data_clients = min(nodes, MAX_DATA_CLIENTS)
    return network_config(
        nodes,
        model=model,
        algorithms=(method,),
        rounds=rounds,
        min_samples=5 if data_clients == nodes else 1,
        dataset="npz:" + str(DATA_DIR / DATA_FILE),
        **extra,
    )


def experiment(config, data_clients: int):
    """`setup(config)`, or with fewer data clients than nodes: the partition into
    `data_clients` clients (min_samples=5), node `n` holding client `n mod data_clients`."""
    from pfedwn_jax.experiment import setup as st

    if data_clients >= config.num_clients:
        return st.setup(config)
    part = dataclasses.replace(config, num_neighbors=data_clients - 1, min_samples=5)
    data, fingerprint = st.load_data(part)
    model = st.build_model(config, data.num_classes, data.train.x.shape[2:])
    fed = st.federation_of(config)
    fed = dataclasses.replace(fed, data_client=np.arange(fed.num_slots) % data_clients)
    ctx = st.build_context(config, fed, data, model)
    return st.Experiment(config, data, fed, ctx, *st.round_keys(config.seed), fingerprint)


def xla_bytes(exp, method: str) -> int:
    """Arguments + temporaries + unaliased outputs of the compiled block of one round."""
    from pfedwn_jax.algorithms import get_algorithm
    from pfedwn_jax.runner.groups import axes_key, init_states, make_group
    from pfedwn_jax.runner.job import default_mesh
    from pfedwn_jax.runner.program import block_program

    mesh = default_mesh([exp], 1)
    group = make_group([0], [exp], mesh)
    state, (hp, hp_axes) = init_states(group, method, mesh)
    key = axes_key(group, state, hp_axes)
    program = block_program(get_algorithm(method), 1, (), key, mesh, 1, group.shapes.slots)
    args = (group.ctx, group.evals, hp, group.round_roots, np.int32(0), np.int32(1))
    ma = program.lower(state, *args).compile().memory_analysis()
    out = ma.output_size_in_bytes - ma.alias_size_in_bytes
    return int(ma.argument_size_in_bytes + ma.temp_size_in_bytes + out)


#: `--mobile`: nodes walk (random waypoint, 5 m/s, 10 s a round), lists re-selected every round
MOBILE = dict(mobility="waypoint", speed=5.0, round_seconds=10.0, reselect_every=1)


def one_case(
    nodes: int,
    model: str,
    method: str,
    rounds: int,
    plan_only: bool,
    xla: bool,
    mobile: bool = False,
    extra: dict | None = None,
):
    """Set up and run one network-mode experiment in this process; its measurements.
    `extra`: further config fields (`--set`)."""
    import jax

    import pfedwn_jax  # noqa: F401  (the package first: its modules import one another)
    from pfedwn_jax.runner import memory
    from pfedwn_jax.runner.job import run_experiments
    from pfedwn_jax.runner.options import Options, checked

    jax.config.update("jax_num_cpu_devices", 1)
    load = os.getloadavg()[0]
    extra = extra or {}
    config = config_of(nodes, model, method, rounds, **(MOBILE if mobile else {}), **extra)
    data_clients = min(nodes, MAX_DATA_CLIENTS)
    t0 = time.perf_counter()
    exp = experiment(config, data_clients)
    setup_s = time.perf_counter() - t0
    est = memory.estimate(exp.ctx, exp.test, method, config.hparams_for(method))
    hp = config.hparams_for(method)
    gpu = memory.estimate(exp.ctx, exp.test, method, hp, chunk=256, backend="gpu")
    avail = memory.available_bytes()
    counts = np.asarray(exp.data.train.count)[np.asarray(exp.federation.data_client)]
    out = {
        "nodes": nodes,
        "model": model,
        "method": method,
        "data_clients": data_clients,
        "dataset": DATA_FILE,
        "train_samples_per_node": [int(counts.min()), float(counts.mean()), int(counts.max())],
        "list_width": int(exp.ctx.neighbors.shape[1]),
        "mobile": mobile,
        "set": extra,
        "load_avg_1m": load,
        "setup_s": setup_s,
        "plan_bytes": est.total(1),
        "plan": est.describe(),
        # an accelerator's plan: 256 slots trained at once (`strategy.ACCELERATOR_CHUNK`)
        "gpu_plan_bytes": gpu.total(1),
        "gpu_fits_80gb": gpu.total(1) <= 0.8 * 80e9,
        "available_bytes": avail,
    }
    if plan_only or est.total(1) > 0.8 * avail:
        need, have = est.total(1) / 2**30, avail / 2**30
        why = "plan only" if plan_only else "memory plan over 80 % of the available"
        return {**out, "stopped": f"{why}: {need:.2f} GiB, {have:.1f} GiB available"}
    stamps = []
    options = checked(
        Options(
            block=1,
            records=(),
            progress=False,
            on_divergence="continue",
            shards=1,
            callback=lambda *_: stamps.append(time.perf_counter()),
        )
    )
    before = rss()
    start = time.perf_counter()
    with RssSampler() as sampler:
        meta = run_experiments([exp], [{}], options).meta
    gaps = np.diff([start, *stamps])
    compile_s = meta["timings"]["compile_s"]
    out.update(
        compile_s=compile_s,
        round_times=[float(gaps[0] - compile_s), *map(float, gaps[1:])],
        rss_before=before,
        rss_peak=sampler.peak,
        run_bytes=sampler.peak - before,
    )
    out["round_s"] = float(np.median(out["round_times"][1:] or out["round_times"]))
    if xla:
        out["xla_bytes"] = xla_bytes(exp, method)
    return out


def fit(rows: list[dict], key: str, lo: int = 1000) -> float | None:
    """Slope of log(row[key]) against log(nodes) over the rows with nodes >= lo."""
    pts = [(r["nodes"], r[key]) for r in rows if r.get(key) and r["nodes"] >= lo]
    if len({n for n, _ in pts}) < 2:
        return None
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def exponents(rows: list[dict]) -> dict[str, dict[str, float | None]]:
    """`"model/method" -> {"round_s": slope, "rss_peak": slope}` (N >= 1,000, still nodes)."""
    rows = [r for r in rows if not (r.get("mobile") or r.get("set"))]
    pairs = dict.fromkeys((r["model"], r["method"]) for r in rows)
    out = {}
    for m, a in pairs:
        mine = [r for r in rows if r["model"] == m and r["method"] == a]
        out[f"{m}/{a}"] = {k: fit(mine, k) for k in ("round_s", "rss_peak", "plan_bytes")}
    return out


def plot(rows: list[dict], path: Path) -> Path | None:
    """Log-log plot of seconds per round against nodes, one line per (model, method), with
    a dotted linear reference through each line's 1,000-node point; None without matplotlib."""
    from pfedwn_jax.plotting import pyplot, save_figure

    rows = [r for r in rows if not (r.get("mobile") or r.get("set"))]
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
        slope = slopes[f"{model}/{method}"]["round_s"]
        label = f"{model} {method}" + (f" (slope {slope:.2f})" if slope is not None else "")
        (line,) = ax.loglog(n, t, style, label=label, lw=1.5, ms=4)
        if 1000 in n:
            t0 = t[n == 1000][0]
            ax.loglog(n[n >= 1000], t0 * n[n >= 1000] / 1000, ":", color=line.get_color(), lw=1)
    ax.set_xlabel("nodes N (every node a target)")
    ax.set_ylabel("seconds per round")
    ax.set_title("network mode, one CPU device (dotted: linear from N=1,000)", fontsize=8)
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
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--xla", action="store_true", help="also XLA's memory_analysis")
    ap.add_argument("--mobile", action="store_true", help="moving nodes (`MOBILE`)")
    ap.add_argument("--data", help="dataset file in DATA_DIR (default mnist.npz)")
    ap.add_argument("--one", nargs=3, metavar=("N", "MODEL", "METHOD"), help=argparse.SUPPRESS)
    ap.add_argument("--plan-only", action="store_true", help="memory plan only, no rounds")
    ap.add_argument("--plot-from", type=Path, nargs="+", help="redraw from these raw JSONs")
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="another config field"
    )
    args = ap.parse_args()
    extra = dict(setting(s) for s in args.set)
    if args.data:  # the subprocesses read it from the environment
        os.environ["PFEDWN_BENCH_DATA"] = globals()["DATA_FILE"] = args.data
    if args.plot_from:
        rows = [r for f in args.plot_from for r in json.loads(f.read_text())["rows"]]
        out = args.plot_from[-1].with_suffix(".png")
        print("growth exponents (N >= 1,000):", exponents(rows), "plot:", plot(rows, out))
        return
    if args.one:
        n, model, method = int(args.one[0]), args.one[1], args.one[2]
        row = one_case(n, model, method, args.rounds, args.plan_only, args.xla, args.mobile, extra)
        print(json.dumps(row))
        return
    rows = []
    for model in args.models:
        for method in args.methods:
            for n in args.nodes:
                rows.append(_subprocess(n, model, method, args))
                print(_line(rows[-1]), flush=True)
    report = {
        "machine": {"cpu": platform.processor() or platform.machine(), "python": sys.version},
        "rows": rows,
        "exponents": exponents(rows),
    }
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = HERE / "results" / f"bench_scaling_{stamp}.json"
    out.write_text(json.dumps(report, indent=1))
    print("growth exponents (N >= 1,000):", report["exponents"])
    print("wrote", out, plot(rows, out.with_suffix(".png")))


def _subprocess(n: int, model: str, method: str, args: argparse.Namespace) -> dict:
    """One case in a fresh process (its own peak memory); a failure becomes a stopped row."""
    cmd = [sys.executable, __file__, "--one", str(n), model, method, "--rounds", str(args.rounds)]
    cmd += ["--plan-only"] * args.plan_only + ["--xla"] * args.xla + ["--mobile"] * args.mobile
    cmd += [a for s in args.set for a in ("--set", s)]
    head = {"nodes": n, "model": model, "method": method}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {**head, "stopped": f"over {args.timeout} s"}
    if p.returncode != 0:
        return {**head, "stopped": (p.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def setting(text: str) -> tuple[str, object]:
    """`KEY=VALUE` of `--set`: the value as JSON where it parses, else the string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"--set takes KEY=VALUE; got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _line(r: dict) -> str:
    head = f"{r['model']:>6} {r['method']:>7} N={r['nodes']:>6} load {r.get('load_avg_1m', 0):4.1f}"
    if "stopped" in r:
        return f"{head}  stopped: {r['stopped']}"
    gib = lambda b: f"{b / 2**30:6.2f} GiB"
    xla = f"  xla {gib(r['xla_bytes'])}" if "xla_bytes" in r else ""
    return (
        f"{head}  setup {r['setup_s']:7.2f} s  compile {r['compile_s']:6.1f} s  round "
        f"{r['round_s']:8.3f} s  peak {gib(r['rss_peak'])}  run {gib(r['run_bytes'])}  "
        f"plan {gib(r['plan_bytes'])}{xla}"
    )


if __name__ == "__main__":
    main()
