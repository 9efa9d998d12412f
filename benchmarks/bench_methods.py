"""The executions `bench_engine.py` times: one FedAvg round (1 local epoch, batch 32), four ways.

Each `setup_*` builds and compiles one method for a `Case` and returns a `Method` whose
`timed(first, rounds)` runs rounds `first, first + 1, ...` to completion and returns the
seconds they took. The PyTorch method is a worker process (`bench_torch_loop.py --serve`) that
waits on its stdin between requests, so it can be timed between the JAX methods.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pfedwn_jax.data.batching import epoch_indices, steps_per_epoch
from pfedwn_jax.data.client_data import ClientData
from pfedwn_jax.engine import (
    ClientState,
    broadcast_slots,
    constrain_slots,
    init_client_state,
    local_train,
    put_slots,
    replicate,
    resolve_shards,
    resolve_strategy,
    weighted_ce,
)
from pfedwn_jax.models import get_model

JAX_METHODS = ("engine", "loop", "bigbatch")
DATA_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
BATCH = 32
MAX_SAMPLES = 600  # per client; counts are drawn uniformly in 64..MAX_SAMPLES
TORCH_SCRIPT = Path(__file__).with_name("bench_torch_loop.py")


def client_counts(num_clients: int) -> np.ndarray:
    """Samples per client `[N]`, uniform in 64..600 (seed 0; `bench_torch_loop.py` agrees)."""
    return np.random.default_rng(0).integers(64, MAX_SAMPLES + 1, num_clients)


def load_images() -> tuple[np.ndarray, np.ndarray, str]:
    """MNIST train images `[M, 28, 28]` uint8, labels `[M]` and the file's name; random
    images of the same shape where the data folder is missing (the timings are the same)."""
    for name in ("mnist.npz", "mnist_10k_2k.npz"):
        if (DATA_DIR / name).exists():
            raw = np.load(DATA_DIR / name)
            return raw["x_train"], raw["y_train"].astype(np.int32), name
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (10000, 28, 28), dtype=np.uint8)
    return images, rng.integers(0, 10, 10000).astype(np.int32), "random"


def make_data(num_clients: int) -> tuple[ClientData, str]:
    """Stacked ClientData `[N, 600, 28, 28, 1]` (images cycled when N*600 exceeds the file)
    and the data's source."""
    images, labels, source = load_images()
    counts = client_counts(num_clients)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = (offsets[:, None] + np.arange(MAX_SAMPLES)[None, :]) % len(images)
    mask = np.arange(MAX_SAMPLES)[None, :] < counts[:, None]
    x = np.where(mask[..., None, None], images[pos], 0)[..., None]
    y = np.where(mask, labels[pos], 0)
    data = ClientData(
        jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask), jnp.asarray(counts, jnp.int32)
    )
    return data, source


class Case(NamedTuple):
    """One (model, N) case: the model, plain SGD lr 0.05, the clients' data, their sample
    counts `[N]` and weights `[N]` (count / total), and the engine's execution strategy."""

    model_name: str
    num_clients: int
    data: ClientData
    strategy: str
    chunk_size: int | None
    model: Any
    opt: optax.GradientTransformation
    counts: np.ndarray
    weights: jax.Array
    key: jax.Array

    @property
    def samples(self) -> int:
        return int(self.counts.sum())


def make_case(
    model_name: str, data: ClientData, strategy: str = "auto", chunk_size: int | None = None
) -> Case:
    """The case of `data`'s N clients for model `mlp` or `cnn`."""
    counts = np.asarray(data.count)
    model = get_model(model_name, 10, (28, 28, 1))
    weights = jnp.asarray(counts / counts.sum(), jnp.float32)
    n = len(counts)
    key = jax.random.key(0)
    jax.random.fold_in(key, 0)  # compiles on its first call: here, not in a timed round
    return Case(
        model_name, n, data, strategy, chunk_size, model, optax.sgd(0.05), counts, weights, key
    )


@dataclass
class Method:
    """A compiled method: `timed(first, rounds) -> seconds`, its sample-gradients per round and
    static figures (compile time, program memory, ...) for the JSON."""

    timed: Callable[[int, int], float]
    samples: int
    figures: dict
    close: Callable[[], None] = lambda: None


def _timed_rounds(run: Callable[[int], None]) -> Callable[[int, int], float]:
    """`timed(first, rounds)` from a one-round `run(r)` that blocks until the round is done."""

    def timed(first: int, rounds: int) -> float:
        t0 = time.perf_counter()
        for r in range(first, first + rounds):
            run(r)
        return time.perf_counter() - t0

    return timed


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


