"""A single run's `Result.methods[name]` entry, built from its `Track` in the table.

The entry holds, per round, every registered metric (`target_accuracy`, `target_loss`,
`mean_client_accuracy`, `target_val_accuracy` with a validation split, ...) and the client
accuracy statistics; on the recorded rounds (every `record_every` and the last) the per-slot
rows `client_accuracy`, `client_loss` (and `client_val_accuracy`) and the records; plus the
summary (max and final target accuracy), the hyperparameters, timings and divergence.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pfedwn_jax.algorithms import hparams_dict
from pfedwn_jax.results.metrics import accuracy_stats, slot_rows
from pfedwn_jax.results.table import Track, listed


def recorded_rounds(rounds: int, record_every: int, last: int) -> np.ndarray:
    """`[R']` rounds (from 1, of the first `rounds`) whose per-slot rows are kept."""
    r = np.arange(1, rounds + 1)
    return r[(r % record_every == 0) | (r == last) | (r == rounds)]


def method_entry(track: Track, hp: Any, record_every: int, last: int) -> dict[str, Any]:
    """The `Result.methods[name]` entry of one run's `track` (see the module docstring);
    `last` is the configured number of rounds (a diverged run stops before it)."""
    n = track.rounds
    kept = recorded_rounds(n, record_every, last)
    rows = kept - 1
    entry: dict[str, Any] = {
        "hparams": hparams_dict(hp),
        "record_every": int(record_every),
        "record_last": int(last),
    }
    entry.update({name: listed(track.metric(name)).tolist() for name in track.metrics})
    acc = track.array("accuracy")
    entry["client_accuracy_stats"] = accuracy_stats(acc if acc is not None else np.zeros((0, 0)))
    entry["recorded_rounds"] = kept.tolist()
    for key, name in slot_rows().items():
        values = track.array(key)
        if values is not None:
            entry[name] = values[rows].tolist()
    entry["records"] = {}
    for key in track.records:
        values = listed(track.record(key))
        entry["records"][key] = (values if values.ndim == 1 else values[rows]).tolist()
    entry["diverged"] = track.diverged
    target = np.asarray(entry.get("target_accuracy", []), float)
    entry["max_target_accuracy"] = float(np.nanmax(target)) if np.isfinite(target).any() else None
    entry["final_target_accuracy"] = float(target[-1]) if n else None
    entry["timings"] = {
        "compile_s": float(track.compile_s),
        "round_s": list(track.seconds),
        "total_s": float(track.compile_s + sum(track.seconds)),
        **({"resumed_at": list(track.resumed_at)} if track.resumed_at else {}),
    }
    return entry
