"""`run(config) -> Result`: every configured method on the same network and partition.

Per method, one compiled program does a whole round (the algorithm's local training and
aggregation) plus the evaluation of every slot's personalised model on its test split and
the algorithm's per-round records. Randomness: the initial model comes from
`fold_in(PRNGKey(seed), 0)` and round `r`'s key is `fold_in(fold_in(PRNGKey(seed), 1), r)`,
the same for every method, so methods start from the same model and see the same batch
orders, and a resumed run repeats an uninterrupted one exactly.

Checkpoints: with `checkpoint=PATH`, after every completed round the finished methods'
results, the current method's metrics so far and its full state are written atomically to
one `.npz` file; `resume=True` continues from it (the config must be the same).

The steps of `run`, each usable on its own:

1. `setup(config, shards) -> Experiment`: data, model, federation, `RoundContext`, placement.
2. `read_resume(checkpoint, config) -> Resume`: what a checkpoint says is already done.
3. `run_method(exp, alg, hp, entry, ...)`: one method's rounds; each round is `_step`
   (compiled once per method by `compile_round`), its host-side results go into the method's
   `entry` dict (`fetch_round`, `append_round`) and `after_round` checkpoints.
4. `assemble_result(exp, methods, ...) -> Result`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from pfedwn_jax.algorithms import Algorithm, RoundContext, get_algorithm, hparams_dict
from pfedwn_jax.data import DEFAULT_DATASET, ClientData, FederatedData, load_dataset, make_federated
from pfedwn_jax.engine import constrain_slots, evaluate, put_slots, replicate, resolve_shards
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.federation import Federation, build_federation
from pfedwn_jax.experiment.results import Result, to_jsonable
from pfedwn_jax.io import atomic_write_with, check_writable_file
from pfedwn_jax.models import get_model

ProgressCallback = Callable[[str, int, dict[str, Any]], None]
# after_round(rounds_done, entry, state, row): called by `run_method` after every round
RoundHook = Callable[[int, dict[str, Any], Any, dict[str, Any]], None]


# --------------------------------------------------------------------------- setup
def load_data(config: ExperimentConfig) -> FederatedData:
    """The partitioned `FederatedData` (host arrays) for `config`."""
    name = config.dataset or DEFAULT_DATASET
    try:
        dataset = load_dataset(name, data_dir=config.data_dir)
    except ValueError as e:
        raise ValueError(f"dataset: {e}") from None
    seed = config.seed if config.data_seed is None else config.data_seed
    try:
        return make_federated(
            dataset,
            config.num_clients,
            scheme=config.partition,
            seed=seed,
            alpha=config.alpha,
            train_frac=config.train_frac,
        )
    except ValueError as e:
        raise ValueError(f"partition: {e}") from None


def build_model(config: ExperimentConfig, num_classes: int, input_shape: tuple[int, ...]):
    """The engine `Model`; a model that does not fit the data fails naming `model`."""
    try:
        return get_model(config.model, num_classes, tuple(int(s) for s in input_shape))
    except ValueError as e:
        raise ValueError(f"model: {config.model!r} does not fit the data: {e}") from None


def build_optimizer(config: ExperimentConfig) -> optax.GradientTransformation:
    """SGD; equal settings give the same object, so compiled rounds are reused in-process."""
    return _sgd(float(config.lr), float(config.momentum))


@functools.lru_cache(maxsize=16)
def _sgd(lr: float, momentum: float) -> optax.GradientTransformation:
    return optax.sgd(lr, momentum=momentum or None)


def build_context(
    config: ExperimentConfig, fed: Federation, data: FederatedData, model: Any, optimizer: Any
) -> RoundContext:
    """The `RoundContext` of the experiment (device arrays, not yet placed)."""
    train = jax.tree_util.tree_map(jnp.asarray, data.train)
    data_client = jnp.asarray(fed.data_client, jnp.int32)
    num_samples = jnp.asarray(np.asarray(data.train.count)[fed.data_client], jnp.float32)
    return RoundContext(
        model=model,
        optimizer=optimizer,
        train=train,
        data_client=data_client,
        adjacency=jnp.asarray(fed.adjacency, bool),
        is_target=jnp.asarray(fed.is_target, bool),
        num_samples=num_samples,
        batch_size=config.batch_size,
        local_epochs=config.local_epochs,
        num_steps=config.local_steps,
    )


def environment() -> dict[str, Any]:
    """The `environment` entry of the results: jax version, backend, devices."""
    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
    }


def round_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """(init key, root of the per-round keys), identical for every method."""
    root = jax.random.PRNGKey(seed)
    return jax.random.fold_in(root, 0), jax.random.fold_in(root, 1)


@dataclasses.dataclass(frozen=True, eq=False)
class Experiment:
    """One experiment set up on the devices: what the rounds of every method share.

    Attributes:
      config: the experiment.
      data: the partitioned data (host arrays; `data.train.x [N, n, ...]`).
      federation: the federation (host), `S` model slots.
      ctx: the `RoundContext`, slots split over `ctx.shards` devices, the rest replicated.
      test: `[N, ...]` test splits of every data client (device, replicated).
      init_key: key of every method's initial state.
      round_root: root of the per-round keys (`round_key(r)`).
    """

    config: ExperimentConfig
    data: FederatedData
    federation: Federation
    ctx: RoundContext
    test: ClientData
    init_key: jax.Array
    round_root: jax.Array

    def round_key(self, r: int) -> jax.Array:
        """Round `r`'s key, the same for every method."""
        return jax.random.fold_in(self.round_root, r)


