"""Channel-aware neighbor selection: keep neighbors whose P_err is below eps (paper Alg. 1)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax._checks import check_finite, check_range, is_concrete


def select_neighbors(perr: Any, eps: Any, valid: Any = None) -> jax.Array:
    """bool [..., n]: `perr < eps` and valid.

    `eps` (scalar or broadcastable against `perr`) must lie in (0, 1); `perr` values must be
    probabilities. Works under jit (checks then apply to concrete values only).
    """
    check_range("eps", eps, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    check_finite("perr", perr)
    check_range("perr", perr, 0.0, 1.0)
    perr = jnp.asarray(perr)
    eps = jnp.asarray(eps, perr.dtype) if jnp.issubdtype(perr.dtype, jnp.floating) else eps
    try:
        shape = jnp.broadcast_shapes(np.shape(perr), np.shape(eps))
    except ValueError as e:
        raise ValueError(
            f"eps shape {list(np.shape(eps))} does not broadcast with perr {list(np.shape(perr))}"
        ) from e
    chosen = perr < eps
    if valid is not None:
        if is_concrete(valid) and np.asarray(valid).dtype != bool:
            raise ValueError(f"valid must be a boolean mask; got dtype {np.asarray(valid).dtype}")
        try:
            jnp.broadcast_shapes(shape, np.shape(valid))
        except ValueError as e:
            raise ValueError(
                f"valid shape {list(np.shape(valid))} does not broadcast with "
                f"perr {list(np.shape(perr))}"
            ) from e
        chosen = chosen & valid
    return chosen
