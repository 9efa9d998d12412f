"""Channel-aware neighbor selection: keep neighbors whose P_err is below eps (paper Alg. 1)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax._checks import check_choice, check_finite, check_range, is_concrete
from pfedwn_jax.wireless.channel import MOMENT_MODES
from pfedwn_jax.wireless.fading import survival
from pfedwn_jax.wireless.params import ChannelParams


def perr_ceiling(params: ChannelParams | None = None, moments: str = "paper") -> float:
    """The largest value `error_probability` can take in moment mode `moments`.

    P_err integrates the fading pdf over x >= beta times an interference CCDF <= 1, so it
    never exceeds P(h >= beta) (Rayleigh: exp(-beta^2 / Gamma), 0.1353 with Table I;
    `fading.survival` of the others), and far links approach it. The moment mode only
    shapes the CCDF, so the ceiling is the same in "paper",
    "exact" and "physical" (docs/wireless.md). Any `eps` above it selects every neighbor:
    selection with such an `eps` is no selection.
    """
    params = ChannelParams() if params is None else params
    if not isinstance(params, ChannelParams):
        raise ValueError(f"params must be a ChannelParams; got {type(params).__name__}")
    check_choice("moments", moments, MOMENT_MODES)
    beta = np.asarray(params.fading_threshold, float)
    gamma = np.asarray(params.fading.gamma, float)
    if params.fading.kind == "rayleigh":
        return float(np.max(np.exp(-(beta * beta) / gamma)))  # arrays of params: the largest
    return float(np.max(np.asarray(survival(params.fading, jnp.asarray(beta * beta / gamma)))))


def eps_ceiling_message(eps: float, params: ChannelParams | None, moments: str) -> str | None:
    """A sentence saying `eps` lies above `perr_ceiling` (so every neighbor is selected), or
    None when it does not."""
    ceiling = perr_ceiling(params, moments)
    if eps <= ceiling:
        return None
    return (
        f"eps={eps:g} is above {ceiling:.4f}, the largest P_err of the formula "
        f"(P(h >= beta), moments={moments!r}): every neighbor in range is selected, "
        f"as without selection; choose eps <= {ceiling:.4f} to select by channel quality"
    )


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
