"""The table a driver fills block by block: per run and method, every round's per-slot results.

`Table.add_block(run, method, start, block)` takes one block of rounds of one run (host arrays
`[n, S]` trimmed to the run's own slots, the kept records `[n, ...]`, wall seconds) and notes
divergence: the first round in which some slot is not finite (`divergence.slot_finite`) is
the run's diverged round; with the policy `"stop"` the rounds after it are dropped (a run
stopped there has fewer rounds), with `"continue"` every round is kept. Everything a result
needs is derived from it: the tidy rows of a sweep (`columns`, one row per run x method x
round, one column per registered metric of `results.metrics`) and the per-method entries of a
single run's `Result` (`Track`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pfedwn_jax.results import metrics as metric_registry
from pfedwn_jax.results.divergence import LOSS_BOUND, check_policy
from pfedwn_jax.results.frames import stack_parts

log = logging.getLogger("pfedwn_jax")


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What the table needs of a run: its slots' targets and data clients (`[S]` each)."""

    is_target: np.ndarray
    slot_client: np.ndarray

    @property
    def num_slots(self) -> int:
        return int(self.is_target.shape[0])


@dataclasses.dataclass
class Track:
    """One run and method so far.

    Attributes:
      arrays: `accuracy`, `loss`, `finite` and (with a validation split) `val_accuracy`, each
        a list of `[n, S]` blocks.
      records: `key -> list of [n, ...]` blocks.
      metrics: `name -> list of [n]` blocks of the registered metrics.
      seconds: wall seconds of every round (a block's time shared by its rounds).
      diverged: None, or `{"round", "slots", "clients"}` (the first diverged round, from 1).
      compile_s: seconds spent compiling this method's program (shared by a group's runs).
      resumed_at: rounds at which an interrupted job was resumed (its later times are those
        of another process).
      stopped: no more rounds are kept (diverged under the policy "stop").
    """

    arrays: dict[str, list[np.ndarray]] = dataclasses.field(default_factory=dict)
    records: dict[str, list[np.ndarray]] = dataclasses.field(default_factory=dict)
    metrics: dict[str, list[np.ndarray]] = dataclasses.field(default_factory=dict)
    seconds: list[float] = dataclasses.field(default_factory=list)
    diverged: dict[str, Any] | None = None
    compile_s: float = 0.0
    resumed_at: list[int] = dataclasses.field(default_factory=list)
    stopped: bool = False

    @property
    def rounds(self) -> int:
        return len(self.seconds)

    def array(self, key: str) -> np.ndarray | None:
        """`[R, ...]` of per-slot array `key` over the rounds kept (None if absent)."""
        return _joined(self.arrays.get(key))

    def record(self, key: str) -> np.ndarray | None:
        return _joined(self.records.get(key))

    def metric(self, name: str) -> np.ndarray | None:
        return _joined(self.metrics.get(name))

    def metric_ends(self) -> dict[str, float]:
        """Each metric's value at the last round kept so far (running totals go on from it)."""
        return {k: float(v[-1][-1]) for k, v in self.metrics.items() if v and len(v[-1])}


def _warn(method: str, run: int | None, diverged: dict[str, Any]) -> None:
    """One warning line naming the diverged round, slots and clients."""
    log.warning(
        "%s diverged at round %d%s: non-finite or |loss| > %g on slot(s) %s (client(s) %s)",
        method,
        diverged["round"],
        "" if run is None else f" of run {run}",
        LOSS_BOUND,
        diverged["slots"],
        diverged["clients"],
    )


def _joined(blocks: list[np.ndarray] | None) -> np.ndarray | None:
    return None if not blocks else np.concatenate(blocks, axis=0)


def listed(values: np.ndarray | None) -> np.ndarray:
    """`Track.metric/array/record` of a key the track lists: present, never None."""
    assert values is not None
    return values


