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
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.federation import Federation, build_federation
from pfedwn_jax.experiment.io import atomic_write_with
from pfedwn_jax.experiment.results import Result, to_jsonable

ProgressCallback = Callable[[str, int, dict[str, Any]], None]


# --------------------------------------------------------------------------- setup
def load_data(config: ExperimentConfig):
    """The partitioned `FederatedData` (host arrays) for `config`."""
    from pfedwn_jax.data import DEFAULT_DATASET, load_dataset, make_federated

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
    from pfedwn_jax.models import get_model

    try:
        return get_model(config.model, num_classes, tuple(int(s) for s in input_shape))
    except ValueError as e:
        raise ValueError(f"model: {config.model!r} does not fit the data: {e}") from None


def build_optimizer(config: ExperimentConfig):
    """SGD; equal settings give the same object, so compiled rounds are reused in-process."""
    return _sgd(float(config.lr), float(config.momentum))


@functools.lru_cache(maxsize=16)
def _sgd(lr: float, momentum: float):
    import optax

    return optax.sgd(lr, momentum=momentum or None)


def build_context(config: ExperimentConfig, fed: Federation, data, model, optimizer):
    """The `RoundContext` of the experiment (device arrays)."""
    from pfedwn_jax.algorithms import RoundContext

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
    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
    }


# --------------------------------------------------------------------------- one round
def _step(alg, hp, state, key, ctx, test):
    """One round plus evaluation and records: the compiled unit of the runner."""
    from pfedwn_jax.engine import constrain_slots, evaluate

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


def round_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """(init key, root of the per-round keys), identical for every method."""
    root = jax.random.PRNGKey(seed)
    return jax.random.fold_in(root, 0), jax.random.fold_in(root, 1)


# --------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: Path, progress: dict[str, Any], state: Any | None) -> None:
    """One atomic `.npz`: the progress JSON plus the current method's state leaves."""
    arrays = {"progress": np.array(json.dumps(to_jsonable(progress)))}
    if state is not None:
        for i, leaf in enumerate(jax.tree_util.tree_leaves(state)):
            arrays[f"leaf_{i:05d}"] = np.asarray(leaf)
    atomic_write_with(path, lambda f: np.savez(f, **arrays))


def load_checkpoint(path: Path) -> tuple[dict[str, Any], list[np.ndarray]]:
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


def _new_method_entry(name: str, hp: Any) -> dict[str, Any]:
    from pfedwn_jax.algorithms import hparams_dict

    return {
        "hparams": hparams_dict(hp),
        "target_accuracy": [],
        "target_loss": [],
        "client_accuracy": [],
        "client_loss": [],
        "records": {},
        "timings": {"compile_s": 0.0, "round_s": []},
    }


def _finish_entry(entry: dict[str, Any]) -> None:
    acc = np.array(entry["target_accuracy"], dtype=float)
    entry["max_target_accuracy"] = float(np.nanmax(acc)) if np.isfinite(acc).any() else None
    entry["final_target_accuracy"] = float(acc[-1]) if len(acc) else None
    entry["timings"]["total_s"] = float(
        entry["timings"]["compile_s"] + sum(entry["timings"]["round_s"])
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
      progress: show a tqdm bar per method (rounds, current target accuracy).
      checkpoint: `.npz` path written atomically after every completed round.
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
    from pfedwn_jax.algorithms import get_algorithm
    from pfedwn_jax.engine import put_slots, replicate, resolve_shards

    if not isinstance(config, ExperimentConfig):
        raise ValueError(f"config must be an ExperimentConfig; got {type(config).__name__}")
    t_start = time.perf_counter()
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    methods = [
        (name, get_algorithm(name), config.hparams_for(name)) for name in config.method_names
    ]

    # host-side setup and every remaining validation happen before anything compiles
    data = load_data(config)
    model = build_model(config, data.num_classes, data.train.x.shape[2:])
    fed = build_federation(config)
    ctx = build_context(config, fed, data, model, build_optimizer(config))
    test = jax.tree_util.tree_map(jnp.asarray, data.test)
    # Several devices (CPU cores via `use_cpu_devices`, GPUs): slots split, the rest replicated.
    ctx = ctx.replace(shards=resolve_shards(shards, ctx.num_slots))
    ctx, test = replicate((ctx, test), ctx.num_slots, ctx.shards)
    setup_s = time.perf_counter() - t_start

    done: dict[str, dict[str, Any]] = {}
    current_entry: dict[str, Any] | None = None
    current_leaves: list[np.ndarray] | None = None
    current_name: str | None = None
    if resume and checkpoint is not None and checkpoint.exists():
        saved, leaves = load_checkpoint(checkpoint)
        if saved.get("config") != to_jsonable(config.to_dict()):
            raise ValueError(f"resume: checkpoint {checkpoint} was written for a different config")
        done = saved["methods"]
        current_name = saved.get("current")
        if current_name is not None:
            current_entry = saved["current_entry"]
            current_leaves = leaves

    network = fed.to_dict()
    data_info = {
        "name": data.name,
        "num_classes": int(data.num_classes),
        "input_shape": [int(s) for s in data.train.x.shape[2:]],
        "train_counts": np.asarray(data.train.count).tolist(),
        "test_counts": np.asarray(data.test.count).tolist(),
    }
    init_key, round_root = round_keys(config.seed)
    is_target = np.asarray(fed.is_target)

    def write_checkpoint(name: str | None, entry: dict | None, state: Any | None) -> None:
        if checkpoint is None:
            return
        save_checkpoint(
            checkpoint,
            {"config": config.to_dict(), "methods": done, "current": name, "current_entry": entry},
            state,
        )

    for name, alg, hp in methods:
        if name in done:
            continue
        step = jitted_step(alg, hp)
        state = alg.init(init_key, ctx, hp)
        entry = _new_method_entry(name, hp)
        start = 0
        if name == current_name and current_entry is not None:
            state = restore_state(state, current_leaves)
            entry = current_entry
            start = len(entry["target_accuracy"])
        state = put_slots(state, ctx.num_slots, ctx.shards)
        t0 = time.perf_counter()
        compiled = step.lower(state, round_root, ctx, test).compile()
        entry["timings"]["compile_s"] += time.perf_counter() - t0

        bar = _progress_bar(name, config.rounds, start, progress)
        try:
            for r in range(start, config.rounds):
                t0 = time.perf_counter()
                state, metrics, records = compiled(
                    state, jax.random.fold_in(round_root, r), ctx, test
                )
                acc = np.asarray(metrics["accuracy"], np.float64)
                loss = np.asarray(metrics["loss"], np.float64)
                records = {k: np.asarray(v) for k, v in records.items()}
                entry["timings"]["round_s"].append(time.perf_counter() - t0)
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
                if r + 1 < config.rounds:
                    write_checkpoint(name, entry, state)
                else:
                    _finish_entry(entry)
                    done[name] = entry
                    write_checkpoint(None, None, None)
                bar.update(1)
                bar.set_postfix(target_acc=f"{row['target_accuracy']:.3f}")
                if callback is not None:
                    callback(name, r + 1, row)
        finally:
            bar.close()
        if name not in done:  # rounds was already complete in the checkpoint
            _finish_entry(entry)
            done[name] = entry

    return Result(
        config=config,
        network=network,
        data=data_info,
        methods={name: done[name] for name, _, _ in methods},
        environment=environment(),
        timings={"setup_s": setup_s, "total_s": time.perf_counter() - t_start},
    )


def _progress_bar(name: str, total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=f"{name:>9}",
        unit="round",
        disable=not enabled,
        leave=True,
        dynamic_ncols=True,
    )
