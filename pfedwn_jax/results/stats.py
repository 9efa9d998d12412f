"""Statistics over seeds: the Student-t interval of a mean (`scipy.stats.t`, imported on
first use), for the sweep's summaries and plots."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import numpy.typing as npt

from pfedwn_jax._checks import check_float, check_int

LEVEL = 0.95  # confidence level of every interval


@functools.cache
def _t_distribution() -> Any:
    """`scipy.stats.t`; imported on first use (scipy.stats takes about 0.5 s to import)."""
    from scipy import stats

    return stats.t


def student_t_ppf(p: float, df: int) -> float:
    """The `p` quantile of Student's t distribution with integer `df >= 1` degrees of freedom
    (`scipy.stats.t.ppf`, with both arguments checked: a `ValueError` names a bad one)."""
    p = check_float("p", p, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    df = check_int("df", df, 1)
    return float(_t_distribution().ppf(p, df))


def t_interval(mean: npt.ArrayLike, std: npt.ArrayLike, n: npt.ArrayLike, level: float = LEVEL):
    """(low, high) = mean -+ t_{(1+level)/2, n-1} std / sqrt(n), elementwise; NaN where n < 2."""
    mean, std, n = np.broadcast_arrays(*map(np.asarray, (mean, std, n)))
    df = np.where(n > 1, n - 1, np.nan)  # scipy's quantile is NaN for a NaN df
    half = _t_distribution().ppf(0.5 + level / 2, df) * std / np.sqrt(np.maximum(n, 1))
    return mean - half, mean + half


def mean_std_ci(values: Any, level: float = LEVEL) -> tuple[float, float, float, float]:
    """(mean, std, ci_low, ci_high) of `values [n]` over seeds.

    std has ddof=1 (0 for n = 1); the interval is Student-t, mean -+ t_{(1+level)/2, n-1}
    std / sqrt(n), with NaN bounds for n = 1. NaN in `values` gives NaN (never dropped).
    """
    x = np.asarray(values, dtype=float).ravel()
    if x.size == 0:
        raise ValueError("mean_std_ci needs at least one value; got none")
    level = check_float("level", level, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    std = float(np.std(x, ddof=1)) if x.size > 1 else 0.0
    lo, hi = t_interval(np.mean(x), std, x.size, level)
    return float(np.mean(x)), std, float(lo), float(hi)
