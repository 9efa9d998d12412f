"""A W-run seed sweep (`pfedwn_jax.sweep`) against W sequential `pfedwn_jax.run` calls.

The runs are the default `ExperimentConfig` (single mode, 10
neighbors, MLP, embedded MNIST) with `rounds` rounds and seeds 0..W-1, for the `--algorithms`
given (default pFedWN alone: all six methods make a long benchmark, `--preset full`).
The process exposes one JAX device per core first (`use_cpu_devices()`): the sweep puts its
runs on the mesh's run axis (W=1 is padded to one run per device), `run()` splits each run's
slots over the same devices.

Two comparisons, measured side by side in this process:

- **W runs**: for each W, the wall time of `sweep(config, seeds=range(W))` and of W
  consecutive `run(config_with_seed_i)` calls, each including host setup and every
  compilation. Ratio = sequential / sweep. The order of the two alternates between W values
  and repeats.
- **Marginal run-round**: the extra wall time of `rounds_long` over `rounds` rounds, per run,
  round and method: `(T_long - T_short) / (W * (rounds_long - rounds) * methods)` for the
  sweep (`--marginal-runs` runs; its short sweep is the W-run one above), and the same for
  `run()` (mean over `--marginal-seq` seeds, whose short runs are the sequential ones above).
  Compilation is in both times and cancels on average; as it varies by +-10% on a busy
  machine, the "net" figures also take each side's compile seconds out. Ratio = run() / sweep.

Before every timed sweep or sequence of runs, JAX's caches (and the package's jit caches)
are cleared, so each pays its compilations as a fresh process would; inside a sequence,
`run()` keeps its cache from seed to seed, as a user's loop would. Compile seconds
(tracing + lowering + XLA) come from `jax.monitoring`. A warm-up (one round of `run()` and
of a sweep of the measured methods, not timed) pays the process's one-off costs first.
Each measurement records the load average before and after.

    python benchmarks/bench_sweep.py                    # pFedWN, W = 1, 4, 16; marginal W=4
    python benchmarks/bench_sweep.py --runs 16 --marginal-runs 16   # the key comparison
    python benchmarks/bench_sweep.py --preset smoke     # the code path only (~1 min): W=2, Local
    python benchmarks/bench_sweep.py --preset full      # all six methods, W up to 64 (hours)
    python benchmarks/bench_sweep.py --preset gpu       # on a GPU: pFedWN, up to W=1024 runs

The default preset takes about 10 minutes on the 2-core machine of `benchmarks/RESULTS.md`
under a load of 5-10 (the W=16 sweep alone about 3 minutes); `--runs 16 --marginal-runs 16`
about 15. `--preset gpu` leaves JAX's devices alone (`--cpu-devices 0`); it ran on an H100
(benchmarks/RESULTS.md).

Writes `benchmarks/results/bench_sweep_<preset>_<UTC time>.json` (or `--out`): settings,
machine (CPU, cores, versions, backend, device, commit, load), and per measurement the wall,
setup, compile and (sweep) run seconds, the load, and the largest difference of the final
target accuracies between the sweep and the runs (a check that both computed the same).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jax
from bench_engine import machine, now, write_json

import pfedwn_jax
from pfedwn_jax.algorithms import available_algorithms
from pfedwn_jax.experiment import ExperimentConfig

REPO = Path(__file__).resolve().parents[1]
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "runs": "2",
        "rounds": 2,
        "rounds_long": 4,
        "algorithms": "local",
        "marginal_runs": 2,
        "marginal_seq": 1,
    },
    "default": {},
    "full": {"runs": "1,4,16,64", "algorithms": "all", "marginal_runs": 16},
    "gpu": {
        "runs": "1,16,64",
        "marginal_runs": 64,
        "scaling": "1,16,64,256,1024",
        "cpu_devices": 0,
    },
}


# --------------------------------------------------------------------------- measuring
class CompileClock:
    """Seconds JAX spends tracing, lowering and compiling (from `jax.monitoring` events)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event: str, duration: float, **_: Any) -> None:
        if event in COMPILE_EVENTS:
            self.seconds[event] += duration

    def total(self) -> float:
        return sum(self.seconds.values())


def clear_caches() -> None:
    """Forget every compiled program (JAX's and the package's jit caches): the next
    measurement compiles as a fresh process would."""
    from pfedwn_jax.experiment import setup
    from pfedwn_jax.runner import program, step

    for cached in (program.block_program, program.init_program, step.jitted_round):
        cached.cache_clear()
    setup._dataset.cache_clear()  # a fresh process reads its data again
    jax.clear_caches()