class Table:
    """Per run and method, the rounds done so far (see the module docstring)."""

    def __init__(
        self,
        runs: Sequence[RunInfo],
        labels: Sequence[Mapping[str, Any]],
        methods: Sequence[str],
        on_divergence: str = "stop",
    ) -> None:
        self.runs, self.labels = list(runs), [dict(x) for x in labels]
        self.methods = tuple(methods)
        self.policy = check_policy(on_divergence)
        self.tracks = {(r, m): Track() for r in range(len(self.runs)) for m in self.methods}

    def track(self, run: int, method: str) -> Track:
        return self.tracks[run, method]

    def add_block(
        self,
        run: int,
        method: str,
        start: int,
        block: Mapping[str, Any],
        seconds: float,
        *,
        quiet: bool = False,
    ) -> int:
        """Rounds `start + 1 .. start + n` of `run`'s `method`: `block` holds `accuracy`,
        `loss`, `finite` (and `val_accuracy`) `[n, S]` and `records` (`key -> [n, ...]`).
        Returns the rounds kept (fewer than `n` when the run stopped at a diverged round).
        `quiet`: no warning for a divergence (a block replayed from a checkpoint)."""
        track = self.track(run, method)
        if track.stopped or start != track.rounds:
            return 0
        n = int(np.shape(block["accuracy"])[0])
        finite = np.asarray(block["finite"], bool)
        keep = self._divergence(run, method, start, finite, quiet) or n
        for key in metric_registry.SLOT_METRICS:
            if block.get(key) is not None:
                track.arrays.setdefault(key, []).append(np.asarray(block[key])[:keep])
        for key, value in block.get("records", {}).items():
            track.records.setdefault(key, []).append(np.asarray(value)[:keep])
        rounds = self._rounds(run, block, keep)
        for name, value in metric_registry.compute(rounds, track.metric_ends()).items():
            track.metrics.setdefault(name, []).append(value)
        track.seconds.extend([seconds / n] * keep)
        return keep

    def _rounds(self, run: int, block: Mapping[str, Any], keep: int) -> metric_registry.Rounds:
        val = block.get("val_accuracy")
        return metric_registry.Rounds(
            accuracy=np.asarray(block["accuracy"], np.float64)[:keep],
            loss=np.asarray(block["loss"], np.float64)[:keep],
            val_accuracy=None if val is None else np.asarray(val, np.float64)[:keep],
            is_target=self.runs[run].is_target,
            records={k: np.asarray(v)[:keep] for k, v in block.get("records", {}).items()},
            slots={
                k: np.asarray(block[k])[:keep]
                for k in metric_registry.SLOT_METRICS
                if block.get(k) is not None
            },
        )

    def _divergence(
        self, run: int, method: str, start: int, finite: np.ndarray, quiet: bool
    ) -> int | None:
        """Note the run's first diverged round in this block; under "stop", the rounds of the
        block to keep (up to the diverged one), else None (all)."""
        track = self.track(run, method)
        bad = np.flatnonzero(~finite.all(axis=1))
        if track.diverged is not None or bad.size == 0:
            return None
        j = int(bad[0])
        slots = np.flatnonzero(~finite[j])
        clients = self.runs[run].slot_client[slots].tolist()
        track.diverged = {"round": start + j + 1, "slots": slots.tolist(), "clients": clients}
        if not quiet:
            _warn(method, run if len(self.runs) > 1 else None, track.diverged)
        if self.policy != "stop":
            return None
        track.stopped = True
        return j + 1

    def active(self, runs: Sequence[int], method: str) -> bool:
        """Whether any of `runs` still keeps rounds of `method` (not stopped)."""
        return any(not self.track(r, method).stopped for r in runs)

    # ------------------------------------------------------------------ tidy rows
    def columns(self) -> dict[str, np.ndarray]:
        """The tidy table: one row per run x method x round kept, columns `run`, the run's
        labels, `method`, `round` (from 1), every metric, `diverged` (at or before the
        round); rows ordered by run, method, round. Empty dict without rows."""
        parts: list[dict[str, Any]] = []
        for run in range(len(self.runs)):
            for method in self.methods:
                part = self._part(run, method)
                if part is not None:
                    parts.append(part)
        return stack_parts(parts) if parts else {}

    def _part(self, run: int, method: str) -> dict[str, Any] | None:
        track = self.track(run, method)
        n = track.rounds
        if n == 0:
            return None
        rounds = np.arange(1, n + 1)
        first = track.diverged["round"] if track.diverged is not None else n + 1
        part: dict[str, Any] = {"run": np.full(n, run)}
        part.update({k: np.full(n, v, dtype=object) for k, v in self.labels[run].items()})
        part.update(method=np.full(n, method, dtype=object), round=rounds)
        part.update({name: track.metric(name) for name in track.metrics})
        part["diverged"] = rounds >= first
        return part
