"""Cached Gauss-Legendre rules (nodes from numpy) and their use on batched intervals."""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp
import numpy as np


@functools.lru_cache(maxsize=32)
def gauss_legendre(num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights of the `num_nodes`-point rule on [0, 1] (float64, read-only)."""
    x, w = np.polynomial.legendre.leggauss(num_nodes)
    nodes, weights = 0.5 * (x + 1.0), 0.5 * w
    nodes.setflags(write=False)
    weights.setflags(write=False)
    return nodes, weights


def integrate(fn: Any, lo: Any, hi: Any, num_nodes: int, dtype: Any) -> Any:
    """int_lo^hi fn(x) dx for batched bounds `lo`, `hi` [...] -> [...].

    `fn` maps points `[..., num_nodes]` to values of the same shape. Empty or reversed
    intervals (hi <= lo) integrate to 0.
    """
    rule = gauss_legendre(num_nodes)
    nodes, weights = jnp.asarray(rule[0], dtype), jnp.asarray(rule[1], dtype)
    length = jnp.maximum(hi - lo, 0.0)
    x = lo[..., None] + length[..., None] * nodes
    return length * jnp.sum(weights * fn(x), axis=-1)


def integrate_panels(fn: Any, edges: Any, num_nodes: int, dtype: Any) -> Any:
    """Composite rule: sum over consecutive panels `edges [..., P+1]` of `integrate`."""
    return jnp.sum(integrate(fn, edges[..., :-1], edges[..., 1:], num_nodes, dtype), axis=-1)
