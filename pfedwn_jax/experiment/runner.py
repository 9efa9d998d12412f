"""`run(config) -> Result`: every configured method on the same network and partition.

Per method, one compiled program does a whole round (the algorithm's local training and
aggregation) plus the evaluation of every slot's personalised model on its test split and
the algorithm's per-round records. Randomness: the initial model comes from
`fold_in(PRNGKey(seed), 0)` and round `r`'s key is `fold_in(fold_in(PRNGKey(seed), 1), r)`,
the same for every method, so methods start from the same model and see the same batch
orders, and a resumed run repeats an uninterrupted one exactly.

Checkpoints (`checkpoint.py`): with `checkpoint=DIR`, every `checkpoint_every` rounds the
new rounds' metrics are appended and the current method's full state is saved as an orbax
step, each process writing its shards (asynchronously, constant cost per save);
`resume=True` continues from it (the config must be the same).
Divergence (`divergence.py`): a round flags slots whose model or loss blew up; by default the
method stops there (entry marked `diverged`) and the next one runs.

The steps of `run`, each usable on its own:

1. `setup(config, shards) -> Experiment`: data, model, federation, `RoundContext`, placement.
2. `read_resume(checkpoint, config) -> Resume`: what a checkpoint says is already done.
3. `run_method(exp, alg, hp, entry, ...)`: one method's rounds; each round is `_step`
   (compiled once per method by `compile_round`), its host-side results go into the method's
   `entry` dict (`fetch_round`, `results.round_row`, `append_round`), divergence is checked
   (`divergence.note_divergence`) and `after_round` checkpoints.
4. `assemble_result(exp, methods, ...) -> Result`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from pfedwn_jax import state_store
from pfedwn_jax._checks import check_int
from pfedwn_jax.algorithms import (
    Algorithm,
    RoundContext,
    bind_hparams,
    get_algorithm,
    hparam_values,
    neighbor_lists,
    static_hparams,
)
from pfedwn_jax.data import DEFAULT_DATASET, ClientData, FederatedData, load_dataset, make_federated
from pfedwn_jax.data.federate import class_options
from pfedwn_jax.distributed import gather_to_host
from pfedwn_jax.engine import constrain_slots, evaluate, put_slots, replicate, resolve_shards
from pfedwn_jax.experiment import checkpoint as ckpt
from pfedwn_jax.experiment.checkpoint import Resume, read_resume, run_progress
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.divergence import TRAIN_LOSS, check_policy, note_divergence, slot_finite
from pfedwn_jax.experiment.federation import Federation, build_federation
from pfedwn_jax.experiment.links import (
    LinkTrack,
    begin_round,
    build_links,
    end_round,
    init_track,
    mobile_federation,
    mobility_summary,
    needs_track,
)
from pfedwn_jax.experiment.results import Result, append_round, finish_entry, new_entry, round_row
from pfedwn_jax.io import check_writable_dir
from pfedwn_jax.models import get_model
from pfedwn_jax.provenance import provenance

ProgressCallback = Callable[[str, int, dict[str, Any]], None]
# after_round(rounds_done, entry, state, row, finished): `run_method` calls it after every round
RoundHook = Callable[[int, dict[str, Any], Any, dict[str, Any], bool], None]


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
            min_samples=config.min_samples,
            pool=config.pool,
            val_fraction=config.val_fraction,
            **class_options(config.partition, config.classes_per_client),
            max_samples_per_client=config.max_samples_per_client,
        )
    except ValueError as e:
        raise ValueError(f"partition: {e}") from None


def build_model(
    config: ExperimentConfig, num_classes: int, input_shape: tuple[int, ...], input_dtype="uint8"
):
    """The engine `Model`; a model that does not fit the data fails naming `model`."""
    try:
        shape = tuple(int(s) for s in input_shape)
        return get_model(config.model, num_classes, shape, input_dtype=input_dtype)
    except ValueError as e:
        raise ValueError(f"model: {config.model!r} does not fit the data: {e}") from None


def build_context(
    config: ExperimentConfig, fed: Federation, data: FederatedData, model: Any
) -> RoundContext:
    """The `RoundContext` of the experiment (device arrays, not yet placed).

    SGD's learning rate and momentum are leaves of the context (`RoundContext.tx`), so runs
    that differ only in them share one compiled round; momentum 0 is plain SGD (no trace).
    Who receives whom goes in as neighbor lists `[S, K]` (`neighbor_lists` of the federation's
    adjacency); the dense `ctx.adjacency` is left unset (no algorithm reads it).
    """
    if fed.neighbor_lists is not None:  # a large network hands over its lists
        neighbors, neighbor_mask = fed.neighbor_lists, fed.neighbor_mask
    else:
        neighbors, neighbor_mask = neighbor_lists(fed.adjacency)
    train = jax.tree_util.tree_map(jnp.asarray, data.train)
    data_client = jnp.asarray(fed.data_client, jnp.int32)
    num_samples = jnp.asarray(np.asarray(data.train.count)[fed.data_client], jnp.float32)
    return RoundContext(
        model=model,
        optimizer=None,
        train=train,
        data_client=data_client,
        neighbors=jnp.asarray(neighbors, jnp.int32),
        neighbor_mask=jnp.asarray(neighbor_mask, bool),
        is_target=jnp.asarray(fed.is_target, bool),
        num_samples=num_samples,
        batch_size=config.batch_size,
        local_epochs=config.local_epochs,
        num_steps=config.local_steps,
        lr=jnp.float32(config.lr),
        momentum=jnp.float32(config.momentum) if config.momentum else None,
        links=build_links(fed, config),
    )


def environment() -> dict[str, Any]:
    """The `environment` entry of the results: jax version, backend, devices, `provenance`."""
    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "provenance": provenance(),
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
      val: `[N, ...]` validation splits (carved from the training data; `config.val_fraction`)
        or None (device, replicated).
    """

    config: ExperimentConfig
    data: FederatedData
    federation: Federation
    ctx: RoundContext
    test: ClientData
    init_key: jax.Array
    round_root: jax.Array
    val: ClientData | None = None

    def round_key(self, r: int) -> jax.Array:
        """Round `r`'s key, the same for every method."""
        return jax.random.fold_in(self.round_root, r)


