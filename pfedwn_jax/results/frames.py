"""Results as tidy tables (numpy columns), and as pandas DataFrames when pandas is installed.

pandas is optional (the `analysis` extra): `pandas_module()` imports it on first use and says
how to install it; the column builders here use numpy only, so tables work without it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from pfedwn_jax.results.metrics import metric_names

INSTALL = "pip install 'pfedwn-jax[analysis]'"
# per-round columns of `result_columns`, after "method" and "round"
RESULT_COLUMNS = (
    "target_accuracy",
    "target_loss",
    "mean_client_accuracy",
    "client_accuracy_q10",
    "client_accuracy_q50",
    "client_accuracy_q90",
)


def pandas_module(what: str) -> ModuleType:
    """`pandas`, or an `ImportError` naming `what` needs it and how to install it."""
    try:
        import pandas  # optional (the `analysis` extra): imported where a frame is built
    except ImportError:
        raise ImportError(
            f"{what} needs pandas, which is not installed ({INSTALL}); without it use the "
            "numpy columns (.rows, or result_columns) or the CSV/JSON files"
        ) from None
    return pandas


def result_columns(result: Any) -> dict[str, np.ndarray]:
    """A `Result` as tidy columns, one row per method x round: "method", "round" (from 1),
    the target accuracy and loss, the mean and 10/50/90 % quantiles of client accuracy over
    the slots, then one column per record holding one number per round (e.g.
    `link_failure_rate`; NaN for a method without it), then the other registered metrics."""
    parts = [_method_columns(result, name) for name in result.methods]
    if not parts:
        return {"method": np.array([], dtype=str), "round": np.array([], dtype=np.int64)}
    return stack_parts(parts)


def _method_columns(result: Any, name: str) -> dict[str, np.ndarray]:
    """The rows of one method (its rounds)."""
    entry = result.methods[name]
    acc = result.target_accuracy(name)
    stats = result.client_accuracy_stats(name)
    rounds = acc.shape[0]
    columns: dict[str, np.ndarray] = {
        "method": np.full(rounds, name),
        "round": np.arange(1, rounds + 1),
        "target_accuracy": acc,
        "target_loss": np.asarray(entry["target_loss"], dtype=float),
        "mean_client_accuracy": stats["mean"],
    }
    columns |= {f"client_accuracy_{q}": stats[q] for q in ("q10", "q50", "q90")}
    for key in metric_names():  # other registered per-round metrics (validation accuracy, ...)
        if key not in columns and key in entry and np.ndim(entry[key]) == 1:
            columns[key] = np.asarray(entry[key], dtype=float)
    for key in entry.get("records", {}):
        values = result.records(name, key)
        if values.ndim == 1 and values.shape[0] == rounds:
            columns[key] = values.astype(float)
    return columns


def stack_parts(parts: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Tidy columns from `parts` (each `name -> [n]`, with a `round` column) end to end; a
    part without a column is NaN there; object columns (labels) back to their natural dtype."""
    out = {}
    for k in dict.fromkeys(k for p in parts for k in p):
        pieces = [np.full(len(p["round"]), np.nan) if p.get(k) is None else p[k] for p in parts]
        column = np.concatenate(pieces)
        out[k] = np.asarray(column.tolist()) if column.dtype == object else column
    return out
