"""The gossip pieces (`pfedwn_jax.engine.gossip`) against NumPy references written by hand."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pfedwn_jax.algorithms import neighbor_lists
from pfedwn_jax.engine import gossip, mix_sparse

# compiled once each: op-by-op dispatch of the small graph functions is what costs here
component_labels = jax.jit(gossip.component_labels)
consensus_contraction = jax.jit(gossip.consensus_contraction, static_argnames="dense_limit")
consensus_deviation = jax.jit(gossip.consensus_deviation)
consensus_distance = jax.jit(gossip.consensus_distance)
metropolis_weights = jax.jit(gossip.metropolis_weights)
mixing_matrix = jax.jit(gossip.mixing_matrix, static_argnums=2)
spectral_gap = jax.jit(gossip.spectral_gap)
symmetric_degree = jax.jit(gossip.symmetric_degree)
mix_sparse = jax.jit(mix_sparse)

# row i: whom i hears; 0 <-> 1 mutual, 2 hears 1 only, 3 hears 2, 4 alone, 5 <-> 6 mutual
DIRECTED = np.zeros((7, 7), bool)
for i, j in [(0, 1), (1, 0), (2, 1), (3, 2), (5, 6), (6, 5)]:
    DIRECTED[i, j] = True


def ring(n: int) -> np.ndarray:
    adj = np.zeros((n, n), bool)
    for i in range(n):
        adj[i, (i + 1) % n] = adj[i, (i - 1) % n] = True
    return adj


def mh_reference(adj: np.ndarray, delivered: np.ndarray | None = None) -> np.ndarray:
    """Dense MH weights, written from Xiao and Boyd 2004 on the symmetrized graph, then the
    row restricted to what i hears and delivered, renormalised."""
    n = adj.shape[0]
    sym = (adj | adj.T) & ~np.eye(n, dtype=bool)
    deg = sym.sum(1)
    w = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if sym[i, j]:
                w[i, j] = 1.0 / (1 + max(deg[i], deg[j]))
        w[i, i] = 1.0 - w[i].sum()
    usable = (adj | np.eye(n, dtype=bool)) if delivered is None else delivered
    usable = usable | np.eye(n, dtype=bool)
    w = np.where(usable, w, 0.0)
    return w / w.sum(1, keepdims=True)


def test_degree_and_mh_weights_on_a_directed_graph():
    nbr, mask = neighbor_lists(DIRECTED)
    sym = DIRECTED | DIRECTED.T
    np.testing.assert_array_equal(symmetric_degree(nbr, mask), sym.sum(1))
    w = metropolis_weights(nbr, mask)
    np.testing.assert_allclose(mixing_matrix(nbr, w), mh_reference(DIRECTED), rtol=1e-6)
    # 1 (degree 2) is heard by 2 but does not hear it: its row keeps self 1/3 and 0's 1/3,
    # renormalised
    np.testing.assert_allclose(mixing_matrix(nbr, w)[1], [0.5, 0.5, 0, 0, 0, 0, 0], 1e-6)
    assert float(mixing_matrix(nbr, w)[4, 4]) == 1.0  # alone: keeps its model


def test_mh_weights_are_doubly_stochastic_on_a_symmetric_graph_and_renormalise_losses():
    adj = ring(6)
    adj[0, 3] = adj[3, 0] = True
    nbr, mask = neighbor_lists(adj)
    m = np.asarray(mixing_matrix(nbr, metropolis_weights(nbr, mask)))
    np.testing.assert_allclose(m, m.T, atol=1e-7)
    np.testing.assert_allclose(m.sum(0), 1.0, rtol=1e-6)
    rng = np.random.default_rng(0)
    delivered = mask & (rng.random(mask.shape) < 0.5)
    got = mixing_matrix(nbr, metropolis_weights(nbr, mask, delivered))
    dense = np.zeros((6, 6), bool)
    rows = np.repeat(np.arange(6)[:, None], nbr.shape[1], 1)
    dense[rows[delivered], nbr[delivered]] = True
    np.testing.assert_allclose(got, mh_reference(adj, dense), rtol=1e-6)
    nothing = mask.copy()
    nothing[:, 1:] = False  # no link delivered: every node keeps its model
    kept = mixing_matrix(nbr, metropolis_weights(nbr, mask, nothing))
    np.testing.assert_array_equal(kept, np.eye(6))


def components_reference(adj: np.ndarray) -> np.ndarray:
    sym = adj | adj.T
    label = -np.ones(len(adj), int)
    for start in range(len(adj)):
        if label[start] < 0:
            stack = [start]
            while stack:
                i = stack.pop()
                if label[i] < 0:
                    label[i] = start
                    stack.extend(np.nonzero(sym[i])[0].tolist())
    return label


def test_components_and_consensus_distance_match_numpy():
    nbr, mask = neighbor_lists(DIRECTED)
    labels = np.asarray(component_labels(nbr, mask))
    np.testing.assert_array_equal(labels, components_reference(DIRECTED))
    np.testing.assert_array_equal(labels, [0, 0, 0, 0, 4, 5, 5])
    rng = np.random.default_rng(1)
    params = {"a": rng.normal(size=(7, 3, 2)), "b": rng.normal(size=(7, 5))}
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    flat = np.concatenate([np.asarray(a, np.float64).reshape(7, -1) for a in params.values()], 1)
    want = np.array([((flat[i] - flat[labels == labels[i]].mean(0)) ** 2).sum() for i in range(7)])
    np.testing.assert_allclose(consensus_deviation(params, labels), want, rtol=1e-5)
    np.testing.assert_allclose(consensus_distance(params, labels), want.mean(), rtol=1e-5)
    everyone = ((flat - flat.mean(0)) ** 2).sum(1).mean()
    np.testing.assert_allclose(consensus_distance(params), everyone, rtol=1e-5)


def test_consensus_distance_in_column_blocks(monkeypatch):
    rng = np.random.default_rng(2)
    params = {"w": jnp.asarray(rng.normal(size=(5, 37)), jnp.float32)}
    whole = gossip.consensus_deviation(params, jnp.array([0, 0, 2, 2, 2]))
    monkeypatch.setattr(gossip, "block_size", lambda d, s: 8)  # 5 blocks, the last shifted
    blocks = gossip.consensus_deviation(params, jnp.array([0, 0, 2, 2, 2]))
    np.testing.assert_allclose(blocks, whole, rtol=1e-6)


@pytest.mark.parametrize("n", [7])
def test_gossip_on_a_ring_falls_by_lambda_2_squared_each_round(n):
    """Training off: x_{t+1} = W x_t. Started along W's second eigenvector the consensus
    distance falls by lambda_2^2 every round; from any start it is NumPy's W^t x_0."""
    nbr, mask = neighbor_lists(ring(n))
    w = metropolis_weights(nbr, mask)
    dense = np.asarray(mixing_matrix(nbr, w), np.float64)
    np.testing.assert_allclose(dense, np.where(ring(n) | np.eye(n, dtype=bool), 1 / 3, 0), 1e-6)
    vals, vecs = np.linalg.eigh(dense)
    lam2 = vals[np.argsort(-np.abs(vals))[1]]
    v2 = vecs[:, np.argsort(-np.abs(vals))[1]]
    x = {"w": jnp.asarray(np.outer(v2, [1.0, -2.0, 0.5]), jnp.float32)}
    dist = [float(consensus_distance(x))]
    for _ in range(5):
        x = mix_sparse(x, nbr, w)
        dist.append(float(consensus_distance(x)))
    np.testing.assert_allclose(np.array(dist[1:]) / np.array(dist[:-1]), lam2**2, rtol=1e-4)
    np.testing.assert_allclose(float(spectral_gap(nbr, w)), 1 - abs(lam2), rtol=1e-5)
    rng = np.random.default_rng(3)
    x0 = rng.normal(size=(n, 4))
    x = {"w": jnp.asarray(x0, jnp.float32)}
    for t in range(1, 4):
        x = mix_sparse(x, nbr, w)
        np.testing.assert_allclose(x["w"], np.linalg.matrix_power(dense, t) @ x0, atol=1e-5)