def setup(config: ExperimentConfig, shards: int | None = None) -> Experiment:
    """Load data, build model and federation, place everything (nothing is compiled).

    Every check that needs the data (does the model fit?) fails here with a `ValueError`.
    """
    data = load_data(config)
    model = build_model(config, data.num_classes, data.train.x.shape[2:], data.train.x.dtype)
    fed = mobile_federation(build_federation(config), config)
    ctx = build_context(config, fed, data, model)
    test, val = jax.tree_util.tree_map(jnp.asarray, (data.test, data.val))
    # Several devices (CPU cores via `use_cpu_devices`, GPUs): slots split, the rest replicated.
    ctx = ctx.replace(shards=resolve_shards(shards, ctx.num_slots))
    placed = replicate((ctx, test, val, *round_keys(config.seed)), ctx.num_slots, ctx.shards)
    ctx, test, val, init_key, round_root = placed
    return Experiment(config, data, fed, ctx, test, init_key, round_root, val)


# --------------------------------------------------------------------------- one round
class Tracked(NamedTuple):
    """A method's state with per-link state (`stale` or `mobility`, `experiment.links`):
    `alg` the algorithm's own state, `links` the `LinkTrack`."""

    alg: Any
    links: LinkTrack


def _step(alg, hp, state, key, ctx, test, hvalues, val=None):
    """One round plus evaluation and records: the compiled unit of the runner.

    `hp` is static (`static_hparams`), `hvalues` its dynamic (float) fields as arrays
    (`hparam_values`), bound inside so one compiled round serves every value. `metrics`
    holds the evaluation's `loss [S]`, `accuracy [S]` and `finite [S]`
    (`divergence.slot_finite` of the evaluated models, test and training losses). With a
    validation split `val`, the records add `val_acc [S]` and `target_val_acc` (`val_records`).
    With `stale` or `mobility` the state is `Tracked` (`init_state` builds it).
    """
    hp = bind_hparams(hp, hvalues)
    algstate, track = _split(state, ctx)
    ctx, link_records = _draw_links(ctx, key, track)
    algstate = alg.round(algstate, key, ctx, hp)
    if track is not None:
        track, more = end_round(ctx, track, link_records.pop("_drawn"), key)
        link_records.update(more)
        state = constrain_slots(Tracked(algstate, track), ctx.num_slots, ctx.shards)
        algstate = state.alg
    else:
        state = algstate = constrain_slots(algstate, ctx.num_slots, ctx.shards)
    params = alg.eval_params(algstate, ctx, hp)
    metrics = evaluate(ctx.model, params, test, ctx.data_client)
    records = alg.records(algstate, ctx, hp) if alg.records is not None else {}
    records = {**records, **link_records, **val_records(ctx, params, val)}
    losses = [metrics["loss"]]
    if TRAIN_LOSS in records and records[TRAIN_LOSS].shape == (ctx.num_slots,):
        losses.append(records[TRAIN_LOSS])
    return state, {**metrics, "finite": slot_finite(params, losses)}, records