def _compile(fn, *args) -> tuple[Any, dict]:
    """Compile a jitted `fn` for `args`; returns it and its compile time and memory."""
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    figures = {"compile_s": time.perf_counter() - t0, "program_mib": _compiled_mib(compiled)}
    return compiled, figures


def _weighted_mean(weights: jax.Array, params):
    """`sum_n weights[n] params[n]` per leaf: stacked `[N, ...]` -> one model `[...]`."""
    return jax.tree.map(lambda a: jnp.tensordot(weights, a, axes=1), params)


def _sgd_step(c: Case, p, x: jax.Array, y: jax.Array, valid: jax.Array, denom):
    """One SGD step of `c.opt` on the weighted cross-entropy of batch `x [B, ...]`, `y [B]`."""
    g = jax.grad(lambda p: weighted_ce(c.model.apply(p, x), y, valid, denom))(p)
    upd, _ = c.opt.update(g, c.opt.init(p), p)
    return optax.apply_updates(p, upd)


def setup_engine(c: Case) -> Method:
    """`local_train` over all N stacked slots + weighted average + broadcast: one jitted program
    with the state donated, slots split over the devices as the engine does."""
    n = c.num_clients

    def fedavg_round(state: ClientState, data: ClientData, key: jax.Array) -> ClientState:
        kw = {"batch_size": BATCH, "strategy": c.strategy, "chunk_size": c.chunk_size}
        state, _ = local_train(c.model, c.opt, state, data, jnp.arange(n), key, **kw)
        params = broadcast_slots(_weighted_mean(c.weights, state.params), n)
        return constrain_slots(ClientState(params, state.opt_state), n)

    box = {"state": put_slots(init_client_state(c.model, c.opt, c.key, n), n)}
    data = replicate(c.data, n)
    fn = jax.jit(fedavg_round, donate_argnums=0)
    compiled, figures = _compile(fn, box["state"], data, c.key)

    def run(r: int) -> None:
        box["state"] = jax.block_until_ready(
            compiled(box["state"], data, jax.random.fold_in(c.key, r))
        )

    figures["strategy"] = list(resolve_strategy(c.strategy, c.chunk_size, n))
    figures["shards"] = resolve_shards(None, n)
    return Method(_timed_rounds(run), c.samples, figures)


def _loop_epoch(c: Case) -> Callable:
    """One client's epoch of SGD from the global model, adding `w * result` to `acc`."""

    def epoch(global_params, acc, x, y, idx, valid, w):
        def step(p, batch):
            i, v = batch
            return _sgd_step(c, p, x[i], y[i], v.astype(jnp.float32), jnp.sum(v)), None

        p, _ = jax.lax.scan(step, global_params, (idx, valid))
        return jax.tree.map(lambda a, b: a + w * b, acc, p)

    return jax.jit(epoch, donate_argnums=1)