def timed(clock: CompileClock, fn, *args: Any, **kw: Any) -> tuple[Any, dict[str, Any]]:
    """`fn(*args, **kw)` on cold caches: its result and wall, compile seconds, load."""
    clear_caches()
    load, c0, c1 = os.getloadavg(), clock.total(), dict(clock.seconds)
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    wall = time.perf_counter() - t0
    return out, {
        "wall_s": wall,
        "compile_s": clock.total() - c0,
        "compile_events_s": {
            k.rsplit("/", 1)[-1]: v - c1.get(k, 0.0) for k, v in clock.seconds.items()
        },
        "load_before": load,
        "load_after": os.getloadavg(),
    }


def config(args: argparse.Namespace, rounds: int, seed: int = 0) -> ExperimentConfig:
    return ExperimentConfig(rounds=rounds, algorithms=args.methods, seed=seed)


def measure_sweep(clock: CompileClock, args, runs: int, rounds: int) -> tuple[dict, dict]:
    """One cold `sweep` of `runs` seeds; its figures and final target accuracy per (run,
    method)."""
    seeds = list(range(runs))
    sweep = pfedwn_jax.sweep
    res, fig = timed(clock, sweep, config(args, rounds), seeds, block=args.block, progress=False)
    timings = res.meta["timings"]
    fig.update(setup_s=timings["setup_s"], run_s=timings["run_s"], programs=res.meta["programs"])
    rows = res.rows
    last = rows["round"] == rounds
    final = {
        (int(s), str(m)): float(a)
        for s, m, a in zip(
            rows["seed"][last], rows["method"][last], rows["target_accuracy"][last], strict=True
        )
    }
    return fig, final


def run_all(clock: CompileClock, args, runs: int, rounds: int) -> tuple[list[dict], dict]:
    """`run()` of seeds 0..runs-1 one after the other (caches kept between them)."""
    per_run, final = [], {}
    for seed in range(runs):
        c0, t0 = clock.total(), time.perf_counter()
        res = pfedwn_jax.run(config(args, rounds, seed), progress=False)
        methods = res.methods.values()
        per_run.append(
            {
                "wall_s": time.perf_counter() - t0,
                "compile_s": clock.total() - c0,
                "setup_s": res.timings["setup_s"],
                "run_compile_s": sum(m["timings"]["compile_s"] for m in methods),
                "round_s": sum(sum(m["timings"]["round_s"]) for m in methods),
            }
        )
        for name, m in res.methods.items():
            final[(seed, name)] = float(m["target_accuracy"][-1])
    return per_run, final


def measure_runs(clock: CompileClock, args, runs: int, rounds: int) -> tuple[dict, dict]:
    """`runs` sequential cold-started `run()` calls; figures and final accuracies."""
    (per_run, final), fig = timed(clock, run_all, clock, args, runs, rounds)
    fig["setup_s"] = sum(r["setup_s"] for r in per_run)
    fig["runs"] = per_run
    return fig, final


def max_diff(a: dict, b: dict) -> float:
    """Largest |difference| of the final target accuracies both computed."""
    return max(abs(a[k] - b[k]) for k in a.keys() & b.keys())


# --------------------------------------------------------------------------- the cases
def w_case(clock: CompileClock, args, runs: int, sweep_first: bool) -> dict:
    """Sweep vs sequential runs for one W, in the order given."""
    order = ("sweep", "sequential") if sweep_first else ("sequential", "sweep")
    fig, final = {}, {}
    for side in order:
        fn = measure_sweep if side == "sweep" else measure_runs
        fig[side], final[side] = fn(clock, args, runs, args.rounds)
        report(f"W={runs} {side}", fig[side])
    per = runs * args.rounds * len(args.methods)
    return {
        "runs": runs,
        "rounds": args.rounds,
        "order": list(order),
        **fig,
        "ratio": fig["sequential"]["wall_s"] / fig["sweep"]["wall_s"],
        "sweep_s_per_run_round": fig["sweep"]["wall_s"] / per,
        "sequential_s_per_run_round": fig["sequential"]["wall_s"] / per,
        "max_abs_diff_final_accuracy": max_diff(final["sweep"], final["sequential"]),
    }


def marginal_case(clock: CompileClock, args, short: dict) -> dict:
    """Marginal seconds per run-round of the sweep and of `run()`; `short` holds the
    `rounds`-round measurements of the W-run case with `marginal_runs` runs."""
    w, n, extra = args.marginal_runs, args.marginal_seq, args.rounds_long - args.rounds
    long_sweep, _ = measure_sweep(clock, args, w, args.rounds_long)
    report(f"W={w} sweep {args.rounds_long} rounds", long_sweep)
    long_runs, _ = measure_runs(clock, args, n, args.rounds_long)
    report(f"{n} runs {args.rounds_long} rounds", long_runs)
    m = len(args.methods)
    sweep = [per_round(short["sweep"], long_sweep, w * extra * m, c) for c in (False, True)]
    pairs = list(zip(short["sequential"]["runs"][:n], long_runs["runs"], strict=True))
    runs = [statistics.mean(per_round(a, b, extra * m, c) for a, b in pairs) for c in (0, 1)]
    rounds_in_run = [r["round_s"] / (args.rounds_long * m) for r in long_runs["runs"]]
    return {
        "sweep_runs": w,
        "sequential_runs": n,
        "rounds": [args.rounds, args.rounds_long],
        "sweep_long": long_sweep,
        "sequential_long": long_runs,
        "sweep_s_per_run_round": sweep[0],
        "run_s_per_round": runs[0],
        "ratio": runs[0] / sweep[0],
        "sweep_s_per_run_round_net": sweep[1],
        "run_s_per_round_net": runs[1],
        "ratio_net": runs[1] / sweep[1],
        "run_round_s_reported": statistics.mean(rounds_in_run),
    }