def val_records(ctx: RoundContext, params: Any, val: ClientData | None) -> dict[str, jax.Array]:
    """The evaluated models on the validation split: `val_acc [S]` and `target_val_acc` (mean
    over the target slots, as `target_accuracy` for the test split); `{}` without `val`."""
    if val is None:
        return {}
    acc = evaluate(ctx.model, params, val, ctx.data_client)["accuracy"]
    target = ctx.is_target.astype(acc.dtype)
    return {"val_acc": acc, "target_val_acc": (acc * target).sum() / jnp.maximum(target.sum(), 1)}


def _split(state: Any, ctx: RoundContext) -> tuple[Any, LinkTrack | None]:
    """(the algorithm's state, the `LinkTrack` or None); a ValueError where the links need a
    track the state lacks (a sweep: `stale` and `mobility` run in `run()` only)."""
    if not needs_track(ctx.links):
        return state, None
    if not isinstance(state, Tracked):
        raise ValueError(
            "stale=True and mobility need the runner's per-link state (runner.init_state); "
            "sweeps do not support them: use pfedwn_jax.run per setting"
        )
    return state.alg, state.links


def jitted_step(alg, hp):
    """The jitted round of `alg` for hyperparameters like `hp`: call it as
    `(state, key, ctx, test, hparam_values(hp), val)` (`val` optional; cached: one compile per
    process for equal algorithm, static hyperparameters, context structure and shapes)."""
    return _jitted_step(alg, static_hparams(hp))


def _draw_links(
    ctx: RoundContext, key: jax.Array, track: LinkTrack | None = None
) -> tuple[RoundContext, dict]:
    """This round's link outcomes (`experiment.links.begin_round`): `ctx` with
    `neighbor_mask` restricted to the models the algorithm may combine, and the records
    `link_received [S, K]`, `link_failure_rate` (with mobility also `positions [S, 2]`,
    `neighbors`/`neighbor_mask [S, K]`, `reselected`; with a track, `_drawn` for `end_round`)."""
    if ctx.links is None:
        return ctx, {}
    ctx, records, drawn = begin_round(ctx, track, key)
    if track is not None:
        records["_drawn"] = drawn
    return ctx, records


@functools.lru_cache(maxsize=32)
def _jitted_step(alg, static_hp):
    return jax.jit(functools.partial(_step, alg, static_hp), donate_argnums=0)


def init_state(
    exp: Experiment, alg: Algorithm, hp: Any, restore: Callable[[Any], Any] | None = None
) -> Any:
    """The method's initial state with its slots placed, or `restore(that state)`: a
    checkpoint's state read onto its structure and shardings (`Resume.restore`)."""
    state = alg.init(exp.init_key, exp.ctx, hp)
    if needs_track(exp.ctx.links):
        params = jax.eval_shape(lambda s: alg.eval_params(s, exp.ctx, hp), state)  # [S, ...]
        state = Tracked(state, init_track(exp.init_key, exp.ctx, params))
    state = put_slots(state, exp.ctx.num_slots, exp.ctx.shards)
    return state if restore is None else restore(state)


def compile_round(exp: Experiment, alg: Algorithm, hp: Any, state: Any) -> tuple[Any, float]:
    """`(compiled round, seconds)`: `compiled(state, key, exp.ctx, exp.test, hparam_values(hp),
    exp.val)` runs `_step`."""
    t0 = time.perf_counter()
    args = (state, exp.round_root, exp.ctx, exp.test, hparam_values(hp), exp.val)
    compiled = jitted_step(alg, hp).lower(*args).compile()
    return compiled, time.perf_counter() - t0


