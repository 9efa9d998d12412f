"""The statistics of a `SweepResult` over its seeds: `summary`, `curves` and their text table.

Host-side numpy over the result's rows (one per run x method x round); the `SweepResult`
methods of the same names call these. Intervals in `results.stats`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from pfedwn_jax._checks import check_choice, check_int
from pfedwn_jax.results.cost_curves import SPENT_COLUMNS, to_accuracy
from pfedwn_jax.results.plots import shown
from pfedwn_jax.results.stats import mean_std_ci, t_interval


class SweepResult(Protocol):
    """What these statistics read of a `results.sweep.SweepResult` (typed here, so this
    module does not import the one that imports it)."""

    @property
    def rows(self) -> dict[str, np.ndarray]: ...

    @property
    def swept(self) -> tuple[str, ...]: ...

    def __len__(self) -> int: ...

    @property
    def methods(self) -> tuple[str, ...]: ...


#: Per-run statistics of a metric over its rounds (`summary`).
STATS = ("final", "last", "max")


def codes(columns: Sequence[np.ndarray], length: int) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each distinct key, code of each row): keys are the rows' tuples of
    `columns`, numbered in order of first appearance."""
    if not columns:
        return np.zeros(min(length, 1), dtype=np.int64), np.zeros(length, dtype=np.int64)
    per_column = [np.unique(c, return_inverse=True)[1].reshape(-1) for c in columns]
    _, first, inverse = np.unique(
        np.stack(per_column, axis=1), axis=0, return_index=True, return_inverse=True
    )
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return first[order], rank[inverse.reshape(-1)]


def scalar(value: Any) -> Any:
    """A numpy scalar as the Python scalar JSON and f-strings expect."""
    return value.item() if hasattr(value, "item") else value


def pairs_of(res: SweepResult) -> dict[str, np.ndarray]:
    """The (run, method) pairs `[P]`: "first" row, grid "point" code, "method", and the
    rows of pair p in round order, `rows[starts[p]:starts[p + 1]]`."""
    r = res.rows
    first, pair = codes([r["run"], r["method"]], len(res))
    _, point = codes([r[k] for k in res.swept], len(res))
    order = np.lexsort((r["round"], pair))
    starts = np.searchsorted(pair[order], np.arange(first.size + 1))
    return {"first": first, "point": point[first], "method": r["method"][first]} | {
        "rows": order,
        "starts": starts,
    }


def per_run_stats(
    res: SweepResult, window: int, metric: str = "target_accuracy"
) -> dict[str, np.ndarray]:
    """`pairs_of(res)` plus, per pair, the `STATS` of its `metric` over its rounds (NaN
    propagates) and whether it diverged."""
    pairs = pairs_of(res)
    acc, diverged = res.rows[metric], res.rows["diverged"]
    size = pairs["first"].size
    out = {**pairs, **{s: np.empty(size) for s in STATS}, "diverged": np.empty(size, bool)}
    for p in range(size):
        idx = pairs["rows"][pairs["starts"][p] : pairs["starts"][p + 1]]
        x = acc[idx].astype(float)
        out["final"][p], out["last"][p], out["max"][p] = x[-1], x[-window:].mean(), x.max()
        out["diverged"][p] = diverged[idx].any()
    # the cost was counted: time- and energy-to-accuracy
    starts, rows = pairs["starts"], pairs["rows"]
    idxs = [rows[starts[p] : starts[p + 1]] for p in range(size)]
    for key, col in SPENT_COLUMNS.items():
        if col in res.rows:
            spent = res.rows[col]
            out[key] = np.array([to_accuracy(acc[i], {col: spent[i]})[key] for i in idxs])
    return out


def groups_of(
    res: SweepResult, pairs: dict[str, np.ndarray]
) -> list[tuple[dict[str, Any], np.ndarray]]:
    """[(swept values and "method" of a group, indices of its pairs)]: grid points in order
    of first appearance, methods within each likewise."""
    methods = res.methods
    method_rank = {m: i for i, m in enumerate(methods)}
    ranks = np.array([method_rank[m] for m in pairs["method"].tolist()], dtype=np.int64)
    groups = []
    for point, rank in sorted(set(zip(pairs["point"].tolist(), ranks.tolist(), strict=True))):
        members = np.flatnonzero((pairs["point"] == point) & (ranks == rank))
        row = pairs["first"][members[0]]
        head = {k: scalar(res.rows[k][row]) for k in res.swept}
        groups.append(({**head, "method": methods[rank]}, members))
    return groups


