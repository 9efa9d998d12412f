"""Paired comparisons with test-set sampling, and Holm's correction, against hand computations
and scipy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from pfedwn_jax.results.paired import holm, is_separated, paired_bootstrap, paired_t


def test_holm_matches_a_hand_computation():
    # sorted 0.01, 0.02, 0.03, 0.5 -> 0.04, 0.06, 0.06 (running max of 0.06), 0.5
    p = [0.03, 0.01, 0.5, 0.02]
    np.testing.assert_allclose(holm(p), [0.06, 0.04, 0.5, 0.06])
    np.testing.assert_allclose(holm([0.9, 0.8]), [1.0, 1.0])  # capped at 1
    assert holm([]).size == 0
    with pytest.raises(ValueError, match="p-values"):
        holm([0.1, 1.5])


def test_seeds_only_equals_scipys_percentile_bootstrap():
    rng = np.random.default_rng(1)
    a = 0.9 + 0.01 * rng.standard_normal(8)
    b = a - 0.004 + 0.003 * rng.standard_normal(8)
    mine = paired_bootstrap(a, b, np.inf, draws=40_000)
    ref = stats.bootstrap(
        (a - b,), np.mean, method="percentile", n_resamples=40_000, random_state=2
    ).confidence_interval
    assert mine["diff"] == pytest.approx(np.mean(a - b))
    assert mine["low"] == pytest.approx(ref.low, abs=4e-4)
    assert mine["high"] == pytest.approx(ref.high, abs=4e-4)


def test_equal_seeds_leave_the_binomial_test_term_alone():
    # every seed's difference is the same: only test-set sampling is left, whose interval is
    # the normal one of two independent binomial proportions (n = 2000, by the CLT)
    n, pa, pb = 2000, 0.95, 0.93
    r = paired_bootstrap([pa] * 5, [pb] * 5, n, draws=100_000)
    sd = np.sqrt(pa * (1 - pa) / n + pb * (1 - pb) / n)
    z = stats.norm.ppf(0.975)
    assert r["low"] == pytest.approx(pa - pb - z * sd, abs=1.5e-3)
    assert r["high"] == pytest.approx(pa - pb + z * sd, abs=1.5e-3)
    assert r["p"] == pytest.approx(2 * stats.norm.sf((pa - pb) / sd), abs=2e-3)


def test_the_test_set_widens_what_seeds_alone_say():
    # a 266-sample test set, differences of 1-2 samples: seeds alone separate, with the
    # test set no longer
    a = np.array([0.985, 0.989, 0.985, 0.989, 0.985])
    b = a - np.array([2, 1, 2, 2, 1]) / 266
    seeds_only = paired_bootstrap(a, b, np.inf)
    both = paired_bootstrap(a, b, 266)
    assert seeds_only["low"] > 0 and seeds_only["p"] < 0.05
    assert both["low"] < 0 < both["high"] and both["p"] > 0.05


def test_a_zero_width_interval_is_never_separated():
    r = paired_bootstrap([1.0, 1.0, 1.0], [0.99, 0.99, 0.99], np.inf)
    assert r["low"] == r["high"]
    assert not is_separated(r, 0.0)
    # with a finite test set, 100% accuracy still has sampling error (the +1/2 correction)
    r = paired_bootstrap([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], 300)
    assert r["high"] > r["low"] and r["p"] == 1.0 and not is_separated(r, 1.0)


def test_bad_input_names_the_value():
    with pytest.raises(ValueError, match="equal-length"):
        paired_bootstrap([0.5], [0.5, 0.6], 10)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        paired_bootstrap([50.0], [60.0], 10)
    with pytest.raises(ValueError, match="n_test"):
        paired_bootstrap([0.5], [0.6], 0)


def test_paired_t_without_a_test_set_is_scipys_paired_t_test():
    rng = np.random.default_rng(3)
    a = 0.9 + 0.01 * rng.standard_normal(5)
    b = a - 0.004 + 0.003 * rng.standard_normal(5)
    r = paired_t(a, b, np.inf)
    ref = stats.ttest_rel(a, b)
    ci = ref.confidence_interval(0.95)
    assert r["p"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert (r["low"], r["high"]) == pytest.approx((ci.low, ci.high), rel=1e-9)


def test_paired_t_adds_the_binomial_variance_by_hand():
    a, b, n = np.array([0.95, 0.96, 0.97]), np.array([0.94, 0.94, 0.95]), 400
    r = paired_t(a, b, n)
    d = a - b
    s2 = d.var(ddof=1) / 3
    pa, pb = (0.96 * 400 + 0.5) / 401, (0.94333333333 * 400 + 0.5) / 401
    v = (pa * (1 - pa) + pb * (1 - pb)) / 400
    df = (s2 + v) ** 2 / (s2**2 / 2)
    half = stats.t.ppf(0.975, df) * np.sqrt(s2 + v)
    assert r["df"] == pytest.approx(df, rel=1e-6)
    assert (r["low"], r["high"]) == pytest.approx((d.mean() - half, d.mean() + half), rel=1e-6)
    assert r["p"] == pytest.approx(2 * stats.t.sf(d.mean() / np.sqrt(s2 + v), df), rel=1e-6)
    # equal differences: the two-proportion z test
    z = paired_t([0.95] * 4, [0.93] * 4, 2000)
    sd = np.sqrt(
        sum((p * 2000 + 0.5) / 2001 * (1 - (p * 2000 + 0.5) / 2001) for p in (0.95, 0.93)) / 2000
    )
    assert z["p"] == pytest.approx(2 * stats.norm.sf(0.02 / sd), rel=1e-6)


def test_paired_t_zero_width_is_never_separated():
    r = paired_t([1.0, 1.0, 1.0], [0.99, 0.99, 0.99], np.inf)
    assert r["low"] == r["high"] and not is_separated(r, r["p"])
    one = paired_t([0.9], [0.8], np.inf)
    assert np.isnan(one["p"]) and np.isnan(one["low"])
