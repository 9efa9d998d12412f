"""The memory plan of a sweep: device bytes of one run, and how many runs fit in one program.

`estimate(ctx, test, alg, hp)` counts, without allocating or compiling anything, the device
bytes of one run of one method (one compiled round, `runner.step.round_step`):

- state (exact, from `jax.eval_shape` of `alg.init`): the slots' parameters, their optimizer
  state and the algorithm's own state (pFedWN's `pi`, `pi_trace`, EM pairs, ...);
- data (exact, from the array shapes): the training and test splits and the context's arrays,
  counted once per program when the runs share the partition (`shared_data=True`), else per
  run;
- the round's temporaries, phase by phase (local training, evaluation, pFedWN's EM,
  Per-FedAvg's adaptation): the model copies of the phase holding the most (`algorithm`: the
  aggregated models, FedProx's anchor, FedAMP's cloud models, pFedWN's EM components, ...)
  plus the activations of every phase (`activations`: `chunk` slots trained at once, each
  `batch x` the model's training bytes per sample; the evaluation's chunk of samples; ...).
  Activations add up because XLA does not always reuse one loop's buffers in the next.

The model's bytes per sample (`runner.sample_bytes`) come from a liveness pass over the
jaxpr of one training step (forward and backward) and of the forward pass, traced at batch
2 and 4: the peak of the live values that grow with the batch. XLA fuses and reuses
buffers, so the estimate is an approximation: 0.9-1.35x of XLA's own numbers for the
configurations in `docs/memory.md` (up to 2.2x for a tiny LogReg one, whose float
conversion XLA fuses away).

`plan(num_runs, est, devices=...)` then picks the runs per compiled program that fit
`fraction` of each device's free memory (`available_bytes`), or raises a `ValueError` that
says what one run needs, what is available, and what to reduce.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from pfedwn_jax._checks import check_float, check_int, is_concrete
from pfedwn_jax.algorithms import Algorithm, RoundContext, get_algorithm, make_hparams
from pfedwn_jax.algorithms.phases import Phase, Sizes, baseline, chunk_of
from pfedwn_jax.data import ClientData
from pfedwn_jax.data.batching import steps_per_epoch
from pfedwn_jax.devices import available_bytes  # the free memory of a device (re-exported)
from pfedwn_jax.engine import ClientState
from pfedwn_jax.engine.tree import block_size
from pfedwn_jax.io import format_bytes  # re-exported
from pfedwn_jax.runner.sample_bytes import sample_bytes  # re-exported
from pfedwn_jax.wireless.sparse_perr import CHUNK_ELEMENTS as PERR_CHUNK_ELEMENTS

#: What a backend holds beside a program's buffers, per platform. XLA:CPU: the resident
#: memory a one-round run adds beyond XLA's `memory_analysis` (compiler, thread pools, the
#: runtime's heap), measured 95-220 MiB for logreg and MLP programs of 10 and 100 nodes; an
#: accelerator compiles in host memory, so its device budget does not hold this.
RUNTIME_BYTES = {"cpu": 96 * 2**20}


# --------------------------------------------------------------------------- the estimate
@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Device bytes of one run of one method (see the module docstring).

    Attributes:
      params: the slots' parameters `[S, ...]`.
      optimizer: the slots' optimizer state.
      algorithm: the algorithm's own state plus the model copies of the round phase
        holding the most.
      data: the run's own data (0 when the runs of a program share it: see `shared`).
      activations: the round phases' other temporaries (training / evaluation chunks).
      shared: bytes held once per program whatever the number of runs (shared data).
      runtime: bytes the backend needs beside the program's buffers, once per program
        (`RUNTIME_BYTES`: on a CPU the compiler's and runtime's own heap share the budget).
      slots: `S`, model slots of the run.
      chunk: slots trained at once.
      phase: the round phase with the largest temporaries (copies and activations).
      method: the algorithm's name.
    """

    params: int
    optimizer: int
    algorithm: int
    data: int
    activations: int
    shared: int
    runtime: int = 0
    slots: int = 0
    chunk: int = 1
    phase: str = ""
    method: str = ""

    @property
    def per_run(self) -> int:
        """Bytes that grow with each run in a program (everything but `shared`)."""
        return self.params + self.optimizer + self.algorithm + self.data + self.activations

    def total(self, runs: int = 1) -> int:
        """Bytes of a program holding `runs` runs: `shared + runtime + runs * per_run`."""
        return self.shared + self.runtime + check_int("runs", runs, 0) * self.per_run

    def largest(self) -> str:
        """The name of the largest per-run part (`"params"`, ..., `"activations"`)."""
        parts = {name: getattr(self, name) for name in _PARTS}
        return max(parts, key=parts.__getitem__)

    def describe(self) -> str:
        """A readable breakdown, one part per line."""
        head = f"memory of one run of {self.method or 'a method'}"
        lines = [f"{head} ({self.slots} slots, {self.chunk} trained at once):"]
        for name, what in _PARTS.items():
            lines.append(f"  {name:<12}{format_bytes(getattr(self, name)):>11}  {what}")
        lines.append(f"  {'per run':<12}{format_bytes(self.per_run):>11}")
        lines.append(f"  {'shared':<12}{format_bytes(self.shared):>11}  once per program")
        if self.runtime:
            lines.append(f"  {'runtime':<12}{format_bytes(self.runtime):>11}  the backend's own")
        if self.phase:
            lines.append(f"  largest temporaries in: {self.phase}")
        return "\n".join(lines)