def summary(
    res: SweepResult, window: int = 5, metric: str = "target_accuracy"
) -> list[dict[str, Any]]:
    """Per grid point and method: statistics over its runs (seeds) of target accuracy (or
    another per-round `metric`, e.g. "target_val_accuracy" to choose hyperparameters on a
    validation split, `ExperimentConfig.val_fraction`).

    Each dict: the swept values, "method", "n" (runs), "n_diverged" (runs that diverged),
    and for each per-run statistic S in `STATS` ("final": last round; "last": mean of the
    last `window` rounds, or of all if fewer; "max": maximum over rounds) "S_mean", "S_std"
    (ddof=1; 0 for n = 1), "S_ci_low", "S_ci_high" (95% Student-t interval of the mean;
    NaN for n = 1). A run stopped early by divergence contributes its own last rounds.
    With the cost counted (a `clock_s` column) also "time_to_90_*" and "energy_to_90_*":
    the simulated seconds and the joules spent (`cumulative_energy_j`) at which the metric
    first reaches 90% of its final value (`cost_curves`).
    """
    window = check_int("window", window, 1)
    floats = [k for k, v in res.rows.items() if v.dtype.kind == "f" and k not in res.swept]
    per_run = per_run_stats(res, window, check_choice("metric", metric, floats))
    out = []
    for head, members in groups_of(res, per_run):
        entry = {**head, "n": int(members.size)}
        entry["n_diverged"] = int(per_run["diverged"][members].sum())
        for s in STATS + tuple(k for k in SPENT_COLUMNS if k in per_run):
            keys = [f"{s}_{k}" for k in ("mean", "std", "ci_low", "ci_high")]
            entry.update(zip(keys, mean_std_ci(per_run[s][members]), strict=True))
        out.append(entry)
    return out


def curves(res: SweepResult, metric: str = "target_accuracy") -> list[dict[str, Any]]:
    """Per grid point and method, per round: the mean over runs with its band.

    Each dict: the swept values, "method", and `[T]` arrays over the rounds any of its
    runs reached: "round", "n" (runs with a finite value there: a run stopped by
    divergence, or a non-finite value, drops out), "mean", "std" (ddof=1; 0 for n = 1),
    "ci_low", "ci_high" (95% Student-t interval of the mean; NaN for n < 2).
    """
    floats = [k for k, v in res.rows.items() if v.dtype.kind == "f" and k not in res.swept]
    metric = check_choice("metric", metric, floats)
    pairs, r = pairs_of(res), res.rows
    out = []
    for head, members in groups_of(res, pairs):
        idx = [pairs["rows"][pairs["starts"][p] : pairs["starts"][p + 1]] for p in members]
        rounds = np.unique(r["round"][np.concatenate(idx)])
        x = np.full((members.size, rounds.size), np.nan)
        for i, rows in enumerate(idx):
            x[i, np.searchsorted(rounds, r["round"][rows])] = r[metric][rows]
        x[~np.isfinite(x)] = np.nan
        n = np.sum(~np.isnan(x), axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.nansum(x, axis=0) / np.where(n > 0, n, np.nan)
            var = np.nansum((x - mean) ** 2, axis=0) / np.where(n > 1, n - 1, np.nan)
        std = np.where(n == 1, 0.0, np.sqrt(var))
        low, high = t_interval(mean, std, n)
        out.append(
            head
            | {"round": rounds, "n": n, "mean": mean, "std": std}
            | {
                "ci_low": low,
                "ci_high": high,
            }
        )
    return out


def summary_table(res: SweepResult, window: int = 5) -> str:
    """`summary(window)` as aligned text: mean +- 95% CI half-width of target accuracy (%)."""
    entries = summary(res, window)
    head = [*res.swept, "method", "n", "div", "final", f"last{window}", "max"]
    body = [
        [
            *(shown(e[k]) for k in res.swept),
            e["method"],
            str(e["n"]),
            str(e["n_diverged"]),
            *(_pm(e[f"{s}_mean"], e[f"{s}_ci_high"]) for s in STATS),
        ]
        for e in entries
    ]
    widths = [max(len(row[c]) for row in [head, *body]) for c in range(len(head))]
    left = len(res.swept) + 1  # swept values and method: left-aligned
    lines = [
        f"Target accuracy (%) over seeds: mean +- 95% CI half-width (Student t; n = 1: "
        f"mean only); last{window} = mean of the last {window} rounds; div = runs diverged",
        *(
            "  ".join(
                cell.ljust(w) if c < left else cell.rjust(w)
                for c, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
            for row in [head, *body]
        ),
    ]
    lines.insert(2, "-" * max(map(len, lines[1:])))
    return "\n".join(lines)


def _pm(mean: float, high: float) -> str:
    """`mean +- half-width` in %, or the mean alone where the interval is NaN (n = 1)."""
    if math.isnan(high):
        return f"{100 * mean:.1f}"
    return f"{100 * mean:.1f} +- {100 * (high - mean):.1f}"
