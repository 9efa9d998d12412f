"""The cases' similarity criterion (`reproduce.cases`, criterion="similarity").

Overlaps are recomputed here as `1 - TV` (half the L1 distance of the label distributions), a
different formula than the module's `sum min`; the selection counts come from the runner's
own federation, and "first in search order" from a per-target loop over that federation.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import shared_data_file

from pfedwn_jax.experiment import ExperimentConfig, build_federation
from pfedwn_jax.reproduce.cases import (
    DIFFERENT,
    MIN_TARGET_SAMPLES,
    SIMILAR,
    case_rows,
    config_label_counts,
    label_overlap,
    meets_criterion,
    paper_cases,
)


def _one_minus_tv(counts: np.ndarray, target: int, others) -> np.ndarray:
    p = counts / counts.sum(1, keepdims=True)
    return 1.0 - 0.5 * np.abs(p[list(others)] - p[target]).sum(1)


def test_label_overlap_by_hand():
    counts = [[10, 0, 0], [5, 5, 0], [0, 0, 7], [0, 0, 0], [1, 2, 1]]
    got = label_overlap(counts)
    assert got.shape == (5, 5)
    assert got[0, 1] == pytest.approx(0.5)  # min(1, .5) + min(0, .5)
    assert got[0, 2] == 0.0 and got[1, 1] == pytest.approx(1.0)
    assert got[1, 4] == pytest.approx(0.25 + 0.5)  # min(.5, .25) + min(.5, .5) + min(0, .25)
    assert np.all(got[3] == 0) and np.all(got[:, 3] == 0)  # a client without samples
    np.testing.assert_allclose(got, got.T)
    with pytest.raises(ValueError, match="counts"):
        label_overlap([[1, -1]])


@pytest.mark.parametrize(
    ("overlaps", "want"),
    [
        ([SIMILAR, DIFFERENT], True),  # both thresholds inclusive
        ([0.9, 0.3, 0.0], True),
        ([0.9, 0.3], False),  # none different
        ([0.35, 0.0, 0.01], False),  # none similar
        ([0.9], False),  # one neighbor cannot be both
    ],
)
def test_meets_criterion(overlaps, want):
    assert meets_criterion(overlaps) is want


@pytest.fixture(scope="module")
def quick_mnist() -> tuple[ExperimentConfig, np.ndarray]:
    """The quick preset's MNIST data (real images, at most 300 per client) and its counts."""
    config = ExperimentConfig(
        dataset=f"npz:{shared_data_file('mnist_10k_2k.npz')}",
        max_samples_per_client=300,
        data_seed=0,
        val_fraction=0.2,
    )
    return config, config_label_counts(config)


def test_similarity_cases_keep_4_3_2_and_meet_the_criterion(quick_mnist):
    config, counts = quick_mnist
    cases = paper_cases(config, criterion="similarity")  # loads the counts itself
    assert [c.num_selected for c in cases] == [4, 3, 2]
    assert len({c.target for c in cases}) == 3  # three different targets
    one_network = len({c.topology_seed for c in cases}) == 1
    assert all(c.shared == one_network for c in cases)
    for case in cases:
        assert case.criterion == "similarity"
        assert counts[case.target].sum() >= MIN_TARGET_SAMPLES
        fed = build_federation(case.config(config))  # the run's own federation
        assert tuple(fed.data_client[1:]) == case.selected_clients
        sim = _one_minus_tv(counts, case.target, case.selected_clients)
        np.testing.assert_allclose(case.similarity, sim, atol=1e-12)
        assert sim.max() >= SIMILAR and sim.min() <= DIFFERENT, (case.name, sim)
    rows = case_rows(cases, counts)
    assert [r["case"] for r in rows] == ["Case 1", "Case 2", "Case 3"]
    for row, case in zip(rows, cases, strict=True):
        assert row["neighbors"] == list(case.selected_clients) and row["meets"]
        assert row["criterion"] == "similarity" and row["topology_seed"] == case.topology_seed
        assert row["target_samples"] == counts[case.target].sum()
        np.testing.assert_allclose(row["similarity"], case.similarity)
        assert "similar" in row["role"] and "different" in row["role"]


def test_similarity_targets_are_the_first_that_qualify(quick_mnist):
    """On the chosen network, a loop over every target (the run's federation each time): the
    search's targets are the first distinct ones in data-client order that qualify."""
    config, counts = quick_mnist
    cases = paper_cases(config, criterion="similarity", label_counts=counts)
    fits = []
    for case in cases:
        ok = []
        for t in range(config.num_clients):
            fed = build_federation(case.config(config).replace(target=t))
            sim = _one_minus_tv(counts, t, fed.data_client[1:])
            big = counts[t].sum() >= MIN_TARGET_SAMPLES
            if big and sim.max() >= SIMILAR and sim.min() <= DIFFERENT:
                ok.append(t)
        fits.append(ok)
    first = next(
        p
        for p in ((a, b, c) for a in fits[0] for b in fits[1] for c in fits[2])
        if len(set(p)) == 3
    )
    assert tuple(c.target for c in cases) == first


def test_small_targets_are_not_cases(quick_mnist):
    """Without the size rule the search takes targets of fewer than 100 samples (the quick
    MNIST data has three such clients); with it, none."""
    config, counts = quick_mnist
    sizes = counts.sum(1)
    assert (sizes < MIN_TARGET_SAMPLES).any()
    loose = paper_cases(config, criterion="similarity", label_counts=counts, min_target_samples=0)
    assert min(sizes[c.target] for c in loose) < MIN_TARGET_SAMPLES
    strict = paper_cases(config, criterion="similarity", label_counts=counts)
    assert min(sizes[c.target] for c in strict) >= MIN_TARGET_SAMPLES
    with pytest.raises(ValueError, match="at least 301 samples"):
        paper_cases(config, criterion="similarity", label_counts=counts, min_target_samples=301)


def test_counts_cases_stay_available_and_may_miss_the_criterion(quick_mnist):
    config, counts = quick_mnist
    by_counts = paper_cases(config, label_counts=counts)  # criterion="counts", the default
    assert [c.target for c in by_counts] == [0, 1, 2]
    rows = case_rows(by_counts, counts)
    assert not all(r["meets"] for r in rows)  # why the criterion exists
    for row, case in zip(rows, by_counts, strict=True):
        sim = _one_minus_tv(counts, case.target, case.selected_clients)
        np.testing.assert_allclose(row["similarity"], sim, atol=1e-12)
        assert row["meets"] == (sim.max() >= SIMILAR and sim.min() <= DIFFERENT)


def test_similarity_errors_name_the_problem(quick_mnist):
    config, counts = quick_mnist
    with pytest.raises(ValueError, match=r"overlap >= 0.99"):
        paper_cases(config, criterion="similarity", label_counts=counts, similar=0.99)
    with pytest.raises(ValueError, match="chooses the targets"):
        paper_cases(config, criterion="similarity", label_counts=counts, targets=(0, 1, 2))
    with pytest.raises(ValueError, match="label_counts"):
        paper_cases(config, criterion="similarity", label_counts=counts[:5])
    with pytest.raises(ValueError, match="criterion"):
        paper_cases(config, criterion="labels")