class Fetched(NamedTuple):
    """One round's results on the host: `accuracy [S]`, `loss [S]` (float64), `finite [S]`
    (bool) and the records."""

    accuracy: np.ndarray
    loss: np.ndarray
    finite: np.ndarray
    records: dict[str, np.ndarray]


def fetch_round(metrics: dict[str, jax.Array], records: dict[str, jax.Array]) -> Fetched:
    """Device to host, the round's one synchronisation (waits for the round). Slots split
    over several processes are all-gathered (`gather_to_host`: every process calls it)."""
    acc, loss, finite, records = gather_to_host(
        (metrics["accuracy"], metrics["loss"], metrics["finite"], records)
    )
    return Fetched(
        np.asarray(acc, np.float64), np.asarray(loss, np.float64), np.asarray(finite, bool), records
    )


# --------------------------------------------------------------------------- one method
def run_method(
    exp: Experiment,
    alg: Algorithm,
    hp: Any,
    entry: dict[str, Any],
    *,
    restore: Callable[[Any], Any] | None = None,
    name: str = "",
    progress: bool = False,
    after_round: RoundHook | None = None,
    on_divergence: str = "stop",
) -> dict[str, Any]:
    """Rounds `len(entry["target_accuracy"])` .. `rounds - 1` of one method; returns `entry`.

    `entry` (a `new_entry` or a checkpoint's, updated in place) and `restore` (reads the state
    after its last round, `init_state`) say where the method starts. After each round, with the
    round's results in `entry`, `after_round(rounds_done, entry, state, row, finished)` runs;
    `finished` after the last round, or the first diverged one with `on_divergence="stop"`
    (see `divergence.note_divergence`; `"continue"` only records it).
    """
    check_policy(on_divergence)
    if entry.get("diverged") is not None and on_divergence == "stop":
        finish_entry(entry)  # stopped there before a resume
        return entry
    state = init_state(exp, alg, hp, restore)
    compiled, compile_s = compile_round(exp, alg, hp, state)
    entry["timings"]["compile_s"] += compile_s
    rounds, start = exp.config.rounds, len(entry["target_accuracy"])
    if 0 < start < rounds:  # times from here on add to those of the interrupted process
        entry["timings"].setdefault("resumed_at", []).append(start)
    is_target = np.asarray(exp.federation.is_target)
    hvalues = hparam_values(hp)
    bar = _progress_bar(name, rounds, start, progress)
    try:
        for r in range(start, rounds):
            t0 = time.perf_counter()
            state, metrics, records = compiled(
                state, exp.round_key(r), exp.ctx, exp.test, hvalues, exp.val
            )
            out = fetch_round(metrics, records)
            row = round_row(
                r + 1, out.accuracy, out.loss, out.records, is_target, time.perf_counter() - t0
            )
            append_round(entry, row)
            new = note_divergence(entry, name, r + 1, out.finite, exp.federation.data_client)
            finished = r + 1 == rounds or (new and on_divergence == "stop")
            if finished:
                finish_entry(entry)
            bar.update(1)
            bar.set_postfix(target_acc=f"{row['target_accuracy']:.3f}")
            if after_round is not None:
                after_round(r + 1, entry, state, row, finished)
            if finished:
                break
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
    every: int = 1,
    writer: state_store.Writer | None = None,
) -> RoundHook:
    """`after_round` of method `name` in `run`: save the checkpoint, then call `callback`.

    Saves every `every` rounds and when the method finishes: the rounds' metrics since the
    last save plus, before the method finishes, its state (after, `done` plus the method);
    through `writer` (`checkpoint.writer`) asynchronously, else before `callback` runs.
    """
    pending: list[dict[str, Any]] = []

    def after_round(
        rounds_done: int, entry: dict, state: Any, row: dict[str, Any], finished: bool
    ) -> None:
        if checkpoint is not None:
            pending.append({"method": name, **row})
            if finished:
                progress = run_progress(config, {**done, name: entry})
                ckpt.save(checkpoint, progress, None, pending, writer)
                pending.clear()
            elif rounds_done % every == 0:
                progress = run_progress(config, done, name, entry)
                ckpt.save(checkpoint, progress, state, pending, writer)
                pending.clear()
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
        **({} if data.val is None else {"val_counts": np.asarray(data.val.count).tolist()}),
    }


