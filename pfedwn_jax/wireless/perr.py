"""Transmission error probability P_err of every neighbor -> target link (paper eq. (6)).

P_err(s) = int_beta^inf p(x) v_s(c_s x^2 / gamma_th - sigma^2) dx, with p the Rayleigh pdf and
v_s the CCDF of the log-normal interference from all other valid neighbors (App. A).

Evaluation (see docs/wireless.md): with u = x^2/Gamma the integral is
int_b^inf e^{-u} v_s(B u - sigma^2) du, B = c_s Gamma / gamma_th. The part where the CCDF
argument is <= 0 (v_s = 1) and the part where the log-normal CCDF is 1 to within 1e-19 are
closed forms; the rest is mapped to zeta = ln(u - sigma^2/B), where the integrand
exp(zeta - e^zeta) Phi_c((zeta - m)/sigma) is smooth and confined to a short interval, and
done by one Gauss-Legendre rule for all links at once. Truncations cost < 1e-17.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.scipy.special import erfc

from pfedwn_jax._checks import check_int
from pfedwn_jax.wireless._inputs import link_inputs
from pfedwn_jax.wireless.channel import interferer_moments, log_received_scale
from pfedwn_jax.wireless.params import ChannelParams
from pfedwn_jax.wireless.quadrature import integrate

DEFAULT_NODES = 48
_TAIL = 40.0  # e^{-40} ~ 4e-18: truncation of exponential tails
_Z = 9.0  # Phi_c(9) ~ 1e-19: where the log-normal CCDF is taken as 0 / 1


def link_geometry(target: Any, neighbor: Any, valid: Any, params: ChannelParams
                  ) -> tuple[Any, Any, Any]:
    """Distances d [..., n], ln c [..., n] and interference weights rho [..., n, n].

    rho[s, r] = c_r / c_s for valid r != s (0 otherwise): received power of interferer r
    relative to the signal of link s, computed from log distances (no underflow).
    """
    d = jnp.linalg.norm(neighbor - target[..., None, :], axis=-1)
    log_c = log_received_scale(d, params)
    n = d.shape[-1]
    mask = valid[..., None, :] & ~jnp.eye(n, dtype=bool)
    rho = jnp.where(mask, jnp.exp(log_c[..., None, :] - log_c[..., :, None]), 0.0)
    return d, log_c, rho


def _moments_impl(params: ChannelParams, moments: str) -> tuple[Any, Any]:
    dtype = jnp.asarray(params.rayleigh_gamma).dtype
    return interferer_moments(params, moments, dtype)


# The mode only changes two scalars: computing them apart lets one compiled P_err core serve
# every mode.
moment_coefficients = jax.jit(_moments_impl, static_argnames="moments")


def _perr_impl(target: Any, neighbor: Any, gamma_th: Any, valid: Any,
               params: ChannelParams, m1: Any, var1: Any, num_nodes: int) -> Any:
    dtype = target.dtype
    _, log_c, rho = link_geometry(target, neighbor, valid, params)
    mean = m1 * jnp.sum(rho, axis=-1)  # E[I] / c_s
    var = var1 * jnp.sum(rho * rho, axis=-1)  # D[I] / c_s^2
    has_intf = mean > 0
    mean_safe = jnp.where(has_intf, mean, 1.0)
    s2 = jnp.log1p(jnp.where(has_intf, var, 1.0) / (mean_safe * mean_safe))
    sigma = jnp.sqrt(jnp.maximum(s2, jnp.finfo(dtype).tiny))
    gamma = params.rayleigh_gamma
    g = gamma_th[..., None]
    # ln I-location relative to B = c_s Gamma / gamma_th, and kappa = sigma_n^2 / B.
    m = jnp.log(mean_safe) - 0.5 * s2 - jnp.log(gamma / g)
    log_noise = (jnp.log(params.boltzmann) + jnp.log(params.noise_temp_k)
                 + jnp.log(params.bandwidth_hz))
    kappa = jnp.exp(log_noise + jnp.log(g) - jnp.log(gamma) - log_c)
    b = params.fading_threshold**2 / gamma
    p_noise = jnp.maximum(jnp.exp(-b) - jnp.exp(-kappa), 0.0)  # u in [b, kappa]: arg <= 0
    s0 = jnp.maximum(b - kappa, 0.0)
    log_s0 = jnp.log(s0)  # -inf when the noise alone fails the link at x = beta
    z_hi = jnp.maximum(jnp.minimum(jnp.log(s0 + _TAIL), m + _Z * sigma), log_s0)
    z_c = jnp.clip(m - _Z * sigma, log_s0, z_hi)  # below: CCDF == 1 (closed form)
    closed = jnp.exp(-s0) - jnp.exp(-jnp.exp(z_c))
    z_a = jnp.maximum(z_c, -_TAIL)

    def integrand(z: Any) -> Any:
        return jnp.exp(z - jnp.exp(z)) * 0.5 * erfc(
            (z - m[..., None]) / (jnp.sqrt(2.0) * sigma[..., None]))

    quad = integrate(integrand, jnp.where(has_intf, z_a, 0.0),
                     jnp.where(has_intf, z_hi, 0.0), num_nodes, dtype)
    perr = jnp.where(has_intf, p_noise + jnp.exp(-kappa) * (closed + quad), p_noise)
    return jnp.where(valid, jnp.clip(perr, 0.0, 1.0), 1.0)


_perr_jit = jax.jit(_perr_impl, static_argnames="num_nodes")


def error_probability(target_xy: Any, neighbor_xy: Any, gamma_th: Any,
                      params: ChannelParams | None = None, moments: str = "paper",
                      valid: Any = None, *, num_nodes: int = DEFAULT_NODES) -> jax.Array:
    """P_err of each neighbor -> target link; shape [..., n].

    Args:
      target_xy: [..., 2] target positions (m).
      neighbor_xy: [..., n, 2] neighbor positions (m); batch dims broadcast with target_xy's.
      gamma_th: SINR threshold (linear, > 0), scalar or broadcastable to the batch dims [...].
      params: channel constants (Table I defaults).
      moments: "paper" (App. A as printed), "exact" or "physical"; see docs/wireless.md.
      valid: optional bool [..., n]; invalid (padded) slots do not interfere and get P_err 1.
      num_nodes: Gauss-Legendre nodes per link.

    Inputs are validated on the host; the work is one cached jitted call (no recompilation
    for repeated shapes and dtypes).
    """
    params = ChannelParams() if params is None else params
    num_nodes = check_int("num_nodes", num_nodes, 2, 4096)
    target, neighbor, gamma, valid_arr, params = link_inputs(
        target_xy, neighbor_xy, gamma_th, valid, params, moments)
    m1, var1 = moment_coefficients(params, moments=moments)
    return _perr_jit(target, neighbor, gamma, valid_arr, params, m1, var1, num_nodes=num_nodes)