def setup(config: ExperimentConfig, shards: int | None = None) -> Experiment:
    """Load data, build model and federation, place everything (nothing is compiled).

    Every check that needs the data (does the model fit?) fails here with a `ValueError`.
    """
    data = load_data(config)
    model = build_model(config, data.num_classes, data.train.x.shape[2:])
    fed = build_federation(config)
    ctx = build_context(config, fed, data, model, build_optimizer(config))
    test = jax.tree_util.tree_map(jnp.asarray, data.test)
    # Several devices (CPU cores via `use_cpu_devices`, GPUs): slots split, the rest replicated.
    ctx = ctx.replace(shards=resolve_shards(shards, ctx.num_slots))
    ctx, test = replicate((ctx, test), ctx.num_slots, ctx.shards)
    init_key, round_root = round_keys(config.seed)
    return Experiment(config, data, fed, ctx, test, init_key, round_root)


# --------------------------------------------------------------------------- one round
def _step(alg, hp, state, key, ctx, test):
    """One round plus evaluation and records: the compiled unit of the runner."""
    state = alg.round(state, key, ctx, hp)
    state = constrain_slots(state, ctx.num_slots, ctx.shards)  # where it came in: one compile
    params = alg.eval_params(state, ctx, hp)
    metrics = evaluate(ctx.model, params, test, ctx.data_client)
    records = alg.records(state, ctx, hp) if alg.records is not None else {}
    return state, metrics, records


@functools.lru_cache(maxsize=32)
def jitted_step(alg, hp):
    """The jitted round of `alg` with hyperparameters `hp` (cached: one compile per process
    for equal algorithm, hyperparameters, context structure and shapes)."""
    return jax.jit(functools.partial(_step, alg, hp), donate_argnums=0)


def init_state(
    exp: Experiment, alg: Algorithm, hp: Any, leaves: list[np.ndarray] | None = None
) -> Any:
    """The method's initial state, or a checkpoint's `leaves` in its structure; slots placed."""
    state = alg.init(exp.init_key, exp.ctx, hp)
    if leaves is not None:
        state = restore_state(state, leaves)
    return put_slots(state, exp.ctx.num_slots, exp.ctx.shards)


def compile_round(exp: Experiment, alg: Algorithm, hp: Any, state: Any) -> tuple[Any, float]:
    """`(compiled round, seconds)`: `compiled(state, key, exp.ctx, exp.test)` runs `_step`."""
    t0 = time.perf_counter()
    compiled = jitted_step(alg, hp).lower(state, exp.round_root, exp.ctx, exp.test).compile()
    return compiled, time.perf_counter() - t0