def assemble_result(
    exp: Experiment, methods: dict[str, dict[str, Any]], setup_s: float, t_start: float
) -> Result:
    """The `Result` of `exp` with the methods' entries (in run order).

    `network` is the federation's description plus the neighbor lists of the slots,
    `slot_neighbors [S][K]` and `slot_neighbor_mask [S][K]`: the columns of `[S, K]` records
    such as pFedWN's `pi` (column k of row s is slot `slot_neighbors[s][k]`, data client
    `slot_client[slot_neighbors[s][k]]`; column 0 is the slot itself).
    """
    neighbors, mask = gather_to_host((exp.ctx.neighbors, exp.ctx.neighbor_mask))
    network = {
        **exp.federation.to_dict(),
        "slot_neighbors": neighbors.tolist(),
        "slot_neighbor_mask": mask.tolist(),
    }
    if exp.config.mobility != "none":  # positions and lists per re-selection
        network["mobility"] = mobility_summary(methods)
    return Result(
        config=exp.config,
        network=network,
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
    checkpoint_every: int = 1,
    on_divergence: str = "stop",
) -> Result:
    """Run every method of `config` on the same network and partition.

    Args:
      config: the experiment (validated on construction).
      progress: show a tqdm bar per method (rounds, current target accuracy); where stderr
        is not a terminal (a log file), a plain line every tenth of the rounds instead.
      checkpoint: a checkpoint directory (`pfedwn_jax.experiment.checkpoint`), saved every
        `checkpoint_every` rounds and when a method ends; None: no checkpoints. Without
        `resume`, a checkpoint already there is deleted first. Checked before any work: a
        path that cannot be written raises `ValueError` at once.
      resume: continue from `checkpoint` if it exists (its config must equal `config`).
      callback: `callback(method, rounds_done, metrics)` after each round (after the
        checkpoint is written); `metrics` holds `target_accuracy`, `target_loss`,
        `client_accuracy [S]`. An exception from it stops the run (the checkpoint remains).
      shards: devices the slots are split over (None: all devices of the default backend; on
        a CPU call `pfedwn_jax.use_cpu_devices()` first to get one per core). Results do not
        depend on it.
      checkpoint_every: rounds between saves (>= 1).
      on_divergence: `"stop"` a method at its first diverged round (`divergence`; the entry
        keeps the rounds so far and says `diverged`) and go on with the next; `"continue"`
        records the divergence and runs every round.

    Returns:
      The `Result` (also see `docs/experiments.md`).
    """
    if not isinstance(config, ExperimentConfig):
        raise ValueError(f"config must be an ExperimentConfig; got {type(config).__name__}")
    check_policy(on_divergence)
    check_int("checkpoint_every", checkpoint_every, 1)
    t_start = time.perf_counter()
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    if checkpoint is not None:
        check_writable_dir(checkpoint, "checkpoint")
    methods = [
        (name, get_algorithm(name), config.hparams_for(name)) for name in config.method_names
    ]
    # host-side setup and every remaining validation happen before anything compiles
    exp = setup(config, shards)
    setup_s = time.perf_counter() - t_start

    resumed = read_resume(checkpoint, config) if resume else Resume()
    if checkpoint is not None and not resume:
        ckpt.remove(checkpoint)
    done = resumed.done
    # saves overlap the next rounds; leaving the block (also on an error) waits for the last
    with ckpt.writer(checkpoint) if checkpoint is not None else contextlib.nullcontext() as w:
        for name, alg, hp in methods:
            if name in done:
                continue
            own = name == resumed.current and resumed.entry is not None
            hook = checkpoint_hook(config, name, done, checkpoint, callback, checkpoint_every, w)
            done[name] = run_method(
                exp,
                alg,
                hp,
                resumed.entry if own else new_entry(hp, config.record_every, config.rounds),
                restore=resumed.restore if own else None,
                name=name,
                progress=progress,
                after_round=hook,
                on_divergence=on_divergence,
            )
    return assemble_result(exp, {name: done[name] for name, _, _ in methods}, setup_s, t_start)
