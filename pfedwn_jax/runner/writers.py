"""Metric writers: where the driver sends every run's rounds once they are safe on disk.

A writer has `log(event)` and `close()`. `Logged` carries one run's rounds of one method: the
run's labels (seed, swept values), its config, the rounds, every registered metric, the
per-slot arrays, the kept records and the slots' layout (targets, data clients, neighbor
lists). With a checkpoint the driver sends a round once its checkpoint step is complete on
disk; without one, after each block. The built-in writers keep a `ledger.Ledger` beside their
files: the driver calls `start(resumed)` first, and a resumed job sends every committed
round again, of which each writer writes only those its files lack (its files first cut back
to the ledger's sizes), so CSV and TensorBoard files hold every round exactly once wherever
a kill lands (W&B, which cannot cut back, at most repeats the rounds of one write). A writer
whose `live` attribute is True (the `callback` of `run`) gets every block at once instead,
committed or not: it is a hook to watch or stop a run, not a log.

Built in, each writing what `scalars` and `histograms` give per round:

- `CSVWriter(path)`: one long CSV, a row per (run, method, round, scalar); no dependency.
- `TensorBoardWriter(logdir)`: event files `logdir/<run>/<method>/` (tensorboardX, no
  TensorFlow; the `tensorboard` extra).
- `WandbWriter(project)`: one W&B run per run of the job (a sweep: per grid point and seed)
  with its config and labels, keys `<method>/<metric>` against `<method>/round` (the `wandb`
  extra; `mode="offline"` writes locally for `wandb sync`).

`make_writers("tensorboard,csv", logdir)` builds them from the command line's `--log-to`.
In a job over several processes only process 0 writes (`distributed.is_writer`).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import importlib
import itertools
import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from pfedwn_jax._checks import split_list
from pfedwn_jax.distributed import is_writer
from pfedwn_jax.io import check_writable_file
from pfedwn_jax.runner.ledger import Ledger


class Logged(NamedTuple):
    """One block of one run and method.

    Attributes:
      run: the run's index in the job. labels: its labels (`{"seed": 3, "lr": 0.1}`).
      method: the method's name. rounds: `[n]` rounds (from 1).
      metrics: `name -> [n]` every registered metric (`results.metrics`).
      arrays: `accuracy`, `loss` (and `val_accuracy`) `[n, S]` per slot.
      records: `key -> [n, ...]` the kept records (pFedWN's `pi [n, S, K]`, ...).
      config: the run's `ExperimentConfig.to_dict()` (empty when unknown).
      slots: `is_target [S]`, `slot_client [S]` (data client of each slot), `neighbors` and
        `neighbor_mask [S, K]` (the columns of `pi`); empty when unknown.
    """

    run: int
    labels: Mapping[str, Any]
    method: str
    rounds: np.ndarray
    metrics: Mapping[str, np.ndarray]
    arrays: Mapping[str, np.ndarray]
    records: Mapping[str, np.ndarray]
    config: Mapping[str, Any] = {}
    slots: Mapping[str, np.ndarray] = {}


class Writer(Protocol):
    def log(self, event: Logged) -> None: ...

    def close(self) -> None: ...


class CallbackWriter:
    """`callback(method, rounds_done, metrics)` after every round, `metrics` holding every
    registered metric and `client_accuracy [S]` (plain Python values). Live: called after
    each block, before its checkpoint step is known to be on disk, so a resumed run calls
    it again for the rounds after the last complete step."""

    live = True

    def __init__(self, callback: Callable[[str, int, dict[str, Any]], None]) -> None:
        self.callback = callback

    def log(self, event: Logged) -> None:
        for j, rnd in enumerate(event.rounds):
            row = {k: float(v[j]) for k, v in event.metrics.items()}
            row["client_accuracy"] = np.asarray(event.arrays["accuracy"][j]).tolist()
            self.callback(event.method, int(rnd), row)

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- what is logged
def scalars(event: Logged, j: int) -> dict[str, float]:
    """Round `j` of `event` as scalars: every registered metric (target and mean client
    accuracy, target loss, validation accuracy, ...), the mean client test loss and, with
    pFedWN's `pi` kept, the first target's weight of each selected neighbor as
    `pi/client_<c>` (c: the neighbor's data client). NaN values are left out."""
    out = {k: float(v[j]) for k, v in event.metrics.items()}
    if "loss" in event.arrays:
        out["mean_client_loss"] = float(np.mean(event.arrays["loss"][j]))
    out.update(_pi_scalars(event, j))
    return {k: v for k, v in out.items() if math.isfinite(v)}


def _pi_scalars(event: Logged, j: int) -> dict[str, float]:
    """`pi/client_<c>`: the first target slot's pi over its real neighbor columns."""
    pi, slots = event.records.get("pi"), event.slots
    if pi is None or not slots or np.ndim(pi) != 3:
        return {}
    targets = np.flatnonzero(np.asarray(slots["is_target"]))
    if targets.size == 0:
        return {}
    s = int(targets[0])
    row, mask = np.asarray(pi[j][s]), np.asarray(slots["neighbor_mask"][s])
    nbrs, client = np.asarray(slots["neighbors"][s]), np.asarray(slots["slot_client"])
    return {
        f"pi/client_{int(client[nbrs[k]])}": float(row[k])
        for k in range(1, min(len(row), len(mask)))
        if mask[k]
    }


def histograms(event: Logged, j: int) -> dict[str, np.ndarray]:
    """Round `j`'s distributions: `client_accuracy` over the slots and, with `pi` kept, `pi`
    over every real (slot, neighbor) entry of every slot."""
    out = {"client_accuracy": np.asarray(event.arrays["accuracy"][j], np.float64)}
    pi, slots = event.records.get("pi"), event.slots
    if pi is not None and slots and np.ndim(pi) == 3:
        mask = np.asarray(slots["neighbor_mask"], bool).copy()
        mask[:, 0] = False  # column 0 is the slot itself (weight 0)
        values = np.asarray(pi[j])
        values = values[mask] if values.shape == mask.shape else values.ravel()
        if values.size:
            out["pi"] = values.astype(np.float64)
    return out


def run_name(labels: Mapping[str, Any]) -> str:
    """A file-name-safe name of a run from its labels: `seed=0,lr=0.05`."""
    text = ",".join(f"{k}={v}" for k, v in labels.items()) or "run"
    return re.sub(r"[^A-Za-z0-9=,._+-]", "_", text)


class _LedgerWriter:
    """A built-in writer: its ledger passes on only the rounds its files lack (`_log`)."""

    ledger: Ledger

    def start(self, resumed: bool) -> None:
        self.ledger.start(resumed)

    def log(self, event: Logged) -> None:
        new = self.ledger.new(event) if is_writer() else None
        if new is not None:
            self._log(new)

    def _log(self, event: Logged) -> None:
        raise NotImplementedError


# --------------------------------------------------------------------------- CSV
class CSVWriter(_LedgerWriter):
    """A long (tidy) CSV at `path`: `run`, the run's labels, `method`, `round`, `name`,
    `value`, one row per scalar (`scalars`), so methods with their own scalars (pFedWN's
    `pi/client_<c>`) share one file; `pandas.read_csv(path).pivot_table(...)` widens it.

    The columns come from the first event. The file is replaced on the first event unless
    `append` (a resumed job adds its rounds); the same writer given to a later job adds to
    it."""

    def __init__(self, path: str | Path, *, append: bool = False) -> None:
        self.path, self.append = check_writable_file(path, "metrics CSV"), bool(append)
        self._file: Any = None
        self._writer: Any = None
        self.ledger = Ledger(self.path.with_name(f".{self.path.name}.written"), self._files)

    def _files(self) -> list[Path]:
        return [self.path]

    def start(self, resumed: bool) -> None:
        """A fresh job empties the file (unless `append`); a resumed one adds to it."""
        if not is_writer():
            return
        self.append = self.append or resumed
        if not self.append:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_bytes(b"")
        self.ledger.start(resumed)

    def _log(self, event: Logged) -> None:
        head = {"run": event.run, **event.labels, "method": event.method}
        for j, rnd in enumerate(event.rounds):
            for name, value in scalars(event, j).items():
                self._row({**head, "round": int(rnd), "name": name, "value": repr(value)})
        if self._file is not None:
            self._file.flush()
        self.ledger.wrote(event, self.path)

    def _row(self, row: dict[str, Any]) -> None:
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            old = self.append and self.path.is_file() and self.path.stat().st_size > 0
            fields = _header(self.path) if old else list(row)
            self._file = self.path.open("a" if old else "w", newline="")
            self._writer = csv.DictWriter(self._file, fields, extrasaction="ignore")
            if not old:
                self._writer.writeheader()
            self.append = True  # the same writer in a later job adds to its file
        self._writer.writerow(row)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file, self._writer = None, None


def _header(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return next(csv.reader(f), [])


# --------------------------------------------------------------------------- TensorBoard
def _optional(module: str, extra: str, what: str) -> Any:
    """Import `module`; a ValueError naming the extra to install when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(
            f"{what} needs {module}: pip install 'pfedwn-jax[{extra}]' (in a clone after "
            f"`make demo`, which installs only the plot extra: .venv/bin/pip install -e "
            f"'.[{extra}]')"
        ) from None


_EVENT_FILES = itertools.count()  # event files this process opened


class TensorBoardWriter(_LedgerWriter):
    """TensorBoard event files, `logdir/<run>/<method>/`, one per run and method, so that
    TensorBoard overlays the methods and runs of a tag (`target_accuracy`, `pi/client_3`,
    ...) in one chart, with histograms of client accuracy and pi.

    Written with tensorboardX's event protos (no TensorFlow), as they are logged (so the ledger
    knows what is on disk). Each (run, method) file starts with a `purge_step` event at its
    first round logged in this process, so TensorBoard hides what an earlier job in the same
    directory logged from that round on (a rerun replaces it)."""

    def __init__(self, logdir: str | Path) -> None:
        self.logdir = Path(logdir)
        self._tbx = _optional("tensorboardX", "tensorboard", "TensorBoardWriter")
        self._open: dict[tuple[int, str], Any] = {}
        self.ledger = Ledger(self.logdir / ".written", self._files)

    def _files(self) -> list[Path]:
        return sorted(self.logdir.rglob("events.out.tfevents.*"))

    def _log(self, event: Logged) -> None:
        w = self._writer(event)
        for j, rnd in enumerate(event.rounds):
            for tag, value in scalars(event, j).items():
                w.scalar(tag, value, int(rnd))
            for tag, values in histograms(event, j).items():
                w.histogram(tag, values, int(rnd))
        w.flush()
        self.ledger.wrote(event, w.path)

    def _writer(self, event: Logged) -> Any:
        key = (event.run, event.method)
        if key not in self._open:
            where = self.logdir / run_name(event.labels) / event.method
            # tensorboardX names a file by the second and the host alone: a resumed job's
            # writer opened within the same second would overwrite the interrupted one's
            suffix = f".{os.getpid()}.{next(_EVENT_FILES)}"
            self._open[key] = _EventFile(where, int(event.rounds[0]), suffix)
        return self._open[key]

    def close(self) -> None:
        for w in self._open.values():
            w.close()
        self._open.clear()


class _EventFile:
    """One TensorBoard event file written when called (tensorboardX's `SummaryWriter` writes
    from a thread that its `flush` does not wait for), starting like a
    `SummaryWriter(purge_step=first)`'s; histograms in its default buckets."""

    def __init__(self, where: Path, first: int, suffix: str) -> None:
        where.mkdir(parents=True, exist_ok=True)
        self.pb = importlib.import_module("tensorboardX.proto.event_pb2")
        self.summary = importlib.import_module("tensorboardX.summary")
        files = importlib.import_module("tensorboardX.event_file_writer")
        self.file = files.EventsWriter(str(where / "events"), suffix)
        self.path = Path(self.file._file_name)
        self._write(first, session_log=self.pb.SessionLog(status=self.pb.SessionLog.START))

    def _write(self, step: int, **fields: Any) -> None:
        self.file.write_event(self.pb.Event(wall_time=time.time(), step=step, **fields))

    def scalar(self, tag: str, value: float, step: int) -> None:
        self._write(step, summary=self.summary.scalar(tag, value))

    def histogram(self, tag: str, values: np.ndarray, step: int) -> None:
        self._write(step, summary=self.summary.histogram(tag, values, _buckets()))

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()


@functools.cache
def _buckets() -> list[float]:
    """`SummaryWriter`'s default histogram bucket edges: +-1e-12 * 1.1**k up to 1e20, and 0."""
    edges, v = [], 1e-12
    while v < 1e20:
        edges.append(v)
        v *= 1.1
    return [-e for e in reversed(edges)] + [0.0] + edges


# --------------------------------------------------------------------------- Weights & Biases
class WandbWriter(_LedgerWriter):
    """One W&B run per run of the job, named by its labels, with the run's config and labels
    as its W&B config; `<method>/<scalar>` logged against `<method>/round` (methods run one
    after another, each from round 1), histograms as `wandb.Histogram`.

    `mode`: "offline" (files under `dir` for `wandb sync`), "online", or None (W&B's own
    setting, `WANDB_MODE`). The W&B run id is derived from `project`, `group` and the labels,
    and runs are opened with `resume="allow"`, so a resumed job continues the same W&B runs.
    Needs wandb >= 0.19.10 (several runs open in one process)."""

    def __init__(
        self,
        project: str = "pfedwn",
        *,
        dir: str | Path | None = None,
        mode: str | None = "offline",
        group: str | None = None,
        **init_kwargs: Any,
    ) -> None:
        if mode not in (None, "offline", "online", "disabled"):
            raise ValueError(f"mode must be 'offline', 'online', 'disabled' or None; got {mode!r}")
        self._wandb = _optional("wandb", "wandb", "WandbWriter")
        self.project, self.dir, self.mode, self.group = project, dir, mode, group
        settings = getattr(self._wandb, "Settings", None)
        if "settings" not in init_kwargs and settings is not None:
            # W&B's own ~30-line run history and summary at `finish` kept out of the job's
            # output (its files hold them; `settings=` of the caller wins)
            init_kwargs["settings"] = settings(quiet=True)
        self.init_kwargs = init_kwargs
        self._runs: dict[int, Any] = {}
        self._methods: set[tuple[int, str]] = set()
        where = Path(dir if dir is not None else ".") / f".wandb-{project}-{group}.written"
        self.ledger = Ledger(where, lambda: [])

    def _log(self, event: Logged) -> None:
        run = self._run(event)
        if (event.run, event.method) not in self._methods:
            run.define_metric(f"{event.method}/round")
            run.define_metric(f"{event.method}/*", step_metric=f"{event.method}/round")
            self._methods.add((event.run, event.method))
        for j, rnd in enumerate(event.rounds):
            row: dict[str, Any] = {f"{event.method}/round": int(rnd)}
            row.update({f"{event.method}/{k}": v for k, v in scalars(event, j).items()})
            for tag, values in histograms(event, j).items():
                row[f"{event.method}/{tag}"] = self._wandb.Histogram(values)
            run.log(row)
        self.ledger.wrote(event)

    def _run(self, event: Logged) -> Any:
        if event.run not in self._runs:
            name = run_name(event.labels)
            ident = hashlib.sha256(f"{self.project}/{self.group}/{name}".encode()).hexdigest()
            if self.dir is not None:
                Path(self.dir).mkdir(parents=True, exist_ok=True)
            self._runs[event.run] = self._wandb.init(
                project=self.project,
                group=self.group,
                name=name,
                id=ident[:16],
                resume="allow",
                reinit="create_new",
                dir=None if self.dir is None else str(self.dir),
                mode=self.mode,
                config={"labels": dict(event.labels), **dict(event.config)},
                **self.init_kwargs,
            )
        return self._runs[event.run]

    def close(self) -> None:
        for run in self._runs.values():
            run.finish()
        self._runs.clear()


# --------------------------------------------------------------------------- from names
#: What `--log-to` accepts.
KINDS = ("tensorboard", "wandb", "csv")


def parse_kinds(text: str | Sequence[str]) -> tuple[str, ...]:
    """`"tensorboard,csv"` (or a list) -> `("tensorboard", "csv")`; a ValueError naming an
    unknown kind and the allowed ones."""
    items = split_list("log-to", text) if isinstance(text, str) else list(text)
    if len(set(items)) < len(items) or not all(isinstance(k, str) and k for k in items):
        raise ValueError(f"log-to: each writer once, none empty; got {items!r}")
    kinds = tuple(items)
    for k in kinds:
        if k not in KINDS:
            raise ValueError(f"log-to: unknown writer {k!r}; allowed: {', '.join(KINDS)}")
    return kinds


def make_writers(
    kinds: str | Sequence[str],
    logdir: str | Path,
    *,
    append: bool = False,
    wandb_project: str = "pfedwn",
    wandb_mode: str | None = "offline",
) -> list[Writer]:
    """The writers named in `kinds` (`KINDS`), writing under `logdir`: `tensorboard/`,
    `metrics.csv` (`append`: a resumed job adds to it) and `wandb/`."""
    logdir, out = Path(logdir), list[Writer]()
    for kind in parse_kinds(kinds):
        if kind == "tensorboard":
            out.append(TensorBoardWriter(logdir / "tensorboard"))
        elif kind == "csv":
            out.append(CSVWriter(logdir / "metrics.csv", append=append))
        else:
            out.append(WandbWriter(wandb_project, dir=logdir, mode=wandb_mode))
    return out
