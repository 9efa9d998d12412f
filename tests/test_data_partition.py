"""Partitions: exact covers, reproducible, minimum sizes, skew vs alpha, scipy references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from pfedwn_jax.data import SCHEMES, label_counts, label_skew, partition

# 10 classes with unequal sizes, in a shuffled order (labels are not sorted in real data).
LABELS = np.random.default_rng(123).permutation(np.repeat(np.arange(10), np.arange(60, 160, 10)))


def assert_exact_cover(parts, n):
    flat = np.concatenate(parts)
    assert flat.size == n, "samples lost or duplicated"
    np.testing.assert_array_equal(np.sort(flat), np.arange(n))


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("num_clients", [1, 3, 11, 40])
def test_exact_cover_and_reproducible(scheme, num_clients):
    k = max(3, -(-10 // num_clients))  # enough classes per client to cover all 10
    kw = dict(seed=7, alpha=0.1, min_samples=5, classes_per_client=k)
    parts = partition(LABELS, num_clients, scheme, **kw)
    assert len(parts) == num_clients
    assert_exact_cover(parts, LABELS.size)
    again = partition(LABELS, num_clients, scheme, **kw)
    for a, b in zip(parts, again):
        np.testing.assert_array_equal(a, b)
    if num_clients > 1 and scheme != "iid":
        other = partition(LABELS, num_clients, scheme, **{**kw, "seed": 8})
        assert any(not np.array_equal(a, b) for a, b in zip(parts, other))


@pytest.mark.parametrize("scheme", ["paper", "dirichlet"])
@pytest.mark.parametrize("alpha", [0.01, 0.1])
def test_minimum_size_is_guaranteed_with_many_clients(scheme, alpha):
    # 60 clients at alpha 0.01: rejection sampling would essentially never succeed here.
    labels = np.random.default_rng(0).integers(0, 10, size=5000)
    parts = partition(labels, 60, scheme, seed=0, alpha=alpha, min_samples=15)
    sizes = np.array([p.size for p in parts])
    assert sizes.min() >= 15
    assert sizes.max() > 3 * sizes.min()  # unbalanced, as intended
    assert_exact_cover(parts, labels.size)


def test_iid_and_pathological_structure():
    sizes = [p.size for p in partition(LABELS, 7, "iid", seed=1)]
    assert max(sizes) - min(sizes) <= 1
    parts = partition(LABELS, 11, "pathological", seed=1, classes_per_client=2, min_samples=1)
    counts = label_counts(LABELS, parts, 10)
    assert ((counts > 0).sum(1) == 2).all()  # exactly k classes each
    for k in range(10):  # a class is split evenly among its holders
        held = counts[:, k][counts[:, k] > 0]
        assert held.max() - held.min() <= 1


def test_skew_falls_as_alpha_rises():
    for scheme in ("dirichlet", "paper"):
        skews = [
            np.mean(
                [
                    label_skew(
                        label_counts(
                            LABELS,
                            partition(LABELS, 10, scheme, seed=s, alpha=a, min_samples=2),
                            10,
                        )
                    )
                    for s in range(6)
                ]
            )
            for a in (0.03, 0.3, 3.0, 300.0)
        ]
        assert all(np.diff(skews) < 0), (scheme, skews)
    # Large alpha with the dirichlet scheme approaches IID: skew near the iid scheme's.
    iid = label_skew(label_counts(LABELS, partition(LABELS, 10, "iid", seed=0), 10))
    big = label_skew(
        label_counts(LABELS, partition(LABELS, 10, "dirichlet", seed=0, alpha=1e4), 10)
    )
    assert big < 2 * iid + 0.02


def test_dirichlet_shares_follow_beta_distribution():
    # With 2 clients and no minimum, client 0's share of each class is Beta(alpha, alpha)
    # (plus small multinomial noise): compare with scipy's Beta by a KS test.
    labels = np.repeat(np.arange(10), 2000)
    alpha = 0.5
    shares = []
    for seed in range(40):
        parts = partition(labels, 2, "dirichlet", seed=seed, alpha=alpha, min_samples=0)
        shares.extend(label_counts(labels, parts, 10)[0] / 2000)
    assert stats.kstest(shares, stats.beta(alpha, alpha).cdf).pvalue > 1e-3


def test_paper_scheme_draws_uniform_number_of_classes():
    # alpha huge -> every holder of a class gets a share; many clients -> orphan classes are
    # rare; the distinct classes per client are then ~ U{1..10}: chi-square against it.
    labels = np.repeat(np.arange(10), 3000)
    num = []
    for seed in range(3):
        parts = partition(labels, 200, "paper", seed=seed, alpha=1e4, min_samples=0)
        num.extend((label_counts(labels, parts, 10) > 0).sum(1))
    observed = np.bincount(num, minlength=11)[1:]
    assert observed.sum() == 600
    assert stats.chisquare(observed).pvalue > 1e-3


def test_paper_scheme_gives_orphan_classes_a_holder():
    # 2 clients and 100 classes: many classes are drawn by nobody; all samples still land.
    labels = np.repeat(np.arange(100), 5)
    parts = partition(labels, 2, "paper", seed=3, alpha=0.1, min_samples=1)
    assert_exact_cover(parts, labels.size)


def test_minimum_when_a_clients_classes_run_out():
    # Class 0 has 3 samples: clients holding only class 0 must also take class 1.
    labels = np.array([0] * 3 + [1] * 100)
    for seed in range(5):
        parts = partition(labels, 20, "paper", seed=seed, alpha=0.1, min_samples=5)
        assert_exact_cover(parts, labels.size)
        assert min(p.size for p in parts) >= 5


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(scheme="nope"), "scheme"),
        (dict(alpha=0.0), "alpha"),
        (dict(alpha=-1.0), "alpha"),
        (dict(alpha=float("nan")), "alpha"),
        (dict(num_clients=10_000), "exceeds"),
        (dict(num_clients=0), "num_clients"),
        (dict(min_samples=200), "min_samples"),
        (dict(scheme="pathological", classes_per_client=1, num_clients=5), "every class"),
        (dict(scheme="pathological", classes_per_client=11), "classes_per_client"),
        (dict(seed=-1), "seed"),
        (dict(seed=1.5), "seed"),
    ],
)
def test_bad_input_raises_value_error(kwargs, match):
    args = dict(labels=LABELS, num_clients=11, scheme="paper", seed=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        partition(args.pop("labels"), args.pop("num_clients"), args.pop("scheme"), **args)


@pytest.mark.parametrize("labels", [np.array([[0, 1]]), np.array([0.5, 1.0]), np.array([-1, 2])])
def test_bad_labels(labels):
    with pytest.raises(ValueError, match="labels"):
        partition(labels, 1, "iid", seed=0, min_samples=0)


def test_label_skew_hand_computed():
    # pool distribution (0.5, 0.5); client 0 = (1, 0) -> TV 0.5; client 1 = (0, 1) -> 0.5.
    assert label_skew(np.array([[4, 0], [0, 4]])) == pytest.approx(0.5)
    assert label_skew(np.array([[2, 2], [3, 3]])) == pytest.approx(0.0)


@settings(max_examples=40, deadline=None)
@given(
    scheme=st.sampled_from(SCHEMES),
    num_clients=st.integers(1, 30),
    num_classes=st.integers(2, 12),
    extra_classes=st.integers(0, 3),
    n=st.integers(60, 400),
    alpha=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**31),
)
def test_property_exact_cover_and_minimum(
    scheme, num_clients, num_classes, extra_classes, n, alpha, seed
):
    """Any sizes, schemes and seeds (also classes no sample has): every index in exactly one
    client, sorted parts, the minimum kept, and label counts that add up to the pool's."""
    labels = np.random.default_rng(seed).integers(0, num_classes, size=n)
    total = num_classes + extra_classes
    # pathological only checks the minimum (an uneven class may leave a holder tiny).
    min_samples = 0 if scheme == "pathological" else min(2, n // num_clients)
    k = -(-total // num_clients)  # enough classes per client to cover all
    parts = partition(
        labels,
        num_clients,
        scheme,
        seed=seed,
        alpha=alpha,
        min_samples=min_samples,
        classes_per_client=min(k, total),
        num_classes=total,
    )
    assert_exact_cover(parts, n)
    assert min(p.size for p in parts) >= min_samples
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)
    counts = label_counts(labels, parts, total)
    np.testing.assert_array_equal(counts.sum(0), np.bincount(labels, minlength=total))
    np.testing.assert_array_equal(counts.sum(1), [p.size for p in parts])