_PARTS = {
    "params": "slot parameters",
    "optimizer": "optimizer state",
    "algorithm": "algorithm state and model copies",
    "data": "data of this run",
    "activations": "training/evaluation temporaries",
}


def tree_bytes(tree: Any) -> int:
    """Bytes of every array leaf of `tree` (arrays or `jax.ShapeDtypeStruct`s)."""
    return sum(_leaf_bytes(leaf) for leaf in jax.tree.leaves(tree))


def _leaf_bytes(leaf: Any) -> int:
    shape, dtype = np.shape(leaf), getattr(leaf, "dtype", None)
    if dtype is None:
        dtype = np.asarray(leaf).dtype
    return math.prod(shape) * np.dtype(dtype).itemsize


# --------------------------------------------------------------------------- round phases
def _motion(ctx: RoundContext) -> list[Phase]:
    """Mobility over candidate lists (`links.SparseMotion`): the grid queries' gathered cells
    (index, mask, distance, offsets: about 17 bytes an entry) and one chunk of the P_err map
    (16 bytes an element, `wireless.sparse_perr`). Dense mobility is not counted."""
    links = getattr(ctx, "links", None)
    sparse = getattr(getattr(links, "motion", None), "sparse", None)
    if sparse is None:
        return []
    cells = lambda g, rings: (2 * min(rings, g.cells - 1) + 1) ** 2 * g.capacity
    entries = cells(sparse.near, 2)
    if sparse.far is not None:
        entries += cells(sparse.far, math.ceil(sparse.cutoff / sparse.far.side - 1e-9))
    return [Phase("mobility", 0, 17 * ctx.num_slots * entries + 16 * PERR_CHUNK_ELEMENTS)]


def _round_metrics(sz: Sizes) -> list[Phase]:
    """The per-slot metrics of every round (`results.metrics.SLOT_METRICS`): the consensus
    deviation holds a block of `C` columns of the models, its component means and their
    difference, `[S, C]` float32 each (`engine.gossip._column_sums`: all the columns in a
    small network, about `BLOCK_ELEMENTS / S` in a large one; XLA's temporaries, tested)."""
    columns = sz.param // 4
    block = 3 * 4 * sz.slots * block_size(columns, sz.slots)
    return [Phase("round metrics", 0, block + 4 * 4 * sz.slots)]  # and [S] sums and labels


# --------------------------------------------------------------------------- estimate
def _concrete(x: Any) -> bool:
    """`x` holds values (an array), not only a shape (`ShapeDtypeStruct`, tracer)."""
    return not isinstance(x, jax.ShapeDtypeStruct) and is_concrete(x)


def _abstract_state(alg: Algorithm, hp: Any, ctx: RoundContext) -> Any:
    """`alg.init`'s state as `ShapeDtypeStruct`s. A context of concrete arrays is closed over
    (so pFedWN lists only the real EM pairs); an abstract one is traced."""
    key = jax.random.key(0)
    if all(_concrete(leaf) for leaf in jax.tree.leaves(ctx)):
        return jax.eval_shape(lambda k: alg.init(k, ctx, hp), key)
    return jax.eval_shape(lambda k, c: alg.init(k, c, hp), key, ctx)


def _epoch_steps(ctx: RoundContext) -> int:
    """Steps of one local epoch of the busiest slot (padded length when counts are abstract)."""
    count, dc = ctx.train.count, ctx.data_client
    if _concrete(count) and _concrete(dc):
        busiest = int(np.asarray(count)[np.asarray(dc)].max(initial=0))
    else:
        busiest = int(ctx.train.y.shape[1])
    return steps_per_epoch(busiest, ctx.batch_size)


def _sizes(ctx: RoundContext, test: ClientData, state: Any, chunk: int | None) -> Sizes:
    model = ctx.model
    params = jax.eval_shape(model.init, jax.random.key(0))
    train_sample, eval_sample = sample_bytes(model)
    epoch = _epoch_steps(ctx)
    del state
    return Sizes(
        slots=ctx.num_slots,
        pairs=ctx.num_slots * (int(ctx.neighbors.shape[1]) - 1),  # pFedWN: every list entry
        param=tree_bytes(params),
        opt=tree_bytes(jax.eval_shape(lambda c, p: c.tx.init(p), ctx, params)),
        batch=ctx.batch_size,
        epoch_steps=epoch,
        steps=ctx.num_steps or epoch * ctx.local_epochs,
        m_train=int(ctx.train.y.shape[1]),
        m_test=int(test.y.shape[1]),
        chunk=chunk,
        train_sample=train_sample,
        eval_sample=eval_sample,
    )


