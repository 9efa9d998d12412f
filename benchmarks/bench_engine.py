"""One FedAvg round (1 local epoch, batch 32): the engine vs a Python loop vs one big batch.

Cases: N clients with sample counts drawn uniformly in 64..600 (seed 0) from real MNIST
images, for the MLP and the CNN. Executions of the same arithmetic (`bench_methods.py`):

- engine:   `local_train` over all N stacked slots + weighted average, one jitted program.
- loop:     a Python loop over clients calling a jitted per-client epoch (one compiled program
            per distinct step count), accumulating the weighted average on the device; the
            execution model of existing JAX FL libraries.
- bigbatch: one model trained on all the same samples at batch 32*N (the hardware's best case
            for the same number of sample-gradients).
- torch:    with `--torch-python PY`, the PyTorch per-client loop (`bench_torch_loop.py`) in
            that interpreter: a worker process the case starts once and asks for rounds.

Each (model, N) case runs in its own subprocess; inside it the methods are compiled, each runs
one warm-up round, then timed rotations alternate them (engine, loop, bigbatch, torch, engine,
...), so every ratio is computed rotation by rotation from timings taken side by side, and the
machine's drift hits all alike. A timing spans enough rounds to last >= `--min-timed-s` (small
cases are not timer noise). Rotations: at least `--repeats`, more while they fit in
`--budget-s`; where every first round lasts >= `--long-round-s`, it counts as the first timing
(its one-off costs are negligible there: every method is compiled and primed beforehand).

Reports per method samples/s (median timing), compile time, memory of the compiled program
(arguments + outputs + temporaries, from XLA's `memory_analysis`; for the loop its largest
per-client program) and the case's process peak RSS (`ru_maxrss`, which includes the
~N*600*784 bytes of client data); per ratio (engine / other) the median and range over the
rotations. The JSON (`--out`) holds the machine, date, versions and every raw timing.

    python benchmarks/bench_engine.py                                  # all cases, table
    python benchmarks/bench_engine.py --model cnn --clients 100 --json # one case, one JSON object
    python benchmarks/bench_engine.py --preset ratios --torch-python /work/wt/torchvenv/bin/python

`--preset ratios` measures the ratios `benchmarks/RESULTS.md` quotes (MLP and CNN, N = 10 and
100, every method; 2 rotations at least, more while they fit in 12 s) in about 5-6 minutes on
an idle 2-core machine, CNN N = 100 alone about 3.5 (50 s of loop compiles, 75 s a rotation).
It writes `runs/bench_engine_ratios_<UTC time>.json` unless `--out` is given.

JSON: `started`, `finished`, `wall_s`, `settings` (the options), `machine` (cpu, cores, memory,
host, load average, python, package versions, commit and whether the tree was dirty), `cases`:
one per (model, N) with `model`, `clients`, per method (`engine`, `loop`, `bigbatch`, `torch`)
`samples`, `compile_s`, `program_mib`, `prime_s`, `first_round_s`, `rounds_per_timing`,
`rounds_s` (seconds per round of every timing), `round_s` (median), `samples_per_s` (torch:
its version, threads, `startup_s`; or `error` and `note` when it could not run), `ratios`
(`"engine/loop"`, ...: `median`, `min`, `max`, `values` per rotation), `rotations`,
`first_round_counted`, `data`, `process_peak_rss_mib`, `started`, `load_avg`, `wall_s`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import jax
from bench_methods import (
    JAX_METHODS,
    Method,
    TorchUnavailable,
    make_case,
    make_data,
    setup_method,
    setup_torch,
)

from pfedwn_jax.devices import usable_cores, use_cpu_devices
from pfedwn_jax.io import atomic_write_with

REPO = Path(__file__).resolve().parents[1]
METHODS = (*JAX_METHODS, "torch")
PRESETS = {
    "ratios": {
        "model": "all",
        "clients": "10,100",
        "methods": ",".join(JAX_METHODS),
        "repeats": 2,
        "budget_s": 12.0,
        "min_timed_s": 0.5,
        "long_round_s": 5.0,
    }
}


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def plan(
    first: dict[str, float], repeats: int, budget_s: float, min_timed_s: float, long_round_s: float
) -> tuple[dict[str, int], int, bool]:
    """From each method's first round (s): rounds per timing (a timing lasts >= `min_timed_s`),
    timed rotations still to run, and whether the first rotation counts as a timing."""
    inner = {m: max(1, math.ceil(min_timed_s / max(t, 1e-6))) for m, t in first.items()}
    counted = min(first.values()) >= long_round_s
    rotation_s = sum(first[m] * inner[m] for m in first)
    total = max(repeats, int(budget_s // rotation_s))
    return inner, total - counted, counted


def rotate(ready: dict[str, Method], inner: dict[str, int], count: int, notes: dict) -> dict:
    """`count` rotations of every method in turn (A B C A B C ...); seconds per round of each
    timing, `[count]` per method. Round 0 was the warm-up. A torch worker that dies is
    dropped with a note."""
    times: dict[str, list[float]] = {m: [] for m in ready}
    for r in range(count):
        for m in list(ready):
            try:
                times[m].append(ready[m].timed(1 + r * inner[m], inner[m]) / inner[m])
            except TorchUnavailable as e:
                drop(ready, notes, m, e)
                del times[m]
    return times


def summarize(method: Method, first_s: float, rounds_s: list[float], inner: int) -> dict:
    """One method's figures and raw timings; samples/s from the median timing."""
    round_s = statistics.median(rounds_s)
    return {
        "samples": method.samples,
        **method.figures,
        "first_round_s": first_s,
        "rounds_per_timing": inner,
        "rounds_s": rounds_s,
        "round_s": round_s,
        "samples_per_s": method.samples / round_s,
    }


