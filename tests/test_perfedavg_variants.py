"""Per-FedAvg's variants: FO, HF (finite-difference Hessian-vector product) and exact.

References are built by hand: the meta-gradient ``(I - alpha H(w; D'')) grad f(w'; D')`` with
the Hessian a dense ``jax.hessian`` matrix of the flattened parameters, the finite difference
written out, and the FO gradient as the plain gradient at the adapted point.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from pfedwn_jax.algorithms import get_algorithm, make_hparams
from pfedwn_jax.algorithms.perfedavg import batch_parts, meta_grad_fn
from pfedwn_jax.engine import default_loss
from pfedwn_jax.models import get_model

SHAPE, CLASSES, B, ALPHA = (3, 3, 1), 3, 12, 0.3


def _hp(**kw):
    return make_hparams(get_algorithm("perfedavg"), {"alpha": ALPHA, **kw})


def _problem():
    """The engine's logistic regression (float32), one minibatch of 12 with 2 padded samples."""
    rng = np.random.default_rng(0)
    model = get_model("logreg", CLASSES, SHAPE)
    w = jax.tree.map(lambda a: a + rng.normal(0, 0.5, a.shape), model.init(jax.random.PRNGKey(3)))
    x = jnp.asarray(rng.integers(0, 256, (B, *SHAPE)), jnp.uint8)
    y = jnp.asarray(rng.integers(0, CLASSES, B), jnp.int32)
    wt = jnp.asarray(np.r_[np.ones(B - 2), np.zeros(2)], jnp.float32)
    return default_loss(model), jax.tree.map(jnp.float32, w), x, y, wt


def _problem64():
    """A tiny softmax regression written out in float64 (the engine's loss rounds to float32,
    which would hide the O(delta^2) behaviour): 4 features, 3 classes, 15 parameters."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(B, 4)))
    y = jnp.asarray(rng.integers(0, CLASSES, B), jnp.int32)
    wt = jnp.asarray(np.r_[np.ones(B - 2), np.zeros(2)])
    w = {"w": jnp.asarray(rng.normal(size=(4, CLASSES))), "b": jnp.asarray(rng.normal(size=3))}

    def base(p, x, y, wt, aux_s):
        logp = jax.nn.log_softmax(x @ p["w"] + p["b"])
        ce = -jnp.take_along_axis(logp, y[:, None], axis=1)[:, 0]
        return jnp.sum(wt * ce) / jnp.maximum(wt.sum(), 1.0)

    return base, w, x, y, wt


def _reference(base, w, x, y, parts):
    """``(v, H v)`` from a dense ``jax.hessian``: ``v = grad f(w - alpha grad f(w; D); D')``."""
    d, d1, d2 = parts
    flat, unravel = ravel_pytree(w)
    f = lambda p, dw: base(unravel(p), x, y, dw, None)
    adapted = flat - ALPHA * jax.grad(f)(flat, d)
    v = jax.grad(f)(adapted, d1)
    hess = jax.hessian(f)(flat, d2)
    return v, hess @ v


def _flat(tree):
    return np.asarray(ravel_pytree(tree)[0], np.float64)


@pytest.mark.slow
@pytest.mark.parametrize("split", [False, True])
def test_hf_approaches_the_exact_hessian_update_as_delta_shrinks(split):
    """Central differences: error O(delta^2), so 10x smaller delta gives ~100x smaller error
    (float64, where rounding stays far below it); "exact" equals the dense-Hessian update."""
    with jax.enable_x64(True):
        base, w, x, y, wt = _problem64()
        v, hv = _reference(base, w, x, y, batch_parts(wt, _hp(variant="hf", split_batch=split)))
        want = np.asarray(v - ALPHA * hv)
        _, exact = meta_grad_fn(base, _hp(variant="exact", split_batch=split))(
            w, x, y, wt, None, None
        )
        np.testing.assert_allclose(_flat(exact), want, rtol=1e-10, atol=1e-12)
        errors = []
        for delta in (1e-1, 1e-2, 1e-3):
            hp = _hp(variant="hf", split_batch=split, delta=delta)
            _, g = meta_grad_fn(base, hp)(w, x, y, wt, None, None)
            errors.append(np.linalg.norm(_flat(g) - want))
        assert np.linalg.norm(ALPHA * hv) > 1e-2  # the Hessian term matters here
        assert errors[0] > 1e-8  # the finite difference is really an estimate
        for coarse, fine in itertools.pairwise(errors):
            assert 50 < coarse / fine < 200, errors


def test_hf_in_float32_with_the_default_delta_is_close_to_exact():
    base, w, x, y, wt = _problem()
    _, hf = meta_grad_fn(base, _hp(variant="hf"))(w, x, y, wt, None, None)
    _, exact = meta_grad_fn(base, _hp(variant="exact"))(w, x, y, wt, None, None)
    _, fo = meta_grad_fn(base, _hp(variant="hf", alpha=0.0))(w, x, y, wt, None, None)
    gap = np.linalg.norm(_flat(hf) - _flat(exact))
    assert gap < 1e-3 * np.linalg.norm(_flat(exact))
    assert gap < 1e-2 * np.linalg.norm(_flat(exact) - _flat(fo))  # far below what alpha changes


@pytest.mark.parametrize("split", [False, True])
def test_fo_is_hf_without_the_hessian_term(split):
    """``g_hf + alpha * h`` with ``h`` the finite difference written out is the FO gradient
    on HF's batches; without batch splitting (same batches) it is exactly ``variant="fo"``."""
    base, w, x, y, wt = _problem()
    hp = _hp(variant="hf", split_batch=split, delta=1e-2)
    d, d1, d2 = batch_parts(wt, hp)
    _, g_hf = meta_grad_fn(base, hp)(w, x, y, wt, None, None)
    grad = lambda p, dw: jax.grad(base)(p, x, y, dw, None)
    v = grad(jax.tree.map(lambda a, g: a - ALPHA * g, w, grad(w, d)), d1)
    shifted = lambda s: jax.tree.map(lambda a, b: a + s * 1e-2 * b, w, v)
    h = jax.tree.map(lambda a, b: (a - b) / 2e-2, grad(shifted(1.0), d2), grad(shifted(-1.0), d2))
    np.testing.assert_allclose(_flat(g_hf) + ALPHA * _flat(h), _flat(v), rtol=1e-5, atol=1e-6)
    assert np.linalg.norm(_flat(h)) > 1e-2
    if not split:
        _, g_fo = meta_grad_fn(base, _hp(variant="fo", split_batch=False))(w, x, y, wt, None, None)
        np.testing.assert_allclose(_flat(g_fo), _flat(v), rtol=1e-6, atol=1e-7)


def test_batch_parts_are_disjoint_thirds_for_hessian_variants():
    wt = jnp.ones(9)
    for variant in ("hf", "exact"):
        d, d1, d2 = (np.asarray(p) for p in batch_parts(wt, _hp(variant=variant)))
        np.testing.assert_array_equal(d + d1 + d2, np.ones(9))
        np.testing.assert_array_equal(np.flatnonzero(d2), [2, 5, 8])
    d, d1, d2 = (np.asarray(p) for p in batch_parts(wt, _hp(variant="fo")))
    np.testing.assert_array_equal(np.flatnonzero(d1), [1, 3, 5, 7])


@pytest.mark.parametrize(
    "overrides, match",
    [({"variant": "so"}, r"perfedavg\.variant"), ({"delta": 0.0}, r"perfedavg\.delta")],
)
def test_bad_variant_or_delta_is_a_value_error(overrides, match):
    with pytest.raises(ValueError, match=match):
        _hp(**overrides)
