"""A branch that stays a branch under `vmap`.

`jax.lax.cond` with a batched predicate becomes a `select`: both branches run for every
element of the batch. A run is a `vmap` over runs (a sweep of one, or of many), so an
expensive branch taken on a few rounds (pFedWN's EM) would run on every round. `cond_any`
runs it only when some element of the batch takes it, for the whole batch, and selects per
element; when none does, only the other branch runs. The values are `lax.cond`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def cond_any(
    pred: Any, true_fn: Callable[..., Any], false_fn: Callable[..., Any], operands: tuple
) -> Any:
    """``jax.lax.cond(pred, true_fn, false_fn, *operands)``, whose `vmap` over a batched
    ``pred`` runs ``true_fn`` only if ``any(pred)`` (see the module docstring).

    ``true_fn`` and ``false_fn`` must be functions of ``operands`` alone (anything batched
    they need is an operand, not a closure); nested `vmap`s keep the branch at every level.
    Operands and results cross the batching rule as flat leaves, so their dataclasses are
    never rebuilt from batching flags (and never validate those).
    """
    flat, treedef = jax.tree.flatten(operands)
    out_tree: list[Any] = []

    def on_leaves(fn: Callable[..., Any]) -> Callable[[list], list]:
        def call(leaves: list) -> list:
            out, tree = jax.tree.flatten(fn(*jax.tree.unflatten(treedef, leaves)))
            out_tree[:] = [tree]
            return out

        return call

    @jax.custom_batching.custom_vmap
    def branch(p: jax.Array, leaves: list) -> list:
        return jax.lax.cond(p, on_leaves(true_fn), on_leaves(false_fn), leaves)

    @branch.def_vmap
    def rule(axis_size: int, in_batched: list, p: jax.Array, leaves: list) -> Any:
        p_b, leaves_b = in_batched
        axes = [0 if b else None for b in leaves_b]
        each = lambda fn: jax.vmap(on_leaves(fn), in_axes=(axes,), axis_size=axis_size)
        if not p_b:
            out = cond_any(p, each(true_fn), each(false_fn), (leaves,))
        else:

            def select(q: jax.Array, o: list) -> list:
                at = lambda a: q.reshape(q.shape + (1,) * (a.ndim - 1))
                pick = lambda t, f: jnp.where(at(t), t, f)
                return jax.tree.map(pick, each(true_fn)(o), each(false_fn)(o))

            out = cond_any(p.any(), select, lambda q, o: each(false_fn)(o), (p, leaves))
        return out, [True] * len(out)

    out = branch(jnp.asarray(pred), flat)  # traces a branch: sets out_tree
    return jax.tree.unflatten(out_tree[0], out)
