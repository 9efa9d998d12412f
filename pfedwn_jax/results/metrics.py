"""Per-round metrics: one registry that `Result`, `SweepResult`, their files and the writers read.

A metric is a function of a run's per-slot results of some rounds (`Rounds`: test accuracy
and loss of every slot, validation accuracy, the records, which slots are targets) returning
one number per round. The driver computes every registered metric for every run, method and
round on the host, so adding one is one `register_metric` call:

    from pfedwn_jax.results import register_metric

    register_metric("worst_target_accuracy",
                    lambda r: np.where(r.is_target, r.accuracy, np.inf).min(axis=1))

and it appears as a column of `SweepResult.rows` (and `rows.csv`), as a per-round list in
`Result.methods[name]` and in the metric writers.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np


class Rounds(NamedTuple):
    """`n` rounds of one run and method on the host.

    Attributes:
      accuracy: `[n, S]` test accuracy of every slot.
      loss: `[n, S]` test loss.
      val_accuracy: `[n, S]` validation accuracy, or None (no validation split).
      is_target: `[S]` bool, the slots reported as targets.
      records: `key -> [n, ...]` the records kept (pFedWN's `pi [n, S, K]`, ...).
    """

    accuracy: np.ndarray
    loss: np.ndarray
    val_accuracy: np.ndarray | None
    is_target: np.ndarray
    records: Mapping[str, np.ndarray]


QUANTILES = (10, 50, 90)  # percent: the client-accuracy quantiles kept every round
STATS = ("mean", *(f"q{q}" for q in QUANTILES))


def accuracy_stats(acc: np.ndarray) -> dict[str, list[float]]:
    """`acc [R, S]` -> `{"mean", "q10", "q50", "q90"}: [R]` over the slots (NaN ignored)."""
    acc = np.atleast_2d(np.asarray(acc, np.float64))
    if acc.size == 0:
        return {k: [] for k in STATS}
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a round with every slot NaN
        quant = np.nanpercentile(acc, QUANTILES, axis=1)
        mean = np.nanmean(acc, axis=1)
    return {"mean": mean.tolist(), **{f"q{q}": quant[i].tolist() for i, q in enumerate(QUANTILES)}}


RoundMetric = Callable[[Rounds], np.ndarray | None]
_METRICS: dict[str, RoundMetric] = {}


def register_metric(name: str, fn: RoundMetric) -> None:
    """Add per-round metric `name`: `fn(Rounds) -> [n]` floats, or None where it does not
    apply to a run (a table then holds NaN there); replaces a metric of that name."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"metric name must be an identifier string; got {name!r}")
    if not callable(fn):
        raise ValueError(f"metric {name!r}: fn must be callable; got {fn!r}")
    _METRICS[name] = fn


def unregister_metric(name: str) -> None:
    """Remove metric `name` (a ValueError if it is not registered)."""
    if name not in _METRICS:
        raise ValueError(f"metric {name!r} is not registered; registered: {list(_METRICS)}")
    del _METRICS[name]


def metric_names() -> tuple[str, ...]:
    """The registered metrics, in registration order."""
    return tuple(_METRICS)


def compute(rounds: Rounds) -> dict[str, np.ndarray]:
    """Every registered metric that applies to `rounds`: `name -> [n]` float64."""
    n = rounds.accuracy.shape[0]
    out = {}
    for name, fn in _METRICS.items():
        value = fn(rounds)
        if value is None:
            continue
        value = np.asarray(value, np.float64)
        if value.shape != (n,):
            raise ValueError(
                f"metric {name!r} must give one number per round ({n}); got shape {value.shape}"
            )
        out[name] = value
    return out


def _target_mean(values: np.ndarray, is_target: np.ndarray) -> np.ndarray:
    """`[n]` mean of `values [n, S]` over the target slots."""
    return values[:, is_target].mean(axis=1) if is_target.any() else np.full(len(values), np.nan)


register_metric("target_accuracy", lambda r: _target_mean(r.accuracy, r.is_target))
register_metric("target_loss", lambda r: _target_mean(r.loss, r.is_target))
register_metric("mean_client_accuracy", lambda r: r.accuracy.mean(axis=1))
register_metric(
    "target_val_accuracy",
    lambda r: None if r.val_accuracy is None else _target_mean(r.val_accuracy, r.is_target),
)
