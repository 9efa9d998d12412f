"""FedAMP's relative sigma ("auto") and the attention-gradient option, against NumPy loops."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_groups import GROUP, leaves, make_ctx, run

from pfedwn_jax.algorithms import get_algorithm, make_hparams, neighbor_lists
from pfedwn_jax.algorithms.common import proximal_loss
from pfedwn_jax.algorithms.fedamp import (
    attentive_loss,
    cloud_models,
    neighbor_median,
    round_sigma,
)

# 4 nodes: node 0 hears 1, 2, 3; node 1 hears 0, 3; node 2 hears nobody; node 3 hears 0
ADJ = np.array([[1, 1, 1, 1], [1, 1, 0, 1], [0, 0, 1, 0], [1, 0, 0, 1]], bool)


def _hp(**kw):
    return make_hparams(get_algorithm("fedamp"), kw)


def _models(seed=0, s=4):
    rng = np.random.default_rng(seed)
    f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)
    return {"w": f32(s, 3, 2), "b": f32(s, 2)}


def _flat(params):
    return np.concatenate([np.asarray(params[k], np.float64).reshape(len(params[k]), -1)
                           for k in sorted(params)], axis=1)  # fmt: skip


def _ctx(adj):
    neighbors, mask = neighbor_lists(adj)
    return types.SimpleNamespace(
        neighbors=jnp.asarray(neighbors), neighbor_mask=jnp.asarray(mask), shards=1
    )


def _numpy_cloud(w, adj, alpha_k, scale):
    """The "auto" rule and FedAMP's message passing, one node and one neighbor at a time."""
    s = len(w)
    u, sigmas = np.zeros_like(w), np.ones(s)
    for i in range(s):
        nbrs = [j for j in range(s) if j != i and adj[i, j]]
        d = {j: float(np.sum((w[i] - w[j]) ** 2)) for j in nbrs}
        if nbrs:
            sigmas[i] = scale * np.median(list(d.values()))
        xi = {j: alpha_k * np.exp(-d[j] / sigmas[i]) / sigmas[i] for j in nbrs}
        total = sum(xi.values())
        if total > 1:
            xi = {j: v / total for j, v in xi.items()}
        u[i] = (1 - sum(xi.values())) * w[i] + sum(v * w[j] for j, v in xi.items())
    return u, sigmas