def fetch_round(
    metrics: dict[str, jax.Array], records: dict[str, jax.Array]
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Device to host (waits for the round): `accuracy [S]`, `loss [S]` (float64), records."""
    acc = np.asarray(metrics["accuracy"], np.float64)
    loss = np.asarray(metrics["loss"], np.float64)
    return acc, loss, {k: np.asarray(v) for k, v in records.items()}


# --------------------------------------------------------------------------- one method's results
def new_entry(hp: Any) -> dict[str, Any]:
    """An empty `Result.methods[name]` entry for a method with hyperparameters `hp`."""
    return {
        "hparams": hparams_dict(hp),
        "target_accuracy": [],
        "target_loss": [],
        "client_accuracy": [],
        "client_loss": [],
        "records": {},
        "timings": {"compile_s": 0.0, "round_s": []},
    }


def append_round(
    entry: dict[str, Any],
    acc: np.ndarray,
    loss: np.ndarray,
    records: dict[str, np.ndarray],
    is_target: np.ndarray,
    seconds: float,
) -> dict[str, Any]:
    """Add one round (`acc [S]`, `loss [S]`, records) to `entry`; returns the round's row."""
    entry["timings"]["round_s"].append(seconds)
    row = {
        "target_accuracy": float(acc[is_target].mean()),
        "target_loss": float(loss[is_target].mean()),
        "client_accuracy": acc.tolist(),
        "client_loss": loss.tolist(),
    }
    for k, v in row.items():
        entry[k].append(v)
    for k, v in records.items():
        entry["records"].setdefault(k, []).append(v.tolist())
    return row


def finish_entry(entry: dict[str, Any]) -> None:
    """Add the summary (max and final target accuracy, total time); idempotent."""
    acc = np.array(entry["target_accuracy"], dtype=float)
    entry["max_target_accuracy"] = float(np.nanmax(acc)) if np.isfinite(acc).any() else None
    entry["final_target_accuracy"] = float(acc[-1]) if len(acc) else None
    entry["timings"]["total_s"] = float(
        entry["timings"]["compile_s"] + sum(entry["timings"]["round_s"])
    )


# --------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: Path, progress: dict[str, Any], state: Any | None) -> None:
    """One atomic `.npz`: the progress JSON plus the current method's state leaves."""
    arrays = {"progress": np.array(json.dumps(to_jsonable(progress)))}
    if state is not None:
        for i, leaf in enumerate(jax.tree_util.tree_leaves(state)):
            arrays[f"leaf_{i:05d}"] = np.asarray(leaf)
    atomic_write_with(path, lambda f: np.savez(f, **arrays))


def checkpoint_progress(
    config: ExperimentConfig,
    done: dict[str, dict[str, Any]],
    current: str | None = None,
    entry: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The checkpoint's progress JSON: finished methods, the current one and its entry."""
    return {"config": config.to_dict(), "methods": done, "current": current, "current_entry": entry}


def load_checkpoint(path: Path) -> tuple[dict[str, Any], list[np.ndarray]]:
    """`(progress JSON, state leaves)` of a checkpoint written by `save_checkpoint`."""
    with np.load(path, allow_pickle=False) as z:
        progress = json.loads(str(z["progress"]))
        leaves = [z[k] for k in sorted(k for k in z.files if k.startswith("leaf_"))]
    return progress, leaves


def restore_state(template: Any, leaves: list[np.ndarray]) -> Any:
    """`template`'s structure with the checkpoint's leaves (shapes and dtypes checked)."""
    flat, treedef = jax.tree_util.tree_flatten(template)
    if len(flat) != len(leaves):
        raise ValueError(f"checkpoint state has {len(leaves)} arrays, expected {len(flat)}")
    out = []
    for t, leaf in zip(flat, leaves, strict=True):
        if tuple(t.shape) != tuple(leaf.shape) or jnp.dtype(t.dtype) != leaf.dtype:
            raise ValueError(
                f"checkpoint state array {leaf.shape} {leaf.dtype} does not match "
                f"{tuple(t.shape)} {t.dtype}"
            )
        out.append(jnp.asarray(leaf))
    return jax.tree_util.tree_unflatten(treedef, out)


@dataclasses.dataclass
class Resume:
    """What a checkpoint says is done.

    Attributes:
      done: finished methods' entries, by name.
      current: the method that was running (None: none).
      entry: its entry so far.
      leaves: its state's leaves after the last completed round.
    """

    done: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    current: str | None = None
    entry: dict[str, Any] | None = None
    leaves: list[np.ndarray] | None = None


def read_resume(checkpoint: Path | None, config: ExperimentConfig) -> Resume:
    """The progress in `checkpoint` (nothing done if there is none); it must be `config`'s."""
    if checkpoint is None or not checkpoint.exists():
        return Resume()
    saved, leaves = load_checkpoint(checkpoint)
    if saved.get("config") != to_jsonable(config.to_dict()):
        raise ValueError(f"resume: checkpoint {checkpoint} was written for a different config")
    current = saved.get("current")
    if current is None:
        return Resume(saved["methods"])
    return Resume(saved["methods"], current, saved["current_entry"], leaves)


# --------------------------------------------------------------------------- one method
def run_method(
    exp: Experiment,
    alg: Algorithm,
    hp: Any,
    entry: dict[str, Any],
    *,
    leaves: list[np.ndarray] | None = None,
    name: str = "",
    progress: bool = False,
    after_round: RoundHook | None = None,
) -> dict[str, Any]:
    """Rounds `len(entry["target_accuracy"])` .. `rounds - 1` of one method; returns `entry`.

    `entry` (a `new_entry` or a checkpoint's, updated in place) and `leaves` (the state after
    its last round) say where the method starts. After each round, with the round's results in
    `entry` (finished after the last round), `after_round(rounds_done, entry, state, row)` runs.
    """
    state = init_state(exp, alg, hp, leaves)
    compiled, compile_s = compile_round(exp, alg, hp, state)
    entry["timings"]["compile_s"] += compile_s
    rounds, start = exp.config.rounds, len(entry["target_accuracy"])
    if 0 < start < rounds:  # times from here on add to those of the interrupted process
        entry["timings"].setdefault("resumed_at", []).append(start)
    is_target = np.asarray(exp.federation.is_target)
    bar = _progress_bar(name, rounds, start, progress)
    try:
        for r in range(start, rounds):
            t0 = time.perf_counter()
            state, metrics, records = compiled(state, exp.round_key(r), exp.ctx, exp.test)
            acc, loss, records = fetch_round(metrics, records)
            row = append_round(entry, acc, loss, records, is_target, time.perf_counter() - t0)
            if r + 1 == rounds:
                finish_entry(entry)
            bar.update(1)
            bar.set_postfix(target_acc=f"{row['target_accuracy']:.3f}")
            if after_round is not None:
                after_round(r + 1, entry, state, row)
    finally:
        bar.close()
    finish_entry(entry)  # also when the checkpoint already held every round
    return entry


def _progress_bar(name: str, total: int, initial: int, enabled: bool) -> tqdm | LineProgress:
    """A tqdm bar on a terminal (or notebook); plain lines where stderr is a log file."""
    if enabled and not _interactive():
        return LineProgress(name, total, initial)
    return tqdm(
        total=total,
        initial=initial,
        desc=f"{name:>9}",
        unit="round",
        disable=not enabled,
        leave=True,
        dynamic_ncols=True,
    )


def _interactive() -> bool:
    """Whether a redrawn bar shows as one line: stderr is a terminal, or tqdm is a notebook's."""
    if any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__):
        return True
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


class LineProgress:
    """Progress as plain stderr lines, for logs: every `max(1, total // 10)` rounds and the last.

    The part of tqdm's interface `run_method` uses: `update(n)`, then `set_postfix(**values)`
    (which prints the line of a round that is due), `close()`.
    """

    def __init__(self, name: str, total: int, initial: int = 0) -> None:
        self.name, self.total, self.done = name, total, initial
        self.every = max(1, total // 10)
        self.postfix: dict[str, Any] = {}
        self.due = False
        self.t0 = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.done += n
        self.due = self.done % self.every == 0 or self.done == self.total

    def set_postfix(self, **values: Any) -> None:
        self.postfix = values
        if self.due:
            self._print()

    def close(self) -> None:
        if self.due:
            self._print()

    def _print(self) -> None:
        extra = "".join(f", {k}={v}" for k, v in self.postfix.items())
        elapsed = time.perf_counter() - self.t0
        print(
            f"{self.name:>9}: round {self.done}/{self.total}{extra} ({elapsed:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
        self.due = False


def checkpoint_hook(
    config: ExperimentConfig,
    name: str,
    done: dict[str, dict[str, Any]],
    checkpoint: Path | None,
    callback: ProgressCallback | None,
) -> RoundHook:
    """`after_round` of method `name` in `run`: write the checkpoint, then call `callback`.

    Before the last round the checkpoint holds `done`, the method's entry and state; after it,
    `done` plus the finished method and no state.
    """

    def after_round(rounds_done: int, entry: dict, state: Any, row: dict[str, Any]) -> None:
        if checkpoint is not None:
            if rounds_done < config.rounds:
                save_checkpoint(checkpoint, checkpoint_progress(config, done, name, entry), state)
            else:
                save_checkpoint(
                    checkpoint, checkpoint_progress(config, {**done, name: entry}), None
                )
        if callback is not None:
            callback(name, rounds_done, row)

    return after_round


# --------------------------------------------------------------------------- results
def data_info(data: FederatedData) -> dict[str, Any]:
    """The `data` entry of the results: name, classes, input shape, per-client counts."""
    return {
        "name": data.name,
        "num_classes": int(data.num_classes),
        "input_shape": [int(s) for s in data.train.x.shape[2:]],
        "train_counts": np.asarray(data.train.count).tolist(),
        "test_counts": np.asarray(data.test.count).tolist(),
    }


def assemble_result(
    exp: Experiment, methods: dict[str, dict[str, Any]], setup_s: float, t_start: float
) -> Result:
    """The `Result` of `exp` with the methods' entries (in run order)."""
    return Result(
        config=exp.config,
        network=exp.federation.to_dict(),
        data=data_info(exp.data),
        methods=methods,
        environment=environment(),
        timings={"setup_s": setup_s, "total_s": time.perf_counter() - t_start},
    )


# --------------------------------------------------------------------------- the runner
def run(
    config: ExperimentConfig,
    *,
    progress: bool = True,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    callback: ProgressCallback | None = None,
    shards: int | None = None,
) -> Result:
    """Run every method of `config` on the same network and partition.

    Args:
      config: the experiment (validated on construction).
      progress: show a tqdm bar per method (rounds, current target accuracy); where stderr
        is not a terminal (a log file), a plain line every tenth of the rounds instead.
      checkpoint: `.npz` path written atomically after every completed round (checked
        before any work: a path that cannot be written raises `ValueError` at once).
      resume: continue from `checkpoint` if it exists (its config must equal `config`).
      callback: `callback(method, rounds_done, metrics)` after each round (after the
        checkpoint is written); `metrics` holds `target_accuracy`, `target_loss`,
        `client_accuracy [S]`. An exception from it stops the run (the checkpoint remains).
      shards: devices the slots are split over (None: all devices of the default backend; on
        a CPU call `pfedwn_jax.use_cpu_devices()` first to get one per core). Results do not
        depend on it.

    Returns:
      The `Result` (also see `docs/experiments.md`).
    """
    if not isinstance(config, ExperimentConfig):
        raise ValueError(f"config must be an ExperimentConfig; got {type(config).__name__}")
    t_start = time.perf_counter()
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    if checkpoint is not None:
        check_writable_file(checkpoint, "checkpoint")
    methods = [
        (name, get_algorithm(name), config.hparams_for(name)) for name in config.method_names
    ]
    # host-side setup and every remaining validation happen before anything compiles
    exp = setup(config, shards)
    setup_s = time.perf_counter() - t_start

    resumed = read_resume(checkpoint, config) if resume else Resume()
    done = resumed.done
    for name, alg, hp in methods:
        if name in done:
            continue
        own = name == resumed.current and resumed.entry is not None
        done[name] = run_method(
            exp,
            alg,
            hp,
            resumed.entry if own else new_entry(hp),
            leaves=resumed.leaves if own else None,
            name=name,
            progress=progress,
            after_round=checkpoint_hook(config, name, done, checkpoint, callback),
        )
    return assemble_result(exp, {name: done[name] for name, _, _ in methods}, setup_s, t_start)
