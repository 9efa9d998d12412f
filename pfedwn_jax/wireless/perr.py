"""Transmission error probability P_err of every neighbor -> target link (paper eq. (6)).

P_err(s) = int_beta^inf p(x) v_s(c_s x^2 / gamma_th - sigma^2) dx, with p the Rayleigh pdf and
v_s the CCDF of the log-normal interference from all other valid neighbors (App. A).

Evaluation (see docs/wireless.md): with u = x^2/Gamma the integral is
int_b^inf e^{-u} v_s(B u - sigma^2) du, B = c_s Gamma / gamma_th. The part where the CCDF
argument is <= 0 (v_s = 1) is a closed form; the rest, in z = ln(u - sigma^2/B), is
integrated by parts into closed forms (normal CDFs) plus int exp(-e^z) phi((z - m)/sigma) dz
over a short interval, done by one Gauss-Legendre rule for all links at once (two
exponentials per node). Truncations cost < 1e-17.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import erfc

from pfedwn_jax._checks import check_int
from pfedwn_jax.wireless import fading as fd
from pfedwn_jax.wireless._inputs import Links, link_inputs
from pfedwn_jax.wireless.channel import (
    interferer_moments,
    log_noise_power,
    log_received_scale,
    lognormal_from_moments,
)
from pfedwn_jax.wireless.params import SPEED_OF_LIGHT, ChannelParams
from pfedwn_jax.wireless.quadrature import integrate

# Gauss-Legendre nodes per link when num_nodes is None. "Easy" calls are those where every
# link keeps s0 = b - kappa >= 1 (so the integration interval stays short): all of Table I
# in the 50 m square. There the quadrature error is < 5e-12 at 16 nodes (~1e-7 at 10,
# far below float32 rounding). Other regimes (beta near 0, links noise-limited at
# x = beta, traced inputs) get 48 nodes (< 1e-12 in our stress tests); see docs/wireless.md.
EASY_NODES = {"float32": 10, "float64": 16}
ROBUST_NODES = 48
_EASY_FIELDS = (
    "freq_hz",
    "tx_power_w",
    "d0_m",
    "pathloss_exp",
    "boltzmann",
    "noise_temp_k",
    "bandwidth_hz",
    "fading_threshold",
)
_TAIL = 40.0  # 1 - G(ln(s0 + 40)) < e^{-40} ~ 4e-18
_Z = 9.0  # Phi_c(9) ~ 1e-19: Gaussian tails dropped
_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


def link_geometry(
    target: Any, neighbor: Any, valid: Any, params: ChannelParams, shadow_db: Any = None
) -> tuple[Any, Any, Any]:
    """Distances d [..., n], ln c [..., n] and relative powers rel [..., n].

    c_j = P hhat_j^2 is node j's received power scale at the target (times 10^{X_j/10} with
    `shadow_db` X [..., n], the shadowing of each node -> target link; None: none);
    rel_j = c_j / max_valid c (0 for invalid slots), so power ratios never underflow.
    """
    dx = neighbor[..., 0] - target[..., None, 0]
    dy = neighbor[..., 1] - target[..., None, 1]
    d2 = dx * dx + dy * dy  # (explicit: XLA reduces a size-2 minor axis slowly on CPU)
    # ln c from the squared distance (one log, no sqrt on the hot path)
    log_c = log_received_scale(params.d0_m, params) - 0.5 * params.pathloss_exp * (
        jnp.log(jnp.maximum(d2, params.d0_m**2)) - 2.0 * jnp.log(params.d0_m)
    )
    if shadow_db is not None:
        log_c = log_c + fd.db_to_log(shadow_db)
    d = jnp.sqrt(d2)
    top = jnp.max(jnp.where(valid, log_c, -jnp.inf), axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)  # no valid node at all
    rel = jnp.where(valid, jnp.exp(log_c - top), 0.0)
    return d, log_c, rel


def _others(n: int) -> Any:
    return ~jnp.eye(n, dtype=bool)


def interference_ratios(rel: Any) -> tuple[Any, Any]:
    """(sum_{r != s} c_r / c_s, sum_{r != s} (c_r / c_s)^2) per link s; shapes [..., n].

    The sums over others are products with the all-ones-but-diagonal matrix (exact: no
    total-minus-own cancellation), in full precision on every backend.
    """
    others = _others(rel.shape[-1]).astype(rel.dtype)
    both = jnp.stack([rel, rel * rel], axis=-2)  # [..., 2, n]
    sums = jnp.matmul(both, others, precision=jax.lax.Precision.HIGHEST)
    s1, s2 = sums[..., 0, :], sums[..., 1, :]
    own = jnp.maximum(rel, jnp.finfo(rel.dtype).tiny)
    return s1 / own, s2 / (own * own)


def power_ratio_matrix(rel: Any) -> Any:
    """rho [..., n, n]: rho[s, r] = c_r / c_s for r != s (0 on the diagonal / invalid r)."""
    own = jnp.maximum(rel, jnp.finfo(rel.dtype).tiny)
    return jnp.where(_others(rel.shape[-1]), rel[..., None, :] / own[..., :, None], 0.0)


def interference_lognormal(rel: Any, m1: Any, var1: Any) -> tuple[Any, Any, Any]:
    """(mu, sigma^2, has) [..., n] of each link's log-normal interference I_s / c_s.

    E[I_s] / c_s = m1 sum_{r != s} c_r / c_s and D[I_s] / c_s^2 = var1 sum_{r != s} (c_r /
    c_s)^2, with (m1, var1) from `moment_coefficients`; see `lognormal_from_moments` for has.
    """
    s1, s2 = interference_ratios(rel)
    return lognormal_from_moments(m1 * s1, var1 * s2)


def _moments_impl(params: ChannelParams, moments: str) -> tuple[Any, Any]:
    dtype = jnp.asarray(params.fading.gamma).dtype
    return interferer_moments(params, moments, dtype)


# The mode only changes two scalars: computing them apart lets one compiled P_err core serve
# every mode.
moment_coefficients = jax.jit(_moments_impl, static_argnames="moments")


def _perr_impl(links: Links, params: ChannelParams, m1: Any, var1: Any, num_nodes: int) -> Any:
    _, log_c, rel = link_geometry(links.target, links.neighbor, links.valid, params, links.shadow)
    mu, s2, has_intf = interference_lognormal(rel, m1, var1)
    return perr_from_lognormal(
        log_c, (mu, s2, has_intf), links.gamma_th[..., None], links.valid, params, num_nodes
    )


def perr_from_lognormal(
    log_c: Any,
    interference: tuple[Any, Any, Any],
    gamma_th: Any,
    valid: Any,
    params: ChannelParams,
    num_nodes: int,
) -> Any:
    """P_err [...] of links with ln c_s `log_c` [...] and interference I_s / c_s log-normal.

    `interference` is `(mu, sigma^2, has)` [...] of I_s / c_s (`lognormal_from_moments`);
    `gamma_th` broadcasts against `log_c`; invalid links get 1. Shared by the dense path
    (every other node interferes) and `sparse_error_probability` (truncated interferer sets).
    Rayleigh fading (the paper's) has the closed forms below; other models take
    `perr_any_fading`.
    """
    if params.fading.kind != "rayleigh":
        return perr_any_fading(log_c, interference, gamma_th, valid, params, num_nodes)
    mu, s2, has_intf = interference
    dtype = log_c.dtype
    sigma = jnp.sqrt(jnp.maximum(s2, jnp.finfo(dtype).tiny))
    gamma = params.fading.gamma
    g = gamma_th
    # log-normal location relative to B = c_s Gamma / gamma_th, and kappa = sigma_n^2 / B.
    m = mu - jnp.log(gamma / g)
    kappa = jnp.exp(log_noise_power(params) + jnp.log(g) - jnp.log(gamma) - log_c)
    b = params.fading_threshold**2 / gamma
    p_noise = jnp.maximum(jnp.exp(-b) - jnp.exp(-kappa), 0.0)  # u in [b, kappa]: arg <= 0
    s0 = jnp.maximum(b - kappa, 0.0)
    # I = int_{ln s0}^inf G'(z) Phi_c(w(z)) dz, G(z) = 1 - exp(-e^z), w = (z - m) / sigma
    #   = -G(ln s0) Phi_c(w(ln s0)) + int_{ln s0}^inf G(z) phi(w(z)) / sigma dz   (by parts).
    # The Gaussian confines the last integrand to [lo, hi] within m +- Z sigma, G == 1 beyond
    # top = ln(s0 + T), and int G phi = int phi - int exp(-e^z) phi, the first a closed form;
    # so the quadrature only sees exp(-e^z - w^2/2): two exponentials per node.
    inv = 1.0 / sigma
    log_s0 = jnp.log(s0)  # -inf when the noise alone fails the link at x = beta
    top = jnp.log(s0 + _TAIL)
    lo = jnp.maximum(log_s0, m - _Z * sigma)
    hi = jnp.maximum(lo, jnp.minimum(top, m + _Z * sigma))
    ccdf = lambda z: 0.5 * erfc((z - m) * (inv * _SQRT_HALF))
    c_s0, c_top = ccdf(log_s0), ccdf(top)  # Phi_c at -Z / +Z sigma is 1 / 0 (to 1e-19)
    c_lo = jnp.where(log_s0 >= m - _Z * sigma, c_s0, 1.0)
    c_hi = jnp.where(hi <= lo, c_lo, jnp.where(top <= m + _Z * sigma, c_top, 0.0))
    closed = jnp.expm1(-s0) * c_s0 + jnp.where(top >= lo, c_top, c_lo) + c_lo - c_hi
    m_, inv_ = m[..., None], inv[..., None]

    def integrand(z: Any) -> Any:  # z: [..., n, num_nodes]
        return jnp.exp(-jnp.exp(z) - 0.5 * jnp.square((z - m_) * inv_))

    quad = integrate(
        integrand, jnp.where(has_intf, lo, 0.0), jnp.where(has_intf, hi, 0.0), num_nodes, dtype
    ) * (inv * _INV_SQRT_2PI)
    perr = jnp.where(has_intf, p_noise + jnp.exp(-kappa) * (closed - quad), p_noise)
    return jnp.where(valid, jnp.clip(perr, 0.0, 1.0), 1.0)


def perr_any_fading(
    log_c: Any,
    interference: tuple[Any, Any, Any],
    gamma_th: Any,
    valid: Any,
    params: ChannelParams,
    num_nodes: int,
) -> Any:
    """`perr_from_lognormal` for any fading law S(u) = P(u' >= u) (`fading.survival`).

    With B = c_s Gamma / gamma_th, kappa = sigma_n^2 / B, u0 = max(b, kappa), s0 = u0 - kappa
    and w(z) = (z - m) / sigma (ln(I / B) ~ N(m, sigma^2)):
      P_err = [S(b) - S(kappa)]^+ + S(u0) Phi_c(w(ln s0)) - int_{ln s0}^inf S(e^z + kappa)
              phi(w(z)) / sigma dz,
    the integral (by parts of int f(y + kappa) Phi_c(w(ln y)) dy) by one Gauss-Legendre rule
    over z in [m - Z sigma, m + Z sigma] cut at ln s0 and at ln(s0 + T) (`fading.tail_span`).
    """
    fading = params.fading
    mu, s2, has_intf = interference
    dtype = log_c.dtype
    sigma = jnp.sqrt(jnp.maximum(s2, jnp.finfo(dtype).tiny))
    gamma = fading.gamma
    m = mu - jnp.log(gamma / gamma_th)
    kappa = jnp.exp(log_noise_power(params) + jnp.log(gamma_th) - jnp.log(gamma) - log_c)
    b = params.fading_threshold**2 / gamma
    surv = lambda u: fd.survival(fading, u)
    p_noise = jnp.maximum(surv(b) - surv(kappa), 0.0)  # u in [b, kappa]: SINR < gamma_th
    u0 = jnp.maximum(b, kappa)
    s0 = u0 - kappa
    log_s0 = jnp.log(s0)  # -inf when the noise alone fails the link at x = beta
    top = jnp.log(s0 + fd.tail_span(fading))
    lo = jnp.maximum(log_s0, m - _Z * sigma)
    hi = jnp.maximum(lo, jnp.minimum(top, m + _Z * sigma))
    inv = 1.0 / sigma
    first = surv(u0) * 0.5 * erfc((log_s0 - m) * (inv * _SQRT_HALF))
    m_, inv_, k_ = m[..., None], inv[..., None], kappa[..., None]

    def integrand(z: Any) -> Any:  # z: [..., n, num_nodes]
        return surv(jnp.exp(z) + k_) * jnp.exp(-0.5 * jnp.square((z - m_) * inv_))

    quad = integrate(
        integrand, jnp.where(has_intf, lo, 0.0), jnp.where(has_intf, hi, 0.0), num_nodes, dtype
    ) * (inv * _INV_SQRT_2PI)
    perr = jnp.where(has_intf, p_noise + first - quad, p_noise)
    return jnp.where(valid, jnp.clip(perr, 0.0, 1.0), 1.0)


_perr_jit = jax.jit(_perr_impl, static_argnames="num_nodes")


def error_probability(
    target_xy: Any,
    neighbor_xy: Any,
    gamma_th: Any,
    params: ChannelParams | None = None,
    moments: str = "paper",
    valid: Any = None,
    *,
    num_nodes: int | None = None,
    shadow_db: Any = None,
) -> jax.Array:
    """P_err of each neighbor -> target link; shape [..., n].

    Args:
      target_xy: [..., 2] target positions (m).
      neighbor_xy: [..., n, 2] neighbor positions (m); batch dims broadcast with target_xy's.
      gamma_th: SINR threshold (linear, > 0), scalar or broadcastable to the batch dims [...].
      params: channel constants (Table I defaults).
      moments: "paper" (App. A as printed), "exact" or "physical"; see docs/wireless.md.
      valid: optional bool [..., n]; invalid (padded) slots do not interfere and get P_err 1.
      num_nodes: Gauss-Legendre nodes per link; default: see `default_num_nodes`.
      shadow_db: optional [..., n] shadowing (dB) of each neighbor -> target link (e.g.
        `fading.shadowing_db` of the pairs): it scales that node's received power at the
        target, as a link and as an interferer. None: no shadowing.

    Inputs are validated on the host; the work is one cached jitted call (no recompilation
    for repeated shapes and dtypes).
    """
    params = ChannelParams() if params is None else params
    if num_nodes is not None:
        num_nodes = check_int("num_nodes", num_nodes, 2, 4096)
    links, params = link_inputs(
        target_xy,
        neighbor_xy,
        gamma_th,
        valid,
        params,
        moments,
        footprint=perr_bytes,
        shadow_db=shadow_db,
    )
    if num_nodes is None:
        num_nodes = default_num_nodes(
            target_xy, neighbor_xy, gamma_th, params, jnp.dtype(links.target.dtype).name
        )
    m1, var1 = moment_coefficients(params, moments=moments)
    return _perr_jit(links, params, m1, var1, num_nodes=num_nodes)


def perr_bytes(targets: int, n: int, itemsize: int) -> int:
    """Device bytes of one `error_probability` call of `targets` x `n` links: the `[n, n]`
    interference-sum matrix plus about 24 numbers per link (XLA:CPU measured n^2 + 20 T n;
    the quadrature's nodes are fused)."""
    return itemsize * (n * n + 24 * targets * n)


def default_num_nodes(
    target_xy: Any, neighbor_xy: Any, gamma_th: Any, params: ChannelParams, dtype_name: str
) -> int:
    """Node count for a call: `EASY_NODES[dtype]` if provably easy, else `ROBUST_NODES`.

    Easy means min over links of s0 = b - kappa is >= 1, checked on the host with the
    weakest possible link (a bound on the points' bounding-box diagonal) and the largest
    gamma_th. Any traced input, fading other than Rayleigh or shadowing makes the call "not
    provably easy".
    """
    if params.fading.kind != "rayleigh":
        return ROBUST_NODES
    try:
        if np.any(np.asarray(params.shadowing_db) != 0):
            return ROBUST_NODES
        coords = [np.asarray(x, float).ravel() for x in (target_xy, neighbor_xy)]
        g_max = float(np.max(np.asarray(gamma_th, float)))
        f = {k: np.asarray(getattr(params, k), float) for k in _EASY_FIELDS}
        f["rayleigh_gamma"] = np.asarray(params.fading.gamma, float)
    except Exception:  # tracers
        return ROBUST_NODES
    # a cheap bound: sqrt(2) x the spread of all coordinates >= the bounding-box diagonal
    span = max(float(c.max()) for c in coords) - min(float(c.min()) for c in coords)
    d_max = math.sqrt(2.0) * span
    lam = SPEED_OF_LIGHT / f["freq_hz"]
    c_min = (
        f["tx_power_w"]
        * (lam / (4 * np.pi * f["d0_m"])) ** 2
        * (f["d0_m"] / np.maximum(d_max, f["d0_m"])) ** f["pathloss_exp"]
    )
    noise = f["boltzmann"] * f["noise_temp_k"] * f["bandwidth_hz"]
    b = f["fading_threshold"] ** 2 / f["rayleigh_gamma"]
    s0_min = np.min(b - g_max * noise / (c_min * f["rayleigh_gamma"]))
    return EASY_NODES[dtype_name] if s0_min >= 1.0 else ROBUST_NODES