def phases(
    ctx: RoundContext, test: ClientData, alg: str | Algorithm, hp: Any = None, *, chunk=None
) -> list[Phase]:
    """The round phases `estimate` weighs, in order: `(name, copies, activations)` each."""
    alg = get_algorithm(alg) if isinstance(alg, str) else alg
    hp = make_hparams(alg) if hp is None else hp
    sz = _sizes(ctx, test, _abstract_state(alg, hp, ctx), chunk)
    return (alg.memory_phases or baseline)(sz, hp) + _motion(ctx)


def _state_bytes(state: Any, sz: Any) -> tuple[int, int, int]:
    """`(params, optimizer, rest)` bytes of a run's state: its models, their optimizer state
    and what the algorithm keeps besides."""
    clients = getattr(state, "clients", None)
    if isinstance(clients, ClientState):
        params, optimizer = tree_bytes(clients.params), tree_bytes(clients.opt_state)
    else:  # an algorithm keeping its models some other way: S models with optimizer state
        params, optimizer = sz.slots * sz.param, sz.slots * sz.opt
    return params, optimizer, max(0, tree_bytes(state) - params - optimizer)


def estimate(
    ctx: RoundContext,
    test: ClientData,
    alg: str | Algorithm,
    hp: Any = None,
    *,
    chunk: int | None = None,
    shared_data: bool = True,
    backend: str | None = None,
) -> MemoryEstimate:
    """Device bytes of one run of `alg` (one compiled round of the runner), without allocating.

    Args:
      ctx: the experiment's `RoundContext` (`Experiment.ctx`); its arrays may also be
        `jax.ShapeDtypeStruct`s (then pFedWN counts every slot pair as an EM pair).
      test: the test split `[N, n_test, ...]` (`Experiment.test`; arrays or shapes).
      alg: an algorithm or its registered name.
      hp: its hyperparameters (None: the defaults).
      chunk: slots trained at once (None: the engine's choice, `engine.resolve_strategy`
        with "auto": 1 on a CPU, 256 elsewhere, at most S).
      shared_data: the runs of a program share the data (same partition): count it in
        `shared`; False (e.g. one data seed per run): in every run's `data`.
      backend: the platform the run is for ("cpu", "gpu", ...; None: JAX's default), which
        sets `runtime` (`RUNTIME_BYTES`).

    Returns:
      The `MemoryEstimate`; its `phase` names the round phase with the largest temporaries.
    """
    if not isinstance(ctx, RoundContext):
        raise ValueError(f"ctx must be a RoundContext; got {type(ctx).__name__}")
    if not isinstance(test, ClientData):
        raise ValueError(f"test must be a ClientData; got {type(test).__name__}")
    if chunk is not None:
        chunk = check_int("chunk", chunk, 1)
    alg = get_algorithm(alg) if isinstance(alg, str) else alg
    hp = make_hparams(alg) if hp is None else hp
    state = _abstract_state(alg, hp, ctx)
    sz = _sizes(ctx, test, state, chunk)
    params, optimizer, own_state = _state_bytes(state, sz)
    phases = (alg.memory_phases or baseline)(sz, hp) + _motion(ctx) + _round_metrics(sz)
    # copies and activations: those of the phase holding the most; the phases run one
    # after another and XLA reuses one loop's buffers in the next (the CNN's EM and
    # evaluation, 4.1 and 2.8 GiB by the plan, took 4.0 GiB of temporaries together)
    peak = max(phases, key=lambda ph: ph.copies + ph.activations)
    data = tree_bytes(ctx) + tree_bytes(test)
    return MemoryEstimate(
        params=params,
        optimizer=optimizer,
        algorithm=own_state + max(ph.copies for ph in phases),
        data=0 if shared_data else data,
        activations=max(ph.activations for ph in phases),
        shared=data if shared_data else 0,
        runtime=RUNTIME_BYTES.get(backend or jax.default_backend(), 0),
        slots=sz.slots,
        chunk=chunk_of(chunk, sz.slots),
        phase=peak.name,
        method=alg.name,
    )


