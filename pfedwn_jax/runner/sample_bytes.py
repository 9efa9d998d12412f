"""A model's device bytes per training and evaluation sample, for the memory plan.

A liveness pass over the jaxpr of one training step (forward and backward) and of the
forward pass, traced at batch 2 and 4: the peak of the live values that grow with the batch.
Traced only (abstract inputs): nothing is allocated or compiled.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from pfedwn_jax.engine import per_sample_ce, weighted_ce
from pfedwn_jax.models import Model


class _Mismatch(Exception):
    """The jaxprs at batch 1 and 2 differ in structure (the model branches on the batch)."""


def _var_bytes(v: Any) -> int:
    aval = getattr(v, "aval", None)
    if aval is None or not hasattr(aval, "shape"):
        return 0
    return math.prod(aval.shape) * np.dtype(aval.dtype).itemsize


def _twins(vs1: Any, vs2: Any) -> list[tuple[Any, Any]]:
    """Pairs `(v1, v2)` of the same position; `vs1=None` pairs every `v2` with None."""
    if vs1 is None:
        return [(None, v) for v in vs2]
    if len(vs1) != len(vs2):
        raise _Mismatch
    return list(zip(vs1, vs2, strict=True))


def _growth_bytes(v1: Any, v2: Any) -> int:
    """Bytes by which `v2` outgrows its twin `v1` (all of `v2` when `v1` is None)."""
    return max(0, _var_bytes(v2) - (_var_bytes(v1) if v1 is not None else 0))


def _sum_growth(vs1: Any, vs2: Any) -> int:
    return sum(_growth_bytes(a, b) for a, b in _twins(vs1, vs2))


def _get(obj: Any, name: str) -> Any:
    return None if obj is None else getattr(obj, name)


def _live_peak(j1: Any, j2: Any) -> int:
    """Peak over the equations of jaxpr `j2` of the live bytes, counting each value by how
    much it outgrows its twin in `j1` (the same program at a smaller batch; `None`: all of it).

    A value is live from the equation that defines it (inputs: from the start) to its last
    use; a nested jaxpr (jit, scan body, custom derivative) adds its own peak while it runs.
    """
    eqns = _twins(_get(j1, "eqns"), j2.eqns)
    last = {v: i for i, (_, e) in enumerate(eqns) for v in e.invars if isinstance(v, jcore.Var)}
    last.update({v: len(eqns) for v in j2.outvars if isinstance(v, jcore.Var)})
    inputs = set(j2.invars)
    live = peak = _sum_growth(_get(j1, "invars"), j2.invars)
    for i, (e1, e2) in enumerate(eqns):
        out = _sum_growth(_get(e1, "outvars"), e2.outvars)
        peak = max(peak, live + max(out, _nested_peak(e1, e2)))
        live += out
        used = {b: a for a, b in _twins(_get(e1, "invars"), e2.invars) if isinstance(b, jcore.Var)}
        dead = [(a, b) for b, a in used.items() if last[b] == i and b not in inputs]
        dead += [(a, b) for a, b in _twins(_get(e1, "outvars"), e2.outvars) if b not in last]
        live -= sum(_growth_bytes(a, b) for a, b in dead)
    return peak


def _nested_peak(e1: Any, e2: Any) -> int:
    """The largest peak of equation `e2`'s nested jaxprs, beyond their inputs."""
    subs2 = list(jcore.jaxprs_in_params(e2.params))
    subs1 = None if e1 is None else list(jcore.jaxprs_in_params(e1.params))
    peaks = [
        _live_peak(s1, s2) - _sum_growth(_get(s1, "invars"), s2.invars)
        for s1, s2 in _twins(subs1, subs2)
    ]
    return max(peaks, default=0)


def _growth(fn: Callable[..., Any], args_at: Callable[[int], tuple]) -> int:
    """Peak live bytes per unit of batch of `fn(*args_at(b))` (see `_live_peak`), from the
    programs at batch 2 and 4 (batch 1 is no twin: JAX drops some size-1 broadcasts)."""
    j2, j4 = (jax.make_jaxpr(fn)(*args_at(b)).jaxpr for b in (2, 4))
    try:
        return -(-_live_peak(j2, j4) // 2)
    except _Mismatch:  # the structure changes with the batch: difference of the two peaks
        return max(0, -(-(_live_peak(None, j4) - _live_peak(None, j2)) // 2))


@functools.lru_cache(maxsize=32)
def sample_bytes(model: Model) -> tuple[int, int]:
    """`(train, forward)`: peak bytes per sample of one training step (value and gradient of
    the minibatch cross-entropy) and of one forward pass with per-sample losses.

    Traced only (`jax.make_jaxpr` on abstract inputs): nothing is allocated or compiled.
    """
    params = jax.eval_shape(model.init, jax.random.key(0))

    def args_at(b: int) -> tuple:
        x = jax.ShapeDtypeStruct((b, *model.input_shape), jnp.dtype(model.input_dtype))
        return (
            params,
            x,
            jax.ShapeDtypeStruct((b,), jnp.int32),
            jax.ShapeDtypeStruct((b,), jnp.float32),
        )

    loss = lambda p, x, y, w: weighted_ce(model.apply(p, x), y, w, jnp.sum(w))
    forward = lambda p, x, y, w: per_sample_ce(model.apply(p, x), y)
    return _growth(jax.value_and_grad(loss), args_at), _growth(forward, args_at)
