"""One FedAvg round (1 local epoch, batch 32): the engine vs a Python loop vs one big batch.

Cases: N clients with sample counts drawn uniformly in 64..600 (seed 0) from real MNIST
images, for the MLP and the CNN. Three executions of the same arithmetic, side by side:

- engine:   `local_train` over all N stacked slots + weighted average, one jitted program.
- loop:     a Python loop over clients calling a jitted per-client epoch (one compiled program
            per distinct step count), accumulating the weighted average on the device; the
            execution model of existing JAX FL libraries.
- bigbatch: one model trained on all the same samples at batch 32*N (the hardware's best case
            for the same number of sample-gradients).

Each (model, N) case runs in its own subprocess; inside it the three methods are compiled, then
their timed rounds are interleaved (engine, loop, bigbatch, engine, ...) so the machine's drift
hits all alike. Reports samples/s (median of `--repeats` timings after one warm-up round; a
timing spans enough rounds to last >= 1 s, so small cases are not timer noise), compile
time, memory of the compiled program (arguments + outputs + temporaries, from XLA's
`memory_analysis`; for the loop its largest per-client program) and the case's process peak
RSS (`ru_maxrss`, which includes the ~N*600*784 bytes of client data).

    python benchmarks/bench_engine.py                                  # all cases, table + JSON
    python benchmarks/bench_engine.py --model cnn --clients 100 --json # one case, one JSON object
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
from pathlib import Path

METHODS = ("engine", "loop", "bigbatch")
MIN_TIMED_S = 1.0  # each timing covers at least this long (several rounds when N is small)
DATA_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
BATCH = 32


def client_counts(num_clients: int):
    import numpy as np

    return np.random.default_rng(0).integers(64, 601, num_clients)


def make_data(num_clients: int):
    """Stacked ClientData of real MNIST images (cycled when N*600 exceeds the file)."""
    import jax.numpy as jnp
    import numpy as np

    from pfedwn_jax.data.client_data import ClientData

    counts = client_counts(num_clients)
    max_samples = 600
    for name in ("mnist.npz", "mnist_10k_2k.npz"):
        if (DATA_DIR / name).exists():
            raw = np.load(DATA_DIR / name)
            images, labels = raw["x_train"], raw["y_train"].astype(np.int32)
            break
    else:  # keeps the benchmark runnable without the data folder (timings are the same)
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, (10000, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, 10000).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = (offsets[:, None] + np.arange(max_samples)[None, :]) % len(images)
    mask = np.arange(max_samples)[None, :] < counts[:, None]
    x = np.where(mask[..., None, None], images[pos], 0)[..., None]
    y = np.where(mask, labels[pos], 0)
    return ClientData(
        jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask), jnp.asarray(counts, jnp.int32)
    )


def _block(tree):
    import jax

    return jax.block_until_ready(tree)


def _compiled_mib(compiled) -> float | None:
    """Device memory of one compiled program: arguments + outputs + temporaries (MiB)."""
    try:
        m = compiled.memory_analysis()
        total = (
            m.argument_size_in_bytes
            + m.output_size_in_bytes
            + m.temp_size_in_bytes
            - m.alias_size_in_bytes
        )
        return total / 2**20
    except Exception:  # not every backend reports it
        return None


def setup_method(
    model_name: str, num_clients: int, method: str, data, strategy: str, chunk_size: int | None
) -> dict:
    """Compile one method's FedAvg round; returns its round closure and static figures."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from pfedwn_jax.data.batching import epoch_indices, steps_per_epoch
    from pfedwn_jax.engine import ClientState, init_client_state, local_train
    from pfedwn_jax.engine.losses import weighted_ce
    from pfedwn_jax.engine.tree import broadcast_slots
    from pfedwn_jax.models import get_model

    counts = np.asarray(data.count)
    total = int(counts.sum())
    weights = jnp.asarray(counts / counts.sum(), jnp.float32)
    model = get_model(model_name, 10, (28, 28, 1))
    opt = optax.sgd(0.05)
    key = jax.random.key(0)
    out: dict = {"samples": total}

    def average(params):
        return jax.tree.map(lambda a: jnp.tensordot(weights, a, axes=1), params)

    if method == "engine":

        def fedavg_round(state, data, key):
            state, _ = local_train(
                model,
                opt,
                state,
                data,
                jnp.arange(num_clients),
                key,
                batch_size=BATCH,
                strategy=strategy,
                chunk_size=chunk_size,
            )
            params = broadcast_slots(average(state.params), num_clients)
            return ClientState(params, state.opt_state)

        from pfedwn_jax.engine import constrain_slots, put_slots, replicate

        def fedavg_round_placed(state, data, key):
            return constrain_slots(fedavg_round(state, data, key), num_clients)

        box = {"state": put_slots(init_client_state(model, opt, key, num_clients), num_clients)}
        data = replicate(data, num_clients)
        fn = jax.jit(fedavg_round_placed, donate_argnums=0)
        t0 = time.perf_counter()
        compiled = fn.lower(box["state"], data, key).compile()
        out["compile_s"] = time.perf_counter() - t0
        out["program_mib"] = _compiled_mib(compiled)

        def run(r):
            box["state"] = _block(compiled(box["state"], data, jax.random.fold_in(key, r)))

        from pfedwn_jax.engine.sharding import resolve_shards
        from pfedwn_jax.engine.strategy import resolve_strategy

        out["strategy"] = list(resolve_strategy(strategy, chunk_size, num_clients))
        out["shards"] = resolve_shards(None, num_clients)

    elif method == "loop":
        box = {"params": model.init(key)}

        def epoch(global_params, acc, x, y, idx, valid, w):
            """One client's epoch of SGD from the global model; adds w * result to acc."""

            def step(p, batch):
                i, v = batch
                loss = lambda p: weighted_ce(
                    model.apply(p, x[i]), y[i], v.astype(jnp.float32), jnp.sum(v)
                )
                g = jax.grad(loss)(p)
                upd, _ = opt.update(g, opt.init(p), p)
                return optax.apply_updates(p, upd), None

            p, _ = jax.lax.scan(step, global_params, (idx, valid))
            return jax.tree.map(lambda a, b: a + w * b, acc, p)

        epoch_jit = jax.jit(epoch, donate_argnums=1)
        spe = steps_per_epoch(int(counts.max()), BATCH)
        # per-client datasets held separately, as FL libraries hold them (not timed)
        xs = [data.x[n] for n in range(num_clients)]
        ys = [data.y[n] for n in range(num_clients)]
        ws = [float(w) for w in np.asarray(weights)]
        # compile time: one program per distinct step count, as the loop pays it
        t0 = time.perf_counter()
        acc0 = jax.tree.map(jnp.zeros_like, box["params"])
        mems = []
        for t_n in sorted({-(-int(c) // BATCH) for c in counts}):
            c = epoch_jit.lower(
                box["params"],
                acc0,
                xs[0],
                ys[0],
                np.zeros((t_n, BATCH), np.int32),
                np.zeros((t_n, BATCH), bool),
                ws[0],
            ).compile()
            mems.append(_compiled_mib(c) or 0.0)
        out["compile_s"] = time.perf_counter() - t0
        out["program_mib"] = max(mems)

        def run(r):
            idx, valid = epoch_indices(
                jax.random.fold_in(key, r), data.count, data.max_samples, BATCH, spe
            )
            idx, valid = np.asarray(idx), np.asarray(valid)
            params = box["params"]
            acc = jax.tree.map(jnp.zeros_like, params)
            for n in range(num_clients):
                t_n = -(-int(counts[n]) // BATCH)
                acc = epoch_jit(params, acc, xs[n], ys[n], idx[n, :t_n], valid[n, :t_n], ws[n])
            box["params"] = _block(acc)

    elif method == "bigbatch":
        box = {"params": model.init(key)}
        flat_x = data.x[data.mask]
        flat_y = data.y[data.mask]
        big = BATCH * num_clients
        steps = -(-total // big)

        def train(params, x, y, key):
            perm = jax.random.permutation(key, steps * big) % total

            def step(p, i):
                idx = jax.lax.dynamic_slice(perm, (i * big,), (big,))
                g = jax.grad(
                    lambda p: weighted_ce(model.apply(p, x[idx]), y[idx], jnp.ones(big), big)
                )(p)
                upd, _ = opt.update(g, opt.init(p), p)
                return optax.apply_updates(p, upd), None

            p, _ = jax.lax.scan(step, params, jnp.arange(steps))
            return p

        fn = jax.jit(train, donate_argnums=0)
        t0 = time.perf_counter()
        compiled = fn.lower(box["params"], flat_x, flat_y, key).compile()
        out["compile_s"] = time.perf_counter() - t0
        out["program_mib"] = _compiled_mib(compiled)

        def run(r):
            box["params"] = _block(
                compiled(box["params"], flat_x, flat_y, jax.random.fold_in(key, r))
            )

        out["samples"] = steps * big  # it processes whole batches
    else:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    out["run"] = run
    return out


def run_case(
    model_name: str,
    num_clients: int,
    methods: list[str],
    repeats: int,
    strategy: str,
    chunk_size: int | None,
) -> dict:
    """All methods of one (model, N) in this process, timed rounds interleaved.

    One warm-up round each, then `repeats` rounds of engine, loop, bigbatch, engine, ... so that
    the machine's drift hits every method alike; samples/s is from the median round.
    """
    import jax

    data = make_data(num_clients)
    cases = {
        m: setup_method(model_name, num_clients, m, data, strategy, chunk_size) for m in methods
    }
    times: dict[str, list[float]] = {m: [] for m in methods}
    for m in methods:  # warm-up round
        t0 = time.perf_counter()
        cases[m]["run"](0)
        times[m].append(time.perf_counter() - t0)
    # short rounds (small N) are timed in batches of `inner` rounds of >= MIN_TIMED_S together
    inner = {m: max(1, math.ceil(MIN_TIMED_S / max(times[m][0], 1e-6))) for m in methods}
    for r in range(repeats):
        for m in methods:
            t0 = time.perf_counter()
            for i in range(inner[m]):
                cases[m]["run"](1 + r * inner[m] + i)
            times[m].append((time.perf_counter() - t0) / inner[m])
    result = {}
    for m in methods:
        res = {k: v for k, v in cases[m].items() if k != "run"}
        steady = sorted(times[m][1:])
        res["round_s"] = steady[len(steady) // 2]
        res["rounds_s"] = times[m]
        res["rounds_per_timing"] = inner[m]
        res["samples_per_s"] = res["samples"] / res["round_s"]
        result[m] = res
    result["process_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["backend"] = jax.default_backend()
    return result


def run_in_subprocess(model: str, clients: int, methods: list[str], args) -> dict:
    """One (model, N) case in a fresh process (so its peak RSS is its own)."""
    cmd = [
        sys.executable,
        __file__,
        "--case",
        "--model",
        model,
        "--clients",
        str(clients),
        "--methods",
        ",".join(methods),
        "--repeats",
        str(args.repeats),
        "--strategy",
        args.strategy,
    ]
    if args.chunk_size:
        cmd += ["--chunk-size", str(args.chunk_size)]
    if args.cpu_devices:
        cmd += ["--cpu-devices", str(args.cpu_devices)]
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


def run_torch(model: str, clients: int, args) -> dict:
    """The PyTorch per-client loop (`bench_torch_loop.py`) in `--torch-python`, right after
    the JAX case on the same machine (not interleaved: it is another process)."""
    script = Path(__file__).with_name("bench_torch_loop.py")
    cmd = [args.torch_python, str(script), "--model", model, "--clients", str(clients)]
    cmd += ["--repeats", str(args.repeats)]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=args.timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def machine() -> dict:
    import jax

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0]),
        "jax": jax.__version__,
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="all", choices=["all", "mlp", "cnn"])
    p.add_argument("--clients", default="10,100,1000", help="comma-separated N values")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up")
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
        help="an interpreter with torch: also run the PyTorch per-client loop "
        "(bench_torch_loop.py) after each case",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    p.add_argument("--out", default=None, help="also write all results to this JSON file")
    p.add_argument("--case", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    models = ["mlp", "cnn"] if args.model == "all" else [args.model]
    clients = [int(c) for c in args.clients.split(",")]
    methods = [m for m in args.methods.split(",") if m]
    if args.case:  # internal: one (model, N) case measured in this process
        from pfedwn_jax.devices import use_cpu_devices

        use_cpu_devices(args.cpu_devices)  # before any JAX computation of this process
        res = run_case(models[0], clients[0], methods, args.repeats, args.strategy, args.chunk_size)
        print(json.dumps(res))
        return 0

    results = {"machine": machine(), "cases": []}
    for model in models:
        for n in clients:
            case = run_in_subprocess(model, n, methods, args)
            if args.torch_python:
                case["torch"] = run_torch(model, n, args)
            if args.json and len(models) == 1 and len(clients) == 1:
                print(json.dumps(case))
                return 0
            results["cases"].append({"model": model, "clients": n, **case})
            if not args.json:
                print_row(model, n, case)
    if args.json:
        print(json.dumps(results))
    if args.out:
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1))
        os.replace(tmp, args.out)
    return 0


def print_row(model: str, n: int, case: dict) -> None:
    methods = [m for m in METHODS if m in case]

    def cell(r: dict) -> str:
        if "error" in r:
            return f"{r['error'][:30]:>30}"
        mib = r.get("program_mib")
        return (
            f"{r['samples_per_s']:>9,.0f} {r['compile_s']:>6.1f}s "
            f"{'-' if mib is None else f'{mib:,.0f}M':>8}"
        )

    if not getattr(print_row, "header", False):
        print(
            f"{'model':<5} {'N':>5} | "
            + " | ".join(f"{m + ': samples/s compile memory':>30}" for m in methods)
        )
        print_row.header = True
    eng, loop, big = (case.get(m, {}) for m in METHODS)
    ratio = ""
    if all("samples_per_s" in r for r in (eng, loop, big)):
        ratio = (
            f" | engine/loop {eng['samples_per_s'] / loop['samples_per_s']:.2f}x, "
            f"engine/bigbatch {eng['samples_per_s'] / big['samples_per_s']:.2f}x"
        )
    torch_r = case.get("torch", {})
    if "samples_per_s" in torch_r and "samples_per_s" in eng:
        ratio += (
            f" | torch loop {torch_r['samples_per_s']:,.0f}/s, "
            f"engine/torch {eng['samples_per_s'] / torch_r['samples_per_s']:.2f}x"
        )
    rss = case.get("process_peak_rss_mib")
    print(
        f"{model:<5} {n:>5} | "
        + " | ".join(cell(case[m]) for m in methods)
        + ratio
        + (f" | process peak RSS {rss:,.0f}M" if rss else ""),
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
