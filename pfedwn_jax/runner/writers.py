"""Metric writers: where the driver sends every block of rounds as it finishes.

A writer has `log(event)` and `close()`. `Logged` carries one run's rounds of one method: the
run's labels (seed, swept values), the rounds, every registered metric, the per-slot arrays
and the kept records. The driver calls `log` after each block (not for blocks replayed from a
checkpoint, which were logged before the interruption) and `close` at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np


class Logged(NamedTuple):
    """One block of one run and method.

    Attributes:
      run: the run's index in the job. labels: its labels (`{"seed": 3, "lr": 0.1}`).
      method: the method's name. rounds: `[n]` rounds (from 1).
      metrics: `name -> [n]` every registered metric (`results.metrics`).
      arrays: `accuracy`, `loss` (and `val_accuracy`) `[n, S]` per slot.
      records: `key -> [n, ...]` the kept records (pFedWN's `pi [n, S, K]`, ...).
    """

    run: int
    labels: Mapping[str, Any]
    method: str
    rounds: np.ndarray
    metrics: Mapping[str, np.ndarray]
    arrays: Mapping[str, np.ndarray]
    records: Mapping[str, np.ndarray]


class Writer(Protocol):
    def log(self, event: Logged) -> None: ...

    def close(self) -> None: ...


class CallbackWriter:
    """`callback(method, rounds_done, metrics)` after every round, `metrics` holding
    `target_accuracy`, `target_loss` and `client_accuracy [S]` (plain Python values)."""

    def __init__(self, callback: Callable[[str, int, dict[str, Any]], None]) -> None:
        self.callback = callback

    def log(self, event: Logged) -> None:
        for j, rnd in enumerate(event.rounds):
            row = {k: float(v[j]) for k, v in event.metrics.items()}
            row["client_accuracy"] = np.asarray(event.arrays["accuracy"][j]).tolist()
            self.callback(event.method, int(rnd), row)

    def close(self) -> None:
        pass
