"""Paired comparisons of two methods' accuracies with test-set sampling, and Holm's correction.

Every seed of a comparison trains both methods and tests them on the same fixed test set, so
the seed-to-seed spread of the paired differences carries training randomness but not
test-set sampling: a different test set of the same size would move both methods' accuracy,
and that error is common to every seed. `paired_bootstrap` adds it:

    d*_b = mean_{s in S*_b} (a_s - b_s) + (e*_a - e*_b),
    S*_b: the seeds resampled with replacement (the pairs kept together),
    e*_m = Binomial(n_test, p_m) / n_test - p_m,  p_m = (k_m + 1/2) / (n_test + 1),

with `k_m = n_test * mean_s m_s` the method's mean count of correct test samples. The
interval is the percentile interval of `d*`, and the two-sided p-value the level at which it
just touches 0 (`2 min(P(d* <= 0), P(d* >= 0))`), so "0 outside the 95% interval" and
"p < 0.05" are the same statement.

Approximations, stated: the runner records each target's test accuracy, not which test
samples each model got right, so the test-set term treats the two methods' errors as
independent binomials (on one test set they are positively correlated, so this is wider than
a McNemar-type paired test would be: conservative); an accuracy that is a mean over the last
rounds is treated as a proportion of `n_test` samples. The `+1/2` keeps an accuracy of 0 or
100% from giving a zero-width term: no interval here has zero width unless `n_test` is
infinite and every seed's difference is equal, and a caller must never read such an
interval as certain (`is_separated` says no).

With few seeds (3 to 5) the percentile bootstrap over seeds under-covers (3 seeds give 10
distinct resamples and a spread `(n - 1) / n` of the sample's), so the tables use
`paired_t`: the same two sources of error added as variances,

    diff +- t_{df} sqrt(s^2 / n + v),  v = p_a (1 - p_a) / n_test + p_b (1 - p_b) / n_test,

(`s` the seeds' standard deviation of the differences, `p_m` as above), with Welch-
Satterthwaite's `df = (s^2/n + v)^2 / ((s^2/n)^2 / (n - 1))` (the test term's own degrees of
freedom are those of a binomial on `n_test` samples: taken as infinite). With `n_test`
infinite it is the paired Student-t test (`scipy.stats.ttest_rel`); with every seed's
difference equal, the two-proportion z test.

`holm` adjusts a family of p-values (Holm 1979, step-down, controls the family-wise error
rate under any dependence).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from pfedwn_jax._checks import check_float, check_int

#: Bootstrap draws (the p-value's resolution is 1 / DRAWS).
DRAWS = 20_000
#: Confidence level of every interval.
LEVEL = 0.95


def paired_bootstrap(
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    n_test: float,
    *,
    level: float = LEVEL,
    draws: int = DRAWS,
    seed: int = 0,
) -> dict[str, Any]:
    """The paired difference ``a - b`` (fractions in ``[0, 1]``, one per seed) with an
    interval over seeds and test-set sampling (see the module docstring).

    Args:
      a, b: ``[n]`` accuracies of the two methods, seed by seed (same order).
      n_test: test samples (``np.inf``: no test-set term, seeds only).
      level: confidence level. draws: bootstrap draws. seed: the bootstrap's RNG seed.

    Returns: ``{"n", "diff", "low", "high", "p", "n_test"}`` (fractions, like the inputs).
    """
    x, y = _checked(a, b)
    level = check_float("level", level, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    draws = check_int("draws", draws, 100)
    n_test = _checked_n(n_test)
    rng = np.random.default_rng(seed)
    d = x - y
    idx = rng.integers(0, d.size, size=(draws, d.size))
    boot = d[idx].mean(axis=1)
    if np.isfinite(n_test):
        boot = (
            boot
            + _test_term(rng, x.mean(), n_test, draws)
            - _test_term(rng, y.mean(), n_test, draws)
        )
    lo, hi = np.clip(np.quantile(boot, [(1 - level) / 2, (1 + level) / 2]), -1.0, 1.0)
    p = min(1.0, 2.0 * min(np.mean(boot <= 0), np.mean(boot >= 0)))
    return {"n": int(d.size), "diff": float(d.mean()), "low": float(lo), "high": float(hi),
            "p": float(p), "n_test": n_test}  # fmt: skip


def paired_t(
    a: npt.ArrayLike, b: npt.ArrayLike, n_test: float, *, level: float = LEVEL
) -> dict[str, Any]:
    """The paired difference ``a - b`` (fractions, one per seed) with a Student-t interval
    whose variance adds the test set's binomial term (see the module docstring).

    Returns: ``{"n", "diff", "low", "high", "p", "n_test", "df"}``; NaN bounds and p for one
    seed without a test-set term.
    """
    x, y = _checked(a, b)
    level = check_float("level", level, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    n_test = _checked_n(n_test)
    d, n = x - y, x.size
    seeds = float(np.var(d, ddof=1)) / n if n > 1 else np.nan
    test = 0.0
    if np.isfinite(n_test):
        k = round(n_test)
        pa, pb = ((m.mean() * k + 0.5) / (k + 1) for m in (x, y))
        test = (pa * (1 - pa) + pb * (1 - pb)) / k
    if n == 1:
        seeds, df = 0.0, np.inf
    else:
        df = np.inf if seeds == 0 else (seeds + test) ** 2 / (seeds**2 / (n - 1))
    se = np.sqrt(seeds + test)
    if n == 1 and test == 0:
        lo = hi = p = np.nan
    elif se == 0:
        lo = hi = float(d.mean())
        p = 1.0 if d.mean() == 0 else 0.0
    else:
        t = _stats().t
        half = t.ppf(0.5 + level / 2, df) * se
        lo, hi = d.mean() - half, d.mean() + half
        p = 2 * t.sf(abs(d.mean()) / se, df)
    return {"n": int(n), "diff": float(d.mean()), "low": float(max(lo, -1.0)),
            "high": float(min(hi, 1.0)), "p": float(p), "n_test": n_test,
            "df": float(df)}  # fmt: skip


def _stats() -> Any:
    from scipy import stats

    return stats


def _checked(a: npt.ArrayLike, b: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"a and b must be equal-length, non-empty; got {x.size} and {y.size}")
    if not (np.all((x >= 0) & (x <= 1)) and np.all((y >= 0) & (y <= 1))):
        raise ValueError("a and b must be accuracies in [0, 1]")
    return x, y


def _checked_n(n_test: Any) -> float:
    if not (isinstance(n_test, int | float) and n_test >= 1):  # np.inf allowed
        raise ValueError(f"n_test must be a number >= 1 (np.inf: seeds only); got {n_test!r}")
    return float(n_test)


def _test_term(rng: np.random.Generator, acc: float, n: float, draws: int) -> np.ndarray:
    """``[draws]`` test-set sampling errors of an accuracy ``acc`` on ``n`` samples."""
    k = round(n)
    p = (acc * k + 0.5) / (k + 1)
    return rng.binomial(k, p, size=draws) / k - p


def holm(pvalues: Sequence[float] | npt.ArrayLike) -> np.ndarray:
    """Holm's step-down adjusted p-values of one family (same order as given): sort
    ascending, ``p_(i) * (m - i)`` (``i`` from 0), running maximum, capped at 1. Reject at
    family-wise level ``alpha`` where the adjusted value is ``<= alpha``."""
    p = np.asarray(pvalues, np.float64).ravel()
    if np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"p-values must be in [0, 1]; got {p.tolist()}")
    m = p.size
    order = np.argsort(p, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    out = np.empty(m)
    out[order] = adj
    return out


def is_separated(result: dict[str, Any], p_adjusted: float, alpha: float = 1 - LEVEL) -> bool:
    """Whether a comparison reads "ahead" or "behind": the adjusted p-value is at most
    ``alpha`` and the interval has positive width (a zero-width interval is never certain)."""
    return bool(p_adjusted <= alpha and result["high"] > result["low"])
