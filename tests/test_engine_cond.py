"""`engine.cond.cond_any`: `lax.cond`'s values, and under `vmap` (one level or two) a branch
in the compiled program instead of `lax.cond`'s select of both branches."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pfedwn_jax.engine.cond import cond_any

X = jnp.arange(12.0).reshape(2, 3, 2)
Y = jnp.float32(0.5)


def true_fn(x, y):
    return jnp.sin(x) * 2 + y, x.sum()


def false_fn(x, y):
    return x - y, jnp.zeros(())


def ours(p, x):
    return cond_any(p, true_fn, false_fn, (x, Y))


def plain(p, x):
    return jax.lax.cond(p, true_fn, false_fn, x, Y)


def _equal(a, b):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


@pytest.mark.parametrize("pred", [[False, False, False], [True, False, True], [True] * 3])
def test_values_equal_lax_cond_under_vmap_and_jit(pred):
    p = jnp.array(pred)
    _equal(jax.jit(jax.vmap(ours))(p, X[0]), jax.vmap(plain)(p, X[0]))
    _equal(ours(p[0], X[0]), plain(p[0], X[0]))


def test_nested_vmaps_and_an_unbatched_predicate_keep_the_values():
    p = jnp.array([[False, False, False], [False, True, False]])
    _equal(jax.jit(jax.vmap(jax.vmap(ours)))(p, X), jax.vmap(jax.vmap(plain))(p, X))
    unbatched = lambda x: ours(jnp.bool_(True), x)
    _equal(jax.vmap(unbatched)(X[0]), jax.vmap(lambda x: plain(True, x))(X[0]))


@pytest.mark.parametrize("levels", [1, 2])
def test_under_vmap_the_program_keeps_a_branch(levels):
    """`lax.cond` with a batched predicate compiles to a select (both branches always run);
    `cond_any` keeps a `cond` on whether any element takes the true branch."""

    def nest(fn):
        for _ in range(levels):
            fn = jax.vmap(fn)
        return fn

    p = jnp.zeros((2, 3)[-levels:], bool)
    x = X if levels == 2 else X[0]
    assert "cond[" in str(jax.make_jaxpr(nest(ours))(p, x))
    assert "cond[" not in str(jax.make_jaxpr(nest(plain))(p, x))


class Checked(flax.struct.PyTreeNode):
    """An operand that validates its field when built (as the package's parameter classes)."""

    scale: jax.Array

    def __post_init__(self):
        if isinstance(self.scale, bool | None):
            raise ValueError(f"scale must be a number; got {self.scale!r}")


def test_operands_that_validate_themselves_pass_through_the_batching_rule():
    def f(p, x, c):
        return cond_any(p, lambda x, c: x * c.scale, lambda x, c: x - c.scale, (x, c))

    p, c = jnp.array([True, False, False]), Checked(jnp.float32(2.0))
    got = jax.vmap(f, in_axes=(0, 0, None))(p, X[0], c)
    np.testing.assert_array_equal(got, jnp.where(p[:, None], X[0] * 2.0, X[0] - 2.0))
