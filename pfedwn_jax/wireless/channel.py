"""Building blocks of the link model (paper Sec. III-B and App. A), all elementwise in jnp.

Notation: h is the fading amplitude of `params.fading` (the paper's Rayleigh: pdf 2x/Gamma
exp(-x^2/Gamma), h^2 exponential with mean Gamma), u = h^2 / Gamma its normalised power,
beta the fading threshold, b = beta^2/Gamma, F the number of sub-channels, c_r = P_r hhat_r^2
the mean-free received power scale of node r. What depends on the fading law goes through
`wireless.fading` (its survival function, density and threshold moments).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax.scipy.special import erfc

from pfedwn_jax.wireless import fading as fd
from pfedwn_jax.wireless.params import ChannelParams
from pfedwn_jax.wireless.quadrature import integrate_panels

MOMENT_MODES = ("paper", "exact", "physical")

# Panels (offsets from b, in units of u = x^2/Gamma) for the best-sub-channel moments; the
# integrand decays like u^2 e^{-u}, so the tail beyond b + 56 is below 1e-20.
_BEST_PANELS = (0.0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5, 56.0)
_BEST_NODES = 24


def path_gain(distance: Any, params: ChannelParams) -> Any:
    """hhat^2 = (lambda / (4 pi d0))^2 (d0 / d)^alpha, distances below d0 clamped to d0."""
    d = jnp.maximum(distance, params.d0_m)
    k = (params.wavelength_m / (4.0 * jnp.pi * params.d0_m)) ** 2
    return k * (params.d0_m / d) ** params.pathloss_exp


def log_received_scale(distance: Any, params: ChannelParams) -> Any:
    """ln(P hhat^2): `path_gain` times transmit power, in the log domain (no underflow)."""
    d = jnp.maximum(distance, params.d0_m)
    log_k = 2.0 * (jnp.log(params.wavelength_m) - jnp.log(4.0 * jnp.pi * params.d0_m))
    return (
        jnp.log(params.tx_power_w)
        + log_k
        + params.pathloss_exp * (jnp.log(params.d0_m) - jnp.log(d))
    )


def log_noise_power(params: ChannelParams) -> Any:
    """ln(kappa T W): the thermal noise power sigma_n^2 in the log domain."""
    return jnp.log(params.boltzmann) + jnp.log(params.noise_temp_k) + jnp.log(params.bandwidth_hz)


def rayleigh_pdf(x: Any, gamma: Any) -> Any:
    """Paper eq. (2): 2x/Gamma exp(-x^2/Gamma) for x >= 0, 0 below."""
    return jnp.where(x >= 0, 2.0 * x / gamma * jnp.exp(-(x * x) / gamma), 0.0)


def transmit_probability(params: ChannelParams) -> Any:
    """q = (1/F)(1 - (1 - e^{-b})^F): P(a node transmits on one given sub-channel).

    A node transmits on its best sub-channel iff the largest of its F amplitudes is
    >= beta (probability F q); by symmetry each sub-channel is the chosen one with
    probability 1/F.
    """
    b = params.fading_threshold**2 / params.fading.gamma
    f = params.num_subchannels
    log_all_below = f * jnp.log1p(-fd.survival(params.fading, b))  # ln P(u < b)^F
    return -jnp.expm1(log_all_below) / f


def threshold_moments(params: ChannelParams) -> tuple[Any, Any]:
    """(E[h^2 1{h>=beta}], E[h^4 1{h>=beta}]) for one fading amplitude (`fading.threshold_moments`).

    For Rayleigh these are the App. A integrals int_beta^inf 2x^3/Gamma e^{-x^2/Gamma} dx =
    Gamma (b+1) e^{-b} and int_beta^inf 2x^5/Gamma e^{-x^2/Gamma} dx = Gamma^2 (b^2+2b+2) e^{-b}.
    """
    return fd.threshold_moments(params.fading, params.fading_threshold)


def best_channel_moments(params: ChannelParams, dtype: Any = None) -> tuple[Any, Any]:
    """(E[Z], E[Z^2]) for Z = h_f^2 1{f is the argmax of F amplitudes and h_f >= beta}.

    E[Z^k] = Gamma^k int_b^inf u^k p(u) P(u' < u)^{F-1} du (p the normalised power's density;
    Rayleigh: e^{-u}, (1 - e^{-u})^{F-1}), by composite Gauss-Legendre (a positive integrand:
    no cancellation, unlike the alternating binomial closed form).
    """
    g = jnp.asarray(params.fading.gamma, dtype)
    dtype = g.dtype
    b = jnp.asarray(params.fading_threshold, dtype) ** 2 / g
    f = jnp.asarray(params.num_subchannels, dtype)
    if params.fading.kind != "rayleigh":
        fading = params.fading

        def best(u: Any) -> Any:  # P(the other F - 1 sub-channels are below u)
            return jnp.exp((f[..., None, None] - 1.0) * jnp.log1p(-fd.survival(fading, u)))

        j1 = fd.tail_integral(fading, lambda u: u * best(u), b, dtype)
        return g * j1, g * g * fd.tail_integral(fading, lambda u: u * u * best(u), b, dtype)
    edges = b[..., None] + jnp.asarray(_BEST_PANELS, dtype)

    def weight(u: Any) -> Any:
        return jnp.exp(-u + (f[..., None, None] - 1.0) * jnp.log1p(-jnp.exp(-u)))

    j1 = integrate_panels(lambda u: u * weight(u), edges, _BEST_NODES, dtype)
    j2 = integrate_panels(lambda u: u * u * weight(u), edges, _BEST_NODES, dtype)
    return g * j1, g * g * j2


def interferer_moments(
    params: ChannelParams, moments: str = "paper", dtype: Any = None
) -> tuple[Any, Any]:
    """Mean and variance of one interferer's contribution per unit received scale c_r.

    Interferer r adds c_r * X_r to the target's sub-channel; the interference sums are
    E[I] = sum_r c_r mean and D[I] = sum_r c_r^2 var (independent interferers). Modes:
      "paper":    mean = q M3, var = q^2 (M5 - M3^2)      (App. A as printed)
      "exact":    mean = q M3, var = q M5 - q^2 M3^2      (X = A Y, A ~ Bern(q) indep. of
                                                         Y = h^2 1{h >= beta})
      "physical": mean = E[Z], var = E[Z^2] - E[Z]^2    (Z: see `best_channel_moments`)
    with M3, M5 from `threshold_moments` and q from `transmit_probability`.
    """
    if moments == "physical":
        m1, m2 = best_channel_moments(params, dtype)
        return m1, m2 - m1 * m1
    q = transmit_probability(params)
    m3, m5 = threshold_moments(params)
    if moments == "paper":
        return q * m3, q * q * (m5 - m3 * m3)
    if moments == "exact":
        return q * m3, q * m5 - (q * m3) ** 2
    raise ValueError(f"moments must be one of {list(MOMENT_MODES)}; got {moments!r}")


def lognormal_from_moments(mean: Any, var: Any) -> tuple[Any, Any, Any]:
    """(mu, sigma^2, has) of the log-normal with the given mean and variance (App. A).

    mu = ln E - sigma^2 / 2, sigma^2 = ln(1 + D / E^2), elementwise over `[...]`.
    has = mean > 0: a link with no interferer (mean 0) has no log-normal; there mu and
    sigma^2 are those of mean 1, variance 1, finite placeholders so that neither the value
    nor its gradient turns NaN, and callers select with `has`.
    """
    has = mean > 0
    mean_safe = jnp.where(has, mean, 1.0)
    s2 = jnp.log1p(jnp.where(has, var, 1.0) / (mean_safe * mean_safe))
    return jnp.log(mean_safe) - 0.5 * s2, s2, has


def lognormal_params(mean: Any, var: Any) -> tuple[Any, Any]:
    """(mu, sigma) of the log-normal with the given mean and variance; NaN where mean <= 0."""
    mu, s2, has = lognormal_from_moments(mean, var)
    return jnp.where(has, mu, jnp.nan), jnp.where(has, jnp.sqrt(s2), jnp.nan)


def interference_ccdf(x: Any, mu: Any, sigma: Any) -> Any:
    """v_s(x) = P(I > x) for log-normal I: 1 for x <= 0, else erfc((ln x - mu)/(sqrt2 sigma))/2."""
    pos = x > 0
    safe = jnp.where(pos, x, 1.0)
    v = 0.5 * erfc((jnp.log(safe) - mu) / (jnp.sqrt(2.0) * sigma))
    return jnp.where(pos, v, 1.0)