def test_spectral_gap_power_iteration_agrees_with_the_dense_svd():
    rng = np.random.default_rng(4)
    adj = rng.random((40, 40)) < 0.08  # directed, some one-way links
    adj |= ring(40)
    nbr, mask = neighbor_lists(adj)
    delivered = mask & (rng.random(mask.shape) < 0.8)
    w = metropolis_weights(nbr, mask, delivered)
    dense = np.asarray(mixing_matrix(nbr, w), np.float64)
    j = np.full((40, 40), 1 / 40)
    want = np.linalg.norm((np.eye(40) - j) @ dense @ (np.eye(40) - j), 2)
    np.testing.assert_allclose(consensus_contraction(nbr, w), want, rtol=1e-5)
    np.testing.assert_allclose(consensus_contraction(nbr, w, dense_limit=0), want, rtol=1e-3)
    two = np.zeros((6, 6), bool)  # two components: no round brings them together
    two[:3, :3] = two[3:, 3:] = True
    nbr, mask = neighbor_lists(two)
    assert abs(float(spectral_gap(nbr, metropolis_weights(nbr, mask)))) < 1e-6
    full = np.ones((5, 5), bool)  # complete graph, MH = uniform: exact averaging, gap 1
    nbr, mask = neighbor_lists(full)
    np.testing.assert_allclose(metropolis_weights(nbr, mask), 0.2, rtol=1e-6)
    np.testing.assert_allclose(float(spectral_gap(nbr, metropolis_weights(nbr, mask))), 1, 1e-6)