def ratio_stats(summary: dict[str, dict]) -> dict[str, dict]:
    """samples/s of the first method over each other's, rotation by rotation: median, range."""
    base, *others = summary
    sps = {m: [s["samples"] / t for t in s["rounds_s"]] for m, s in summary.items()}
    out = {}
    for m in others:
        values = [a / b for a, b in zip(sps[base], sps[m], strict=True)]
        out[f"{base}/{m}"] = {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "values": values,
        }
    return out


def setup_all(case, methods: list[str], torch_python: str | None) -> tuple[dict, dict]:
    """Compile the JAX methods and start the torch worker; returns them and, if the worker
    could not start, a note for the JSON in its place."""
    ready = {m: setup_method(case, m) for m in methods}
    if not torch_python:
        return ready, {}
    try:
        ready["torch"] = setup_torch(case.model_name, case.num_clients, torch_python)
        return ready, {}
    except TorchUnavailable as e:
        return ready, {"torch": skipped(e)}


def skipped(error: Exception) -> dict:
    """What the JSON holds in place of a torch worker that could not run."""
    return {"error": str(error), "note": "torch column skipped"}


def drop(ready: dict[str, Method], notes: dict, m: str, error: Exception) -> None:
    """Stop method `m` (the torch worker) and leave a note in its place."""
    ready.pop(m).close()
    notes[m] = skipped(error)


def first_rounds(ready: dict[str, Method], notes: dict) -> dict[str, float]:
    """Round 0 of each method in turn (the warm-up); a torch worker that fails is dropped."""
    first = {}
    for m in list(ready):
        try:
            first[m] = ready[m].timed(0, 1)
        except TorchUnavailable as e:
            drop(ready, notes, m, e)
    return first


def run_case(model_name: str, num_clients: int, methods: list[str], args) -> dict:
    """All methods of one (model, N) in this process: warm-up, then interleaved rotations."""
    started, load_before, t0 = now(), os.getloadavg(), time.perf_counter()
    data, source = make_data(num_clients)
    case = make_case(model_name, data, args.strategy, args.chunk_size)
    ready, notes = setup_all(case, methods, args.torch_python)
    try:
        first = first_rounds(ready, notes)
        limits = (args.repeats, args.budget_s, args.min_timed_s, args.long_round_s)
        inner, count, counted = plan(first, *limits)
        times = rotate(ready, inner, count, notes)
    finally:
        for method in ready.values():
            method.close()
    if counted:
        times = {m: [first[m], *t] for m, t in times.items()}
    summary = {m: summarize(ready[m], first[m], times[m], inner[m]) for m in ready}
    return {
        **summary,
        **notes,
        "ratios": ratio_stats(summary),
        "rotations": len(times[methods[0]]),
        "first_round_counted": counted,
        "data": source,
        "process_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "backend": jax.default_backend(),
        "started": started,
        "load_avg": {"before": load_before, "after": os.getloadavg()},
        "wall_s": time.perf_counter() - t0,
    }


def case_command(model: str, clients: int, args) -> list[str]:
    """The command line of one case's subprocess (`--case`)."""
    cmd = [sys.executable, __file__, "--case", "--model", model, "--clients", str(clients)]
    for flag in ("methods", "repeats", "budget_s", "min_timed_s", "long_round_s", "strategy"):
        cmd += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    for flag in ("chunk_size", "cpu_devices", "torch_python"):
        if getattr(args, flag):
            cmd += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    return cmd