@pytest.mark.parametrize("alpha_k, scale", [(0.5, 1.0), (3.0, 0.5), (40.0, 2.0)])
def test_auto_sigma_and_cloud_models_match_numpy_loop(alpha_k, scale):
    """Small alpha_k: self weight > 0; large: rows rescaled (self weight 0)."""
    params = _models()
    ctx, hp = _ctx(ADJ), _hp(alpha_k=alpha_k, sigma_mode="auto", sigma_scale=scale)
    want_u, want_sigma = _numpy_cloud(_flat(params), ADJ, alpha_k, scale)
    d = jnp.asarray(
        np.sum((_flat(params)[:, None] - _flat(params)[np.asarray(ctx.neighbors)]) ** 2, -1)
    )
    sigma = np.asarray(round_sigma(d, ctx.neighbor_mask, hp))
    np.testing.assert_allclose(sigma[[0, 1, 3]], want_sigma[[0, 1, 3]], rtol=1e-6)
    u = cloud_models(jax.tree.map(jnp.asarray, params), ctx, hp)
    np.testing.assert_allclose(_flat(u), want_u, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(_flat(u)[2], _flat(params)[2])  # no neighbor: its own model


def test_neighbor_median_even_odd_and_empty_rows():
    d = jnp.asarray([[0.0, 5.0, 1.0, 3.0], [0.0, 4.0, 2.0, 9.0], [0.0, 7.0, 7.0, 7.0]])
    mask = jnp.asarray([[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]], bool)
    np.testing.assert_allclose(neighbor_median(d, mask), [3.0, 3.0, 1.0])
    zero = jnp.zeros((2, 3))  # identical models (round 1): sigma falls to the floor, no NaN
    sigma = round_sigma(zero, jnp.ones((2, 3), bool), _hp(sigma_mode="auto"))
    assert np.all(np.asarray(sigma) > 0) and np.all(np.isfinite(sigma))


def test_fixed_mode_is_the_given_sigma():
    assert round_sigma(jnp.ones((2, 2)), jnp.ones((2, 2), bool), _hp(sigma=0.7)) == 0.7


def _numpy_prox(w, received, mask, alpha_k, lam, sigma):
    """``lam / (2 alpha_k) ||w - u(w)||^2`` with u rebuilt from the live ``w`` (float64)."""
    xi = np.array([alpha_k * np.exp(-np.sum((w - r) ** 2) / sigma) / sigma for r in received])
    xi = np.where(mask & (np.arange(len(received)) > 0), xi, 0.0)
    if xi.sum() > 1:
        xi = xi / xi.sum()
    u = (1 - xi.sum()) * w + (xi[:, None] * received).sum(0)
    return 0.5 * lam / alpha_k * np.sum((w - u) ** 2)


def test_undetached_attention_gradient_matches_numpy_finite_differences():
    """``detach_attention=False``: the loss and its gradient through the attention weights,
    against central differences of a NumPy loop (zero base loss, so only the term is left);
    at the round-start model its value is the detached term's, its gradient is not."""
    rng = np.random.default_rng(2)
    received = rng.normal(scale=0.5, size=(4, 5))  # column 0: the slot's round-start model
    mask = np.array([True, True, True, False])  # one padded column
    w = received[0] + rng.normal(scale=0.2, size=5)
    alpha_k, lam, sigma = 0.8, 1.5, 0.9
    hp = _hp(alpha_k=alpha_k, lam=lam, detach_attention=False)
    zero_loss = lambda *a: jnp.zeros((), jnp.float32)
    loss = attentive_loss(zero_loss, hp)
    aux = (jnp.asarray(received, jnp.float32), jnp.asarray(mask), jnp.float32(sigma))
    got = jax.grad(loss)(jnp.asarray(w, jnp.float32), None, None, None, aux)
    ref = lambda v: _numpy_prox(v, received, mask, alpha_k, lam, sigma)
    eye = np.eye(5) * 1e-6
    want = np.array([(ref(w + e) - ref(w - e)) / 2e-6 for e in eye])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # at the round-start model: the same value as the detached term, another gradient
    w0 = jnp.asarray(received[0], jnp.float32)
    detached = proximal_loss(zero_loss, lam / alpha_k)
    xi = np.array([alpha_k * np.exp(-np.sum((received[0] - r) ** 2) / sigma) / sigma
                   for r in received[1:3]])  # fmt: skip
    u0 = (1 - xi.sum()) * received[0] + xi @ received[1:3]
    args = (None, None, None)
    np.testing.assert_allclose(
        loss(w0, *args, aux), detached(w0, *args, jnp.asarray(u0, jnp.float32)), rtol=1e-5
    )
    g_att = np.asarray(jax.grad(loss)(w0, *args, aux))
    g_det = np.asarray(jax.grad(detached)(w0, *args, jnp.asarray(u0, jnp.float32)))
    assert np.linalg.norm(g_att - g_det) > 0.1 * np.linalg.norm(g_det)


@pytest.mark.slow
def test_rounds_with_auto_sigma_and_undetached_attention_run_and_differ():
    ctx = make_ctx(GROUP)
    local_state, _ = run("local", ctx, 1)  # distinct models
    out = {}
    for name, over in [
        ("default", {}),
        ("auto", {"sigma_mode": "auto", "sigma_scale": 2.0}),
        ("undetached", {"detach_attention": False}),
    ]:
        _, out[name] = run("fedamp", ctx, 1, over, state=local_state)
        assert all(np.all(np.isfinite(a)) for a in leaves(out[name]))
    for name in ("auto", "undetached"):
        gap = sum(np.abs(a - b).sum() for a, b in zip(leaves(out[name]), leaves(out["default"])))
        assert gap > 1e-4, name


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"sigma_mode": "median"}, r"fedamp\.sigma_mode"),
        ({"sigma_scale": 0.0}, r"fedamp\.sigma_scale"),
        ({"detach_attention": "yes"}, r"fedamp\.detach_attention"),
    ],
)
def test_bad_fedamp_options_are_value_errors(overrides, match):
    with pytest.raises(ValueError, match=match):
        _hp(**overrides)
