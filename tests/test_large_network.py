"""Network mode over candidate lists: equal to the dense model where both apply; scales."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pfedwn_jax import ExperimentConfig
from pfedwn_jax.algorithms import dense_adjacency
from pfedwn_jax.experiment.federation import (
    build_federation,
    channel_params,
    network_federation,
)

NET = dict(mode="network", model="logreg", gamma_th=2.0, eps=0.1)


@pytest.mark.parametrize("n", [10, 30])
def test_every_candidate_and_no_cutoff_is_the_dense_network(n):
    cfg = ExperimentConfig(**NET, num_neighbors=n, candidates=n)
    sparse, dense = build_federation(cfg), network_federation(cfg)
    np.testing.assert_array_equal(sparse.adjacency, dense.adjacency)
    np.testing.assert_array_equal(
        dense_adjacency(sparse.neighbor_lists, sparse.neighbor_mask, n + 1), dense.adjacency
    )
    # column 0 is the node itself; the rest its selected neighbors, increasing, then padding
    lists, mask = sparse.neighbor_lists, sparse.neighbor_mask
    np.testing.assert_array_equal(lists[:, 0], np.arange(n + 1))
    for i in range(n + 1):
        real = lists[i, 1:][mask[i, 1:]]
        np.testing.assert_array_equal(
            real, np.flatnonzero(dense.adjacency[i] & (np.arange(n + 1) != i))
        )
        assert not mask[i, 1 + len(real) :].any()


def test_fewer_candidates_select_a_subset_of_the_nearest():
    cfg = ExperimentConfig(**NET, num_neighbors=40, candidates=5)
    fed = build_federation(cfg)
    pos = fed.positions
    for i in range(len(pos)):
        d = np.linalg.norm(pos - pos[i], axis=1)
        d[i] = np.inf
        nearest = set(np.argsort(d, kind="stable")[:5])
        got = set(fed.neighbor_lists[i, 1:][fed.neighbor_mask[i, 1:]])
        assert got <= nearest
    assert fed.neighbor_lists.shape[1] <= 6


def test_node_density_sets_the_area():
    cfg = ExperimentConfig(**NET, num_neighbors=99, candidates=8, node_density=0.01)
    assert math.isclose(channel_params(cfg).area_m, 100.0)
    pos = build_federation(cfg).positions
    assert pos.max() <= 100.0 and pos.max() > 60.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(mode="single", candidates=3), "candidates applies to mode='network'"),
        (dict(candidates=0), "candidates"),
        (dict(candidates=11), "candidates"),
        (dict(interference_cutoff=-1.0), "interference_cutoff"),
        (dict(node_density=0.0), "node_density"),
        (dict(interference_tail="zero"), "interference_tail"),
        (dict(num_neighbors=20_000), "num_neighbors"),
    ],
)
def test_bad_large_network_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ExperimentConfig(**{**NET, "num_neighbors": 10, **kwargs})


def test_ten_thousand_nodes_with_candidates_and_cutoff_are_accepted():
    cfg = ExperimentConfig(**NET, num_neighbors=9_999, candidates=10, interference_cutoff=100.0)
    assert cfg.num_clients == 10_000


@pytest.mark.slow
def test_ten_thousand_node_federation_builds_without_dense_arrays():
    cfg = ExperimentConfig(
        **NET,
        num_neighbors=9_999,
        candidates=10,
        interference_cutoff=100.0,
        node_density=11 / 2500,
    )
    fed = build_federation(cfg)
    assert fed.adjacency is None
    assert fed.neighbor_lists.shape[0] == 10_000 and fed.neighbor_lists.shape[1] <= 11
    assert fed.perr.shape == (10_000, 10)