def scaling_case(clock: CompileClock, args, runs: int) -> dict:
    """One cold sweep of `runs` runs and `rounds_long` rounds: the seconds its rounds took
    (the driver's `run_s`: blocks and their fetch, no compiling) per run-round. Where one run
    does not fill the device (an accelerator) this falls as `runs` grows."""
    fig, _ = measure_sweep(clock, args, runs, args.rounds_long)
    report(f"W={runs} sweep {args.rounds_long} rounds", fig)
    per = runs * args.rounds_long * len(args.methods)
    return {"runs": runs, "rounds": args.rounds_long, **fig, "s_per_run_round": fig["run_s"] / per}


def per_round(short: dict, long: dict, count: int, net: bool) -> float:
    """(long - short) seconds / count; `net`: with each side's compile seconds taken out
    (compile times vary by +-10% here, which swamps a few rounds)."""
    diff = long["wall_s"] - short["wall_s"]
    if net:
        diff -= long["compile_s"] - short["compile_s"]
    return diff / count


def report(label: str, fig: dict) -> None:
    """One line per measurement as it finishes (stderr: the table goes to stdout)."""
    load = fig["load_before"][0]
    print(
        f"  {label}: {fig['wall_s']:.1f} s (compile {fig['compile_s']:.1f} s), load {load:.1f}",
        file=sys.stderr,
        flush=True,
    )


def warm_up(args: argparse.Namespace) -> None:
    """One round of `run()` and of a sweep of the measured methods (not timed): the process's
    one-off costs (backend start, XLA's first compile of each kind of op, ~7 s for pFedWN on
    this machine) are then paid by neither side."""
    cfg = config(args, 1)
    pfedwn_jax.run(cfg, progress=False)
    pfedwn_jax.sweep(cfg, seeds=[0], progress=False)


# --------------------------------------------------------------------------- output
def print_tables(results: dict) -> None:
    """The W-run table, then the marginal run-round."""
    m, mach = len(results["settings"]["methods"]), results["machine"]
    print(f"\n{m} method(s), {mach['devices']} device(s) ({mach['backend']}), {mach['cpu']}")
    print(
        f"{'W':>4} {'rounds':>6} | {'sweep s':>8} {'(compile)':>9} | {'sequential s':>12} "
        f"{'(compile)':>9} | {'seq/sweep':>9} | {'ms/run-round sweep':>18} {'seq':>7} | "
        f"{'load':>4} | max |dacc|"
    )
    for c in results["w_runs"]:
        sw, sq = c["sweep"], c["sequential"]
        print(
            f"{c['runs']:>4} {c['rounds']:>6} | {sw['wall_s']:>8.1f} {sw['compile_s']:>9.1f} | "
            f"{sq['wall_s']:>12.1f} {sq['compile_s']:>9.1f} | {c['ratio']:>8.2f}x | "
            f"{1e3 * c['sweep_s_per_run_round']:>18.0f} "
            f"{1e3 * c['sequential_s_per_run_round']:>7.0f}"
            f" | {sw['load_before'][0]:>4.1f} | {c['max_abs_diff_final_accuracy']:.1e}"
        )
    mg = results.get("marginal")
    if mg:
        lo, hi = mg["rounds"]
        print(
            f"\nmarginal run-round ({lo} -> {hi} rounds): sweep of {mg['sweep_runs']} runs "
            f"{1e3 * mg['sweep_s_per_run_round']:.1f} ms, run() ({mg['sequential_runs']} seeds) "
            f"{1e3 * mg['run_s_per_round']:.1f} ms; run/sweep {mg['ratio']:.2f}x"
        )
        print(
            f"  compile seconds taken out: sweep {1e3 * mg['sweep_s_per_run_round_net']:.1f} ms, "
            f"run() {1e3 * mg['run_s_per_round_net']:.1f} ms (its own round_s "
            f"{1e3 * mg['run_round_s_reported']:.1f} ms); run/sweep {mg['ratio_net']:.2f}x"
        )
    if results.get("scaling"):
        print(f"\nsweep rounds alone ({results['scaling'][0]['rounds']} rounds, no compiling):")
        print(f"{'W':>5} | {'wall s':>7} {'rounds s':>8} | {'ms/run-round':>12} | vs W=1")
        base = results["scaling"][0]["s_per_run_round"]
        for c in results["scaling"]:
            print(
                f"{c['runs']:>5} | {c['wall_s']:>7.1f} {c['run_s']:>8.2f} | "
                f"{1e3 * c['s_per_run_round']:>12.2f} | {base / c['s_per_run_round']:.1f}x"
            )
    sys.stdout.flush()