# --------------------------------------------------------------------------- the plan
def plan(
    num_runs: int,
    est: MemoryEstimate,
    *,
    devices: int = 1,
    budget: int | None = None,
    fraction: float = 0.8,
) -> int:
    """Runs per compiled program: as many as fit, a multiple of `devices`, balanced.

    Each device holds `est.shared` once plus `est.per_run` per run it gets; a program of `r`
    runs puts `r / devices` on each. With `k` runs fitting per device, the sweep needs
    `programs = ceil(num_runs / (k * devices))` programs; the result is the smallest multiple
    of `devices` that covers `num_runs` in that many programs (the last one padded to it when
    `num_runs` is not a multiple: e.g. 10 runs, 1 device, 7 fit: 5 per program, not 7 + 3).

    Args:
      num_runs: runs of the sweep (>= 1).
      est: one run's `estimate`.
      devices: devices the runs axis of a program is split over (>= 1).
      budget: free bytes per device (None: `available_bytes()` of the default device).
      fraction: share of `budget` to plan with, in (0, 1] (room for XLA's fragmentation and
        the estimate's error).

    Raises:
      ValueError: not even one run fits on a device, naming the bytes needed and available,
        the largest part and what to reduce.
    """
    num_runs = check_int("num_runs", num_runs, 1)
    devices = check_int("devices", devices, 1)
    per_device = _fitting(est, budget, fraction)[2]
    programs = -(-num_runs // (per_device * devices))
    per_program = -(-num_runs // programs)
    return -(-per_program // devices) * devices


def check_fits(
    est: MemoryEstimate,
    budget: int | None = None,
    *,
    runs: int = 1,
    fraction: float = 0.8,
) -> None:
    """Raise `ValueError` unless a program of `runs` runs of `est` fits `fraction` of
    `budget` (None: `available_bytes()` of the default device); nothing is allocated.

    The guard a run or a sweep calls before compiling: the message names the plan (bytes per
    run, shared, total), the budget and what to change: fewer runs per program (how many
    fit), running the runs in chunks, or, when not even one run fits, the largest part and
    how to shrink it (a smaller model, fewer clients, a smaller batch).
    """
    runs = check_int("runs", runs, 1)
    budget, usable, fit = _fitting(est, budget, fraction)
    need = est.total(runs)
    if need <= usable:
        return
    raise ValueError(
        f"the memory plan of {runs} runs of {est.method or 'the method'} in one program needs "
        f"{format_bytes(need)} ({need} bytes: {format_bytes(est.shared)} shared + {runs} x "
        f"{format_bytes(est.per_run)} per run) but {fraction:.0%} of the "
        f"{format_bytes(budget)} free on a device is {format_bytes(usable)} ({usable} bytes); "
        f"change: at most {fit} runs per program fit, so run fewer runs per program or the "
        "runs in chunks (or a smaller model, fewer clients or a smaller batch per run)"
    )


def _fitting(est: MemoryEstimate, budget: int | None, fraction: float) -> tuple[int, int, int]:
    """`(budget, usable bytes, runs that fit on a device)`; a ValueError when not one does."""
    fraction = check_float("fraction", fraction, 0.0, 1.0, low_inclusive=False)
    if not isinstance(est, MemoryEstimate):
        raise ValueError(f"est must be a MemoryEstimate; got {type(est).__name__}")
    budget = available_bytes() if budget is None else check_int("budget", budget, 1)
    usable = int(fraction * budget)
    fit = (usable - est.shared) // max(est.per_run, 1)
    if fit < 1:
        raise ValueError(_too_big(est, budget, fraction, usable))
    return budget, usable, fit


_ADVICE = {
    "params": "fewer clients/nodes or a smaller model",
    "optimizer": "plain SGD (momentum=0) keeps no optimizer state; or fewer clients/nodes",
    "algorithm": (
        "fewer clients/nodes or samples per client (pFedWN's EM holds [S, K, samples] "
        "arrays; FedProx, FedAMP, Per-FedAvg copies of every model), or another method"
    ),
    "data": "fewer or smaller clients, or runs sharing one partition (shared_data=True)",
    "activations": "a smaller batch size or fewer slots trained at once (chunk)",
}


def _too_big(est: MemoryEstimate, budget: int, fraction: float, usable: int) -> str:
    """The message of a run that does not fit: needed, available, largest part, advice."""
    need = est.total(1)
    part = est.largest() if est.per_run >= est.shared else "shared"
    advice = _ADVICE.get(part, "fewer or smaller clients (the shared data does not fit)")
    return (
        f"one run of {est.method or 'the method'} needs {format_bytes(need)} ({need} bytes: "
        f"{format_bytes(est.per_run)} per run + {format_bytes(est.shared)} shared) but "
        f"{fraction:.0%} of the {format_bytes(budget)} free on a device is "
        f"{format_bytes(usable)} ({usable} bytes). Largest part: {part} "
        f"({format_bytes(getattr(est, part))}, {est.slots} slots, {est.chunk} trained at once"
        f"{', in ' + est.phase if est.phase else ''}); reduce: {advice}.\n{est.describe()}"
    )
