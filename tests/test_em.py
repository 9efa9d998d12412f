"""EM mixture weights: hand-computed cases, scipy references, masks, numerics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize, special

from pfedwn_jax.em import estimate_weights, m_step, responsibilities


def _nll(p):
    return -np.log(np.asarray(p, np.float64))


# --- hand-computed -----------------------------------------------------------------------


def test_responsibilities_hand_computed():
    # p_m(y_i | x_i): neighbor 0 gives [0.9, 0.5], neighbor 1 gives [0.1, 0.5]; pi = [0.25, 0.75]
    losses = _nll([[0.9, 0.5], [0.1, 0.5]])
    lam = np.asarray(responsibilities(losses, pi=[0.25, 0.75]))
    # sample 0: 0.25*0.9 / (0.25*0.9 + 0.75*0.1) = 0.225 / 0.3 = 0.75
    # sample 1: 0.25*0.5 / (0.25*0.5 + 0.75*0.5) = 0.25
    np.testing.assert_allclose(lam, [[0.75, 0.25], [0.25, 0.75]], atol=1e-6)


def test_one_em_iteration_hand_computed():
    losses = _nll([[0.9, 0.5], [0.1, 0.5]])
    # uniform prior: lambda_0 = [0.9, 0.5] -> pi_0 = 0.7 after one iteration
    pi = estimate_weights(losses, num_iters=1)
    np.testing.assert_allclose(pi, [0.7, 0.3], atol=1e-6)
    # second iteration from [0.7, 0.3]: sample 0: 0.63/(0.63+0.03) = 0.954545..., sample 1: 0.7
    pi2 = estimate_weights(losses, num_iters=2)
    np.testing.assert_allclose(pi2[0], (0.63 / 0.66 + 0.7) / 2, atol=1e-6)


def test_separable_samples_give_exact_proportions():
    # samples 0,1 are only explained by neighbor A (B's loss 1e4), sample 2 only by B
    big = 1e4
    losses = np.array([[0.0, 0.0, big], [big, big, 0.0]])
    pi = estimate_weights(losses, tol=1e-9)
    np.testing.assert_allclose(pi, [2 / 3, 1 / 3], atol=1e-6)


# --- independent references --------------------------------------------------------------


def test_two_components_matches_scipy_root():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.05, 0.95, size=(2, 300))
    pi = np.asarray(estimate_weights(_nll(p), num_iters=5000, tol=1e-9))
    r = p[0] / p[1]
    # stationarity of the log-likelihood sum_i log(pi r_i + 1 - pi) in pi (interior optimum)
    score = lambda q: np.sum((r - 1) / (q * r + 1 - q))
    ref = optimize.brentq(score, 1e-9, 1 - 1e-9, xtol=1e-12)
    np.testing.assert_allclose(pi[0], ref, atol=2e-4)
    np.testing.assert_allclose(pi.sum(), 1.0, atol=1e-6)


def test_many_components_match_scipy_mle():
    rng = np.random.default_rng(1)
    m, n = 4, 400
    losses = rng.gamma(2.0, 1.0, size=(m, n))
    pi = np.asarray(estimate_weights(losses, num_iters=20000, tol=1e-10))

    def neg_ll(z):
        log_pi = z - special.logsumexp(z)
        return -special.logsumexp(log_pi[:, None] - losses, axis=0).sum()

    res = optimize.minimize(neg_ll, np.zeros(m), method="BFGS", options={"gtol": 1e-10})
    ref = special.softmax(res.x)
    np.testing.assert_allclose(pi, ref, atol=2e-3)
    # EM is monotone: its answer is at least as likely as the optimiser's (up to rounding)
    assert neg_ll(np.log(np.maximum(pi, 1e-300))) <= res.fun + 1e-3


def test_batched_equals_per_target_loop():
    rng = np.random.default_rng(2)
    losses = rng.gamma(2.0, 1.0, size=(3, 2, 4, 50)).astype(np.float32)
    smask = rng.uniform(size=(3, 2, 50)) < 0.8
    nmask = rng.uniform(size=(3, 2, 4)) < 0.7
    nmask[..., 0] = True
    pi = np.asarray(estimate_weights(losses, smask, nmask, num_iters=300, tol=0.0))
    for a in range(3):
        for b in range(2):
            keep = nmask[a, b]
            ref = estimate_weights(losses[a, b][keep][:, smask[a, b]], num_iters=300, tol=0.0)
            np.testing.assert_allclose(pi[a, b][keep], ref, atol=1e-5)
            assert np.all(pi[a, b][~keep] == 0)


# --- the constructed mixture ---------------------------------------------------


def test_constructed_mixture_recovers_proportions():
    """Target data = 60% neighbor 0 + 40% neighbor 1 + 0% neighbor 2 (unrelated).

    Neighbor m labels x as (x + m) mod K with probability 0.9 (else uniformly), and each
    neighbor model is that true conditional, so it fits its own distribution well. With 3000
    target samples the MLE is within 0.03 of the truth (~3 standard errors), and the unrelated
    neighbor gets weight below 0.01.
    """
    rng = np.random.default_rng(3)
    k, noise, n = 10, 0.1, 3000
    true_pi = np.array([0.6, 0.4, 0.0])
    z = rng.choice(3, size=n, p=true_pi)
    x = rng.integers(0, k, size=n)
    y = np.where(rng.uniform(size=n) < 1 - noise, (x + z) % k, rng.integers(0, k, size=n))
    # p_m(y | x) = (1 - noise) [y == x + m] + noise / K
    p = np.stack([(1 - noise) * (y == (x + m) % k) + noise / k for m in range(3)])
    pi = np.asarray(estimate_weights(_nll(p), tol=1e-7, num_iters=2000))
    np.testing.assert_allclose(pi[:2], true_pi[:2], atol=0.03)
    assert pi[2] < 0.01
    # a 1e-3 floor keeps it alive (the floor plus the few noisy samples it explains) but small
    pi_f = np.asarray(estimate_weights(_nll(p), tol=1e-7, num_iters=2000, floor=1e-3))
    assert 1e-3 <= pi_f[2] < 0.01
    np.testing.assert_allclose(pi_f[:2], true_pi[:2], atol=0.03)
    np.testing.assert_allclose(pi_f.sum(), 1.0, atol=1e-6)


# --- masks and numerics -------------------------------------------------------------------


def test_padded_samples_and_unselected_neighbors_are_ignored():
    rng = np.random.default_rng(4)
    losses = rng.gamma(2.0, 1.0, size=(3, 20))
    ref = np.asarray(estimate_weights(losses[:2, :15], tol=0.0, num_iters=100))
    garbage = losses.copy()
    garbage[:, 15:] = rng.uniform(-50, 50, size=(3, 5))  # padded samples: anything
    garbage[2] = -100.0  # unselected neighbor that would otherwise take everything
    smask = np.arange(20) < 15
    nmask = np.array([True, True, False])
    pi = np.asarray(estimate_weights(garbage, smask, nmask, tol=0.0, num_iters=100))
    np.testing.assert_allclose(pi[:2], ref, atol=1e-6)
    assert pi[2] == 0.0
    lam = np.asarray(responsibilities(garbage, None, smask, nmask))
    assert np.all(lam[:, 15:] == 0) and np.all(lam[2] == 0)
    np.testing.assert_allclose(lam[:, :15].sum(0), 1.0, atol=1e-6)


def test_no_valid_neighbor_or_sample_gives_no_nan():
    losses = np.ones((2, 3, 4))
    pi = np.asarray(estimate_weights(losses, neighbor_mask=[[False] * 3, [True] * 3]))
    assert np.all(pi[0] == 0) and np.allclose(pi[1], 1 / 3)
    pi = np.asarray(estimate_weights(losses[0], sample_mask=np.zeros(4, bool)))
    np.testing.assert_allclose(pi, 1 / 3)


def test_finite_for_huge_losses():
    losses = np.array([[1e4, 1e4 + 1.0, 2e4], [1e4 + 2.0, 1e4, 1e4]], np.float32)
    lam = np.asarray(responsibilities(losses))
    assert np.all(np.isfinite(lam))
    # log-space: only differences matter, so sample 0 is logistic(2), sample 2 is ~[0, 1]
    np.testing.assert_allclose(lam[0, 0], special.expit(2.0), atol=1e-5)
    np.testing.assert_allclose(lam[:, 2], [0.0, 1.0], atol=1e-6)
    pi = np.asarray(estimate_weights(losses))
    assert np.all(np.isfinite(pi)) and pi.sum() == pytest.approx(1.0, abs=1e-6)


def test_floor_keeps_weights_on_simplex_above_floor():
    big = 1e4
    losses = np.array([[0.0] * 5, [big] * 5, [big] * 5])
    pi = np.asarray(estimate_weights(losses, floor=1e-3))
    assert np.all(pi >= 1e-3 - 1e-9) and pi.sum() == pytest.approx(1.0, abs=1e-6)
    # zero prior stays zero without a floor, is revived with one
    pi0 = np.asarray(estimate_weights(losses[[1, 0]], prior=[0.0, 1.0]))
    assert pi0[0] == 0.0
    np.testing.assert_allclose(m_step(np.full((2, 4), 0.5), floor=0.2), [0.5, 0.5])


def test_jit_and_vmap_compatible():
    rng = np.random.default_rng(5)
    losses = jnp.asarray(rng.gamma(2.0, 1.0, size=(4, 3, 30)), jnp.float32)
    eager = estimate_weights(losses, num_iters=50, tol=0.0)
    jitted = jax.jit(lambda v: estimate_weights(v, num_iters=50, tol=0.0))(losses)
    vmapped = jax.vmap(lambda v: estimate_weights(v, num_iters=50, tol=0.0))(losses)
    np.testing.assert_allclose(jitted, eager, atol=1e-6)
    np.testing.assert_allclose(vmapped, eager, atol=1e-6)


def test_stops_at_tolerance():
    rng = np.random.default_rng(6)
    losses = rng.gamma(2.0, 1.0, size=(3, 100))
    _, info = estimate_weights(losses, tol=1e-4, num_iters=10_000, return_info=True)
    assert 1 <= int(info["iterations"]) < 10_000 and float(info["delta"]) < 1e-4
    _, info1 = estimate_weights(losses, tol=0.0, num_iters=7, return_info=True)
    assert int(info1["iterations"]) == 7


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"losses": np.ones(3)}, "losses"),
        ({"losses": np.array([[1.0, np.nan]])}, "losses"),
        ({"losses": np.ones((2, 3)), "sample_mask": np.ones(4, bool)}, "sample_mask"),
        ({"losses": np.ones((2, 3)), "neighbor_mask": np.ones(3, bool)}, "neighbor_mask"),
        ({"losses": np.ones((2, 3)), "prior": [-1.0, 2.0]}, "prior"),
        ({"losses": np.ones((2, 3)), "num_iters": 0}, "num_iters"),
        ({"losses": np.ones((2, 3)), "tol": -1.0}, "tol"),
        ({"losses": np.ones((2, 3)), "floor": 1.5}, "floor"),
    ],
)
def test_bad_input_is_a_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        estimate_weights(**kwargs)
