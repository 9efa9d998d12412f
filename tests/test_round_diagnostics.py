"""The per-round diagnostics every round computes on the device: the consensus distance (every
method) and the spectral gap of the round's mixing weights (the methods that declare them)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY_RUN

import pfedwn_jax
from pfedwn_jax.algorithms import available_algorithms, get_algorithm, neighbor_lists
from pfedwn_jax.engine.gossip import metropolis_weights, spectral_gap
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.results.metrics import SlotView, slot_metrics

# two components {0, 1, 2} and {3, 4, 5}; 2 hears 0 one way; 2 and 3 are on each other's
# lists but the 2 -> 3 and 3 -> 2 entries are not listed this round (they must not join them)
ADJ = np.eye(6, dtype=bool)
EDGES = [(0, 1), (1, 0), (1, 2), (2, 1), (2, 0), (3, 4), (4, 3), (4, 5), (5, 4), (2, 3), (3, 2)]
ADJ[tuple(zip(*EDGES, strict=True))] = True
COMPONENTS = [[0, 1, 2], [3, 4, 5]]


def lists() -> tuple[np.ndarray, np.ndarray]:
    nbr, mask = neighbor_lists(ADJ)
    listed = np.array(mask)
    listed[2, list(nbr[2]).index(3)] = listed[3, list(nbr[3]).index(2)] = False
    return np.asarray(nbr), listed


def view(params, mixing=None) -> SlotView:
    nbr, listed = lists()
    s = len(ADJ)
    test = {"accuracy": jnp.zeros(s), "loss": jnp.zeros(s)}
    return SlotView(params, test, None, {}, s, jnp.asarray(nbr), jnp.asarray(listed), mixing)


def test_consensus_deviation_matches_numpy_within_each_component():
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(6, 3, 2)), "b": rng.normal(size=(6, 4))}
    flat = np.concatenate([params["w"].reshape(6, -1), params["b"]], axis=1)
    want = np.zeros(6)
    for comp in COMPONENTS:
        want[comp] = ((flat[comp] - flat[comp].mean(axis=0)) ** 2).sum(axis=1)
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    got = jax.jit(lambda p: slot_metrics(view(p)))(params)
    np.testing.assert_allclose(got["consensus_deviation"], want, rtol=1e-5)
    assert "mixing_gap" not in got  # no mixing weights: absent, not zero
    # without lists (no network) the slots are one component
    alone = SlotView(params, view(params).test, None, {}, 6)
    everyone = ((flat - flat.mean(axis=0)) ** 2).sum(axis=1)
    np.testing.assert_allclose(slot_metrics(alone)["consensus_deviation"], everyone, rtol=1e-5)


def test_spectral_gap_metric_matches_the_dense_matrix():
    nbr, listed = lists()
    w = metropolis_weights(nbr, listed)
    dense = np.zeros((6, 6))
    for i in range(6):
        for k in range(nbr.shape[1]):
            dense[i, nbr[i, k]] += float(w[i, k])
    centre = np.eye(6) - np.full((6, 6), 1 / 6)
    want = 1 - np.linalg.svd(centre @ dense @ centre, compute_uv=False)[0]
    params = {"w": jnp.zeros((6, 2))}
    got = slot_metrics(view(params, w))["mixing_gap"]
    np.testing.assert_allclose(got, np.full(6, want), atol=1e-5)
    # two components: the round cannot bring them together (with the one-way link W is not
    # doubly stochastic and the norm may exceed 1)
    assert want <= 1e-6


GOSSIP = {"dpsgd", "pushsum", "dfedavgm", "choco", "cfa"}


@pytest.mark.parametrize(
    "names",
    [("fedavg",), pytest.param(None, marks=pytest.mark.slow, id="all")],
    ids=["fedavg", "all"],
)
def test_every_method_reports_consensus_and_only_gossip_methods_a_spectral_gap(names):
    names = available_algorithms() if names is None else names
    config = ExperimentConfig(**{**TINY_RUN, "rounds": 1}, algorithms=names, mode="network")
    res = pfedwn_jax.run(config, progress=False)
    for name in names:
        out = res.methods[name]
        assert len(out["consensus_distance"]) == 1 and np.isfinite(out["consensus_distance"]).all()
        gossips = get_algorithm(name).mixing_weights is not None
        assert gossips == (name in GOSSIP)
        assert ("spectral_gap" in out) == gossips
        if gossips:
            assert out["spectral_gap"][0] <= 1 + 1e-6


@pytest.mark.parametrize("dense_limit", [None, 2])  # the dense SVD and the power iteration
def test_spectral_gap_leaves_out_padded_slots(dense_limit):
    """A sweep's padded slots (linked to no one) leave the gap of the real slots as it is."""
    ring = np.eye(4, dtype=bool) | np.roll(np.eye(4, dtype=bool), 1, axis=1)
    ring |= ring.T
    padded = np.eye(6, dtype=bool)
    padded[:4, :4] = ring
    gaps = []
    for adj, active in [(ring, None), (padded, np.arange(6) < 4)]:
        nbr, mask = neighbor_lists(adj)
        w = metropolis_weights(nbr, mask)
        gaps.append(float(spectral_gap(nbr, w, dense_limit=dense_limit, active=active)))
    np.testing.assert_allclose(gaps[1], gaps[0], atol=1e-4)
    assert gaps[0] > 0.1