def _compile_loop(epoch_jit, params, x0: jax.Array, y0: jax.Array, counts: np.ndarray) -> dict:
    """Compile one program per distinct step count, as the loop pays it (`compile_s`, the
    largest `program_mib`); then call each once (`prime_s`), so no timed round pays a
    first call."""
    acc0 = jax.tree.map(jnp.zeros_like, params)
    shapes = [(t_n, BATCH) for t_n in sorted({-(-int(k) // BATCH) for k in counts})]
    t0 = time.perf_counter()
    mems = []
    for shape in shapes:
        idx, valid = np.zeros(shape, np.int32), np.ones(shape, bool)
        compiled = epoch_jit.lower(params, acc0, x0, y0, idx, valid, 0.5).compile()
        mems.append(_compiled_mib(compiled) or 0.0)
    compile_s, t0 = time.perf_counter() - t0, time.perf_counter()
    for shape in shapes:
        acc = jax.tree.map(jnp.zeros_like, params)
        idx, valid = np.zeros(shape, np.int32), np.ones(shape, bool)
        jax.block_until_ready(epoch_jit(params, acc, x0, y0, idx, valid, 0.5))
    return {"compile_s": compile_s, "program_mib": max(mems), "prime_s": time.perf_counter() - t0}


def setup_loop(c: Case) -> Method:
    """A Python loop over clients calling a jitted per-client epoch (clients' data held
    separately), accumulating the weighted average on the device: how JAX FL libraries run."""
    epoch_jit = _loop_epoch(c)
    box = {"params": c.model.init(c.key)}
    xs = [c.data.x[n] for n in range(c.num_clients)]
    ys = [c.data.y[n] for n in range(c.num_clients)]
    ws = [float(w) for w in np.asarray(c.weights)]
    steps = [-(-int(k) // BATCH) for k in c.counts]
    spe = steps_per_epoch(int(c.counts.max()), BATCH)
    figures = _compile_loop(epoch_jit, box["params"], xs[0], ys[0], c.counts)

    def indices(r: int) -> tuple[np.ndarray, np.ndarray]:
        key = jax.random.fold_in(c.key, r)
        idx, valid = epoch_indices(key, c.data.count, c.data.max_samples, BATCH, spe)
        return np.asarray(idx), np.asarray(valid)

    indices(0)  # its ops compile on their first call: here, not in a timed round

    def run(r: int) -> None:
        idx, valid = indices(r)
        params = box["params"]
        acc = jax.tree.map(jnp.zeros_like, params)
        for n, t_n in enumerate(steps):
            acc = epoch_jit(params, acc, xs[n], ys[n], idx[n, :t_n], valid[n, :t_n], ws[n])
        box["params"] = jax.block_until_ready(acc)

    return Method(_timed_rounds(run), c.samples, figures)


def setup_bigbatch(c: Case) -> Method:
    """One model trained on all the same samples at batch 32*N: the hardware's best case for
    the same number of sample-gradients (it processes whole batches)."""
    total, big = c.samples, BATCH * c.num_clients
    steps = -(-total // big)
    flat_x, flat_y = c.data.x[c.data.mask], c.data.y[c.data.mask]

    def train(params, x, y, key):
        perm = jax.random.permutation(key, steps * big) % total

        def step(p, i):
            idx = jax.lax.dynamic_slice(perm, (i * big,), (big,))
            return _sgd_step(c, p, x[idx], y[idx], jnp.ones(big), big), None

        return jax.lax.scan(step, params, jnp.arange(steps))[0]

    box = {"params": c.model.init(c.key)}
    compiled, figures = _compile(
        jax.jit(train, donate_argnums=0), box["params"], flat_x, flat_y, c.key
    )

    def run(r: int) -> None:
        key = jax.random.fold_in(c.key, r)
        box["params"] = jax.block_until_ready(compiled(box["params"], flat_x, flat_y, key))

    return Method(_timed_rounds(run), steps * big, figures)


SETUPS: dict[str, Callable[[Case], Method]] = {
    "engine": setup_engine,
    "loop": setup_loop,
    "bigbatch": setup_bigbatch,
}


def setup_method(c: Case, method: str) -> Method:
    """Compile one JAX method (`JAX_METHODS`) for case `c`."""
    if method not in SETUPS:
        raise ValueError(f"method must be one of {JAX_METHODS}; got {method!r}")
    return SETUPS[method](c)


class TorchUnavailable(RuntimeError):
    """The PyTorch worker could not start (no torch in that interpreter, no interpreter, ...)."""


def setup_torch(model_name: str, num_clients: int, torch_python: str) -> Method:
    """Start `bench_torch_loop.py --serve` in `torch_python` and wait until its data is ready.

    Raises `TorchUnavailable` with the worker's last error line when it does not start (or,
    from `timed`, when it dies).
    """
    cmd = [torch_python, str(TORCH_SCRIPT), "--serve", "--model", model_name]
    cmd += ["--clients", str(num_clients)]
    # stderr to a file, not a pipe, so warnings cannot fill it up; it lives until `close`
    errors = tempfile.TemporaryFile("w+")  # noqa: SIM115
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True
        )
    except OSError as e:
        raise TorchUnavailable(f"{torch_python}: {e}") from e

    def last_error() -> str:
        errors.seek(0)
        lines = errors.read().strip().splitlines()
        return lines[-1] if lines else f"exit status {proc.poll()}"

    def request(line: str | None) -> dict:
        try:
            if line is not None:
                proc.stdin.write(line + "\n")
                proc.stdin.flush()
            reply = proc.stdout.readline()
        except BrokenPipeError:
            reply = ""
        if not reply:
            proc.wait()
            raise TorchUnavailable(last_error())
        return json.loads(reply)

    def close() -> None:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        proc.wait()
        errors.close()

    figures = request(None)  # the worker's info line, once its data is built
    figures["startup_s"] = time.perf_counter() - t0
    samples = figures.pop("samples")
    return Method(lambda first, rounds: request(str(rounds))["seconds"], samples, figures, close)