def run_in_subprocess(model: str, clients: int, methods: list[str], args) -> dict:
    """One (model, N) case in a fresh process (so its peak RSS is its own)."""
    cmd = case_command(model, clients, args)
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=args.timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {m: {"error": f"timeout after {args.timeout:.0f} s"} for m in methods}
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"
        return {m: {"error": err} for m in methods}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _git(*cmd: str) -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *cmd], capture_output=True, text=True)
        return out.stdout.strip()
    except OSError:
        return ""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _mem_total_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def machine() -> dict:
    """The host, its load now, the package versions and the commit measured."""
    versions = {}
    for package in ("jax", "jaxlib", "numpy", "optax", "flax"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "mem_gib": _mem_total_gib(),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0]),
        "versions": versions,
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "load_avg": os.getloadavg(),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default=None, choices=sorted(PRESETS), help="named settings")
    p.add_argument("--model", default="all", choices=["all", "mlp", "cnn"])
    p.add_argument("--clients", default="10,100,1000", help="comma-separated N values")
    p.add_argument("--methods", default=",".join(JAX_METHODS), help="JAX methods, first = base")
    p.add_argument("--repeats", type=int, default=3, help="timings per method, at least")
    p.add_argument("--budget-s", type=float, default=0.0, help="more rotations while they fit")
    p.add_argument("--min-timed-s", type=float, default=1.0, help="each timing lasts >= this")
    p.add_argument(
        "--long-round-s",
        type=float,
        default=math.inf,
        help="first rounds this long count as timings (default: never)",
    )
    p.add_argument("--strategy", default="auto", help="engine execution strategy")
    p.add_argument("--chunk-size", type=int, default=None)
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        help="CPU devices the engine shards clients over (default: one per core; 1 = off)",
    )
    p.add_argument("--timeout", type=float, default=1800, help="seconds per subprocess")
    p.add_argument(
        "--torch-python",
        default=None,
        help="an interpreter with torch: also time the PyTorch per-client loop "
        "(bench_torch_loop.py), interleaved with the JAX methods",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    p.add_argument("--out", default=None, help="also write all results to this JSON file")
    p.add_argument("--case", action="store_true", help=argparse.SUPPRESS)
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Options, a preset's values where the command line does not give them; checked."""
    p = parser()
    args = p.parse_args(argv)
    if args.preset:
        p.set_defaults(**PRESETS[args.preset])
        args = p.parse_args(argv)
        if args.out is None and not args.case:
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            args.out = str(REPO / "runs" / f"bench_engine_{args.preset}_{stamp}.json")
    bad = [m for m in args.methods.split(",") if m not in JAX_METHODS]
    if bad or not args.methods:
        p.error(f"--methods: {args.methods!r}; allowed: comma-separated {', '.join(JAX_METHODS)}")
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1; got {args.repeats}")
    return args


def write_json(path: str, results: dict) -> None:
    text = json.dumps(results, indent=1).encode()
    atomic_write_with(path, lambda f: f.write(text))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = ["mlp", "cnn"] if args.model == "all" else [args.model]
    clients = [int(c) for c in args.clients.split(",")]
    methods = args.methods.split(",")
    if args.case:  # internal: one (model, N) case measured in this process
        use_cpu_devices(args.cpu_devices)  # before any JAX computation of this process
        print(json.dumps(run_case(models[0], clients[0], methods, args)))
        return 0
    if args.preset and not args.torch_python and not args.json:
        print("no --torch-python: the torch column is skipped", file=sys.stderr)
    t0 = time.perf_counter()
    settings = {k: v for k, v in vars(args).items() if k not in ("case", "json", "out")}
    results = {"started": now(), "settings": settings, "machine": machine(), "cases": []}
    for model in models:
        for n in clients:
            case = run_in_subprocess(model, n, methods, args)
            if args.json and len(models) == 1 and len(clients) == 1:
                print(json.dumps(case))
                return 0
            results["cases"].append({"model": model, "clients": n, **case})
            results["wall_s"] = time.perf_counter() - t0
            if args.out:  # after every case, so an interrupted run keeps what it measured
                write_json(args.out, results)
            if not args.json:
                print_case(model, n, case)
    results["finished"] = now()
    if args.json:
        print(json.dumps(results))
    if args.out:
        write_json(args.out, results)
        if not args.json:
            print(f"wrote {args.out}")
    return 0


def _cell(m: str, r: dict) -> str:
    if "error" in r:
        return f"{m} {r['error'][:40]}"
    mib = r.get("program_mib")
    compile_s = f" {r['compile_s']:.1f}s" if "compile_s" in r else ""
    return f"{m} {r['samples_per_s']:,.0f}/s{compile_s}{'' if mib is None else f' {mib:,.0f}M'}"


def print_case(model: str, n: int, case: dict) -> None:
    """Two lines: samples/s, compile, memory per method; the ratios' medians and ranges."""
    cells = [_cell(m, case[m]) for m in METHODS if m in case]
    rss = case.get("process_peak_rss_mib")
    print(f"{model:<4} {n:>5} | " + " | ".join(cells) + (f" | peak RSS {rss:,.0f}M" if rss else ""))
    ratios = [
        f"{k} {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"
        for k, r in case.get("ratios", {}).items()
    ]
    if ratios:
        print(f"{'':<10} | " + " | ".join(ratios) + f" | {case['rotations']} rotations")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