# --------------------------------------------------------------------------- main
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="default", choices=sorted(PRESETS))
    p.add_argument("--runs", default="1,4,16", help="comma-separated W values")
    p.add_argument("--rounds", type=int, default=10, help="rounds of the W-run comparison")
    p.add_argument("--rounds-long", type=int, default=30, help="rounds of the marginal runs")
    p.add_argument("--algorithms", default="pfedwn", help="comma-separated, or 'all'")
    p.add_argument("--marginal-runs", type=int, default=4, help="W of the marginal sweep (0: skip)")
    p.add_argument("--marginal-seq", type=int, default=2, help="run() seeds of the marginal")
    p.add_argument(
        "--scaling", default="", help="comma-separated W: sweeps alone, rounds per run-round"
    )
    p.add_argument("--block", type=int, default=None, help="rounds per compiled sweep block")
    p.add_argument("--repeats", type=int, default=1, help="the W loop this many times")
    p.add_argument("--gap-s", type=float, default=0.0, help="pause between repeats")
    p.add_argument(
        "--sequential-first",
        action="store_true",
        help="the first W starts with the sequential runs (then the order alternates)",
    )
    p.add_argument(
        "--cpu-devices", type=int, default=None, help="CPU devices (default one per core; 0: "
        "leave JAX's default, e.g. on a GPU)"
    )  # fmt: skip
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/...)")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Options, the preset's values where the command line does not give them; checked."""
    p = parser()
    args = p.parse_args(argv)
    p.set_defaults(**PRESETS[args.preset])
    args = p.parse_args(argv)
    names = available_algorithms()
    args.methods = names if args.algorithms == "all" else tuple(args.algorithms.split(","))
    bad = [m for m in args.methods if m not in names]
    if bad:
        p.error(f"--algorithms: unknown {bad}; allowed: 'all' or comma-separated {names}")
    try:
        args.w_values = [int(w) for w in args.runs.split(",") if w]
        args.scaling_w = [int(w) for w in args.scaling.split(",") if w]
    except ValueError:
        p.error(
            f"--runs and --scaling take comma-separated integers; got {args.runs!r}, "
            f"{args.scaling!r}"
        )
    if (
        min(args.w_values + args.scaling_w, default=1) < 1
        or args.rounds < 1
        or args.rounds_long <= args.rounds
    ):
        p.error("need W >= 1, --rounds >= 1 and --rounds-long > --rounds")
    if args.marginal_runs and args.marginal_runs not in args.w_values:
        p.error(f"--marginal-runs {args.marginal_runs} must be one of --runs {args.w_values}")
    if args.marginal_runs and not 1 <= args.marginal_seq <= args.marginal_runs:
        p.error(f"--marginal-seq must be in 1..{args.marginal_runs}; got {args.marginal_seq}")
    if args.out is None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        args.out = str(REPO / "benchmarks" / "results" / f"bench_sweep_{args.preset}_{stamp}.json")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu_devices != 0:
        pfedwn_jax.use_cpu_devices(args.cpu_devices)  # before any JAX computation
    t0 = time.perf_counter()
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "w_values", "scaling_w")}
    results = {"started": now(), "settings": settings, "machine": machine(), "w_runs": []}
    results["machine"]["devices"] = len(jax.devices())
    clock = CompileClock()
    warm_up(args)
    for rep in range(args.repeats):
        if rep and args.gap_s:
            time.sleep(args.gap_s)
        for i, w in enumerate(args.w_values):
            case = w_case(clock, args, w, sweep_first=(rep + i + args.sequential_first) % 2 == 0)
            results["w_runs"].append({"repeat": rep, "started": now(), **case})
            write_json(args.out, results)  # after every case: an interrupted run keeps it
    if args.marginal_runs:
        short = next(c for c in results["w_runs"] if c["runs"] == args.marginal_runs)
        results["marginal"] = marginal_case(clock, args, short)
        write_json(args.out, results)
    results["scaling"] = []
    for w in args.scaling_w:
        results["scaling"].append(scaling_case(clock, args, w))
        write_json(args.out, results)
    results.update(finished=now(), wall_s=time.perf_counter() - t0, load_end=os.getloadavg())
    write_json(args.out, results)
    print_tables(results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
