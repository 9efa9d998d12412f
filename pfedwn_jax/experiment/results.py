"""`Result`: what `run()` returns and what `pfedwn run` writes as `results.json`.

The JSON layout is a stable schema documented in `docs/experiments.md`; tools read it.
Accuracies are fractions in [0, 1]; non-finite numbers (a diverged loss) are stored as null.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.io import atomic_write_json

SCHEMA = "pfedwn-results/1"


def to_jsonable(value: Any) -> Any:
    """Nested lists/dicts of Python scalars; NaN and infinities become None."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return to_jsonable(np.asarray(value).tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    raise TypeError(f"cannot store {type(value).__name__} in results JSON")


@dataclasses.dataclass
class Result:
    """Results of one experiment (all methods on the same network and partition).

    Attributes:
      config: the `ExperimentConfig` that produced it.
      network: the federation: mode, target, `slot_client [S]`, `is_target [S]`,
        `adjacency [S][S]`, neighbors, their P_err, selection, positions.
      data: dataset name, classes, per-client train/test sample counts.
      methods: `name -> dict` with `target_accuracy [R]`, `target_loss [R]`,
        `client_accuracy [R][S]`, `client_loss [R][S]`, `records {key: [R][...]}`,
        `max_target_accuracy`, `final_target_accuracy`, `hparams`, `timings` and `diverged`
        (None, or `{"round", "slots", "clients"}`: the first diverged round, counted from 1;
        a method stopped there has fewer than `config.rounds` rounds).
      environment: jax version, backend, devices.
      timings: `setup_s` (data + network), `total_s`.
    """

    config: ExperimentConfig
    network: dict[str, Any]
    data: dict[str, Any]
    methods: dict[str, dict[str, Any]]
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    timings: dict[str, Any] = dataclasses.field(default_factory=dict)

    # ------------------------------------------------------------------ accessors
    def target_accuracy(self, method: str) -> np.ndarray:
        """`[rounds]` target test accuracy after each round (NaN where not finite)."""
        return _array(self.methods[method]["target_accuracy"])

    def client_accuracy(self, method: str) -> np.ndarray:
        """`[rounds, S]` test accuracy of every slot after each round."""
        return _array(self.methods[method]["client_accuracy"])

    def records(self, method: str, key: str) -> np.ndarray:
        """`[rounds, ...]` per-round record `key` of `method` (e.g. pFedWN's `pi`)."""
        return _array(self.methods[method]["records"][key])

    def summary(self) -> dict[str, dict[str, float]]:
        """`method -> {"max": ..., "final": ...}` target accuracy (fractions)."""
        return {
            name: {"max": m["max_target_accuracy"], "final": m["final_target_accuracy"]}
            for name, m in self.methods.items()
        }

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(
            {
                "schema": SCHEMA,
                "config": self.config.to_dict(),
                "network": self.network,
                "data": self.data,
                "methods": self.methods,
                "environment": self.environment,
                "timings": self.timings,
            }
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        schema = data.get("schema")
        if schema != SCHEMA:
            raise ValueError(f"results schema must be {SCHEMA!r}; got {schema!r}")
        return cls(
            config=ExperimentConfig.from_dict(data["config"]),
            network=data["network"],
            data=data["data"],
            methods=data["methods"],
            environment=data.get("environment", {}),
            timings=data.get("timings", {}),
        )

    def save(self, path: str | Path) -> Path:
        """Write the JSON atomically (temp file + rename); returns the path."""
        path = Path(path)
        atomic_write_json(path, self.to_dict())
        return path

    @classmethod
    def load(cls, path: str | Path) -> Result:
        with Path(path).open() as f:
            return cls.from_dict(json.load(f))


# --------------------------------------------------------------------------- method entries
PER_ROUND = ("target_accuracy", "target_loss", "client_accuracy", "client_loss")


def new_entry(hp: Any) -> dict[str, Any]:
    """An empty `Result.methods[name]` entry for hyperparameters `hp` (a dataclass)."""
    return {
        "hparams": dataclasses.asdict(hp),
        **{key: [] for key in PER_ROUND},
        "records": {},
        "diverged": None,
        "timings": {"compile_s": 0.0, "round_s": []},
    }


def round_row(
    round_: int,
    acc: np.ndarray,
    loss: np.ndarray,
    records: dict[str, np.ndarray],
    is_target: np.ndarray,
    seconds: float,
) -> dict[str, Any]:
    """One round's results (`acc [S]`, `loss [S]`, records) as plain Python values."""
    return {
        "round": round_,
        "target_accuracy": float(acc[is_target].mean()),
        "target_loss": float(loss[is_target].mean()),
        "client_accuracy": acc.tolist(),
        "client_loss": loss.tolist(),
        "records": {k: v.tolist() for k, v in records.items()},
        "round_s": seconds,
    }


def append_round(entry: dict[str, Any], row: dict[str, Any]) -> None:
    """Add one `round_row` to `entry` (in place)."""
    entry["timings"]["round_s"].append(row["round_s"])
    for key in PER_ROUND:
        entry[key].append(row[key])
    for k, v in row["records"].items():
        entry["records"].setdefault(k, []).append(v)


def finish_entry(entry: dict[str, Any]) -> None:
    """Add the summary (max and final target accuracy, total time); idempotent."""
    acc = np.array(entry["target_accuracy"], dtype=float)
    entry["max_target_accuracy"] = float(np.nanmax(acc)) if np.isfinite(acc).any() else None
    entry["final_target_accuracy"] = float(acc[-1]) if len(acc) else None
    entry["timings"]["total_s"] = float(
        entry["timings"]["compile_s"] + sum(entry["timings"]["round_s"])
    )


def entry_header(entry: dict[str, Any]) -> dict[str, Any]:
    """`entry` without its per-round lists: its size does not grow with the rounds."""
    head = {k: v for k, v in entry.items() if k not in (*PER_ROUND, "records")}
    head["timings"] = {k: v for k, v in entry["timings"].items() if k != "round_s"}
    return head


def rebuild_entry(header: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The entry that `entry_header` and the `round_row`s of its rounds came from."""
    entry: dict[str, Any] = {
        "hparams": header["hparams"],
        **{key: [] for key in PER_ROUND},
        "records": {},
        "timings": {"round_s": []},
    }
    entry.update({k: v for k, v in header.items() if k != "timings"})
    entry["timings"].update(header["timings"])
    for row in rows:
        append_round(entry, row)
    return entry


def _array(nested: Any) -> np.ndarray:
    return np.array(nested, dtype=float)  # None (stored for NaN) becomes NaN
