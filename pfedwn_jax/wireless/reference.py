"""Independent link-by-link reference for `error_probability`, with scipy.integrate.quad.

Written directly from the paper's formulas in the amplitude variable x (no code shared with
the vectorized path beyond reading `ChannelParams`), in float64 numpy/math. Used by the tests
and by benchmarks/bench_perr.py as the baseline. Needs scipy (the `test` extra).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pfedwn_jax.wireless.params import SPEED_OF_LIGHT, ChannelParams

QUAD_OPTS = {"epsabs": 1e-14, "epsrel": 1e-12, "limit": 500}


def amplitude_law(params: ChannelParams) -> Any:
    """The fading amplitude h as a frozen scipy.stats distribution with E[h^2] = Gamma.

    Rayleigh: scale sqrt(Gamma / 2); Nakagami-m: nakagami(m, scale=sqrt(Gamma)); Rician-K:
    rice(b = sqrt(2K), scale = sqrt(Gamma / (2 (K + 1)))) (R = |b + X + iY| scale, X, Y ~
    N(0, 1), so E[R^2] = scale^2 (b^2 + 2)).
    """
    from scipy import stats  # scipy: optional (test extra), imported on use

    fading = params.fading
    g, p = float(fading.gamma), float(fading.param)
    if fading.kind == "rayleigh":
        return stats.rayleigh(scale=math.sqrt(g / 2.0))
    if fading.kind == "nakagami":
        return stats.nakagami(p, scale=math.sqrt(g))
    return stats.rice(math.sqrt(2.0 * p), scale=math.sqrt(g / (2.0 * (p + 1.0))))


def _amplitude_pdf(params: ChannelParams) -> Any:
    """x -> pdf of the amplitude: the paper's eq. (2) for Rayleigh, scipy.stats otherwise."""
    if params.fading.kind == "rayleigh":
        g = float(params.fading.gamma)
        return lambda x: 2.0 * x / g * math.exp(-x * x / g)
    return amplitude_law(params).pdf


def _x_max(params: ChannelParams) -> float:
    """An amplitude beyond which the pdf's mass is negligible: h^2 = 200 Gamma (Nakagami
    m >= 1/2: P < e^{-100}; Rician: less)."""
    return math.sqrt(200.0 * float(params.fading.gamma))


def _tail_moment(power: int, weight: Any, params: ChannelParams) -> float:
    """int_beta^inf x^power * p(x) * weight(x) dx by quad (p the amplitude's pdf)."""
    from scipy.integrate import quad  # scipy: optional (test extra), imported on use

    beta, pdf = float(params.fading_threshold), _amplitude_pdf(params)
    hi = math.inf if params.fading.kind == "rayleigh" else max(_x_max(params), beta)
    val, _ = quad(lambda x: x**power * pdf(x) * weight(x), beta, hi, **QUAD_OPTS)
    return val


def _cdf(params: ChannelParams) -> Any:
    """x -> P(h < x)."""
    if params.fading.kind == "rayleigh":
        g = float(params.fading.gamma)
        return lambda x: 1.0 - math.exp(-x * x / g)
    return amplitude_law(params).cdf


def moment_coefficients(params: ChannelParams, moments: str) -> tuple[float, float]:
    """Per-unit-power mean and variance of one interferer, each mode from its definition."""
    beta, f = float(params.fading_threshold), int(params.num_subchannels)
    cdf = _cdf(params)
    q = (1.0 - cdf(beta) ** f) / f
    if moments == "physical":
        w = lambda x: cdf(x) ** (f - 1)
        ez, ez2 = _tail_moment(2, w, params), _tail_moment(4, w, params)
        return ez, ez2 - ez * ez
    m3 = _tail_moment(2, lambda x: 1.0, params)
    m5 = _tail_moment(4, lambda x: 1.0, params)
    if moments == "paper":
        # App. A as printed: sum over r1 != r2 (ordered pairs) minus E^2.
        return q * m3, q * q * m5 - q * q * m3 * m3
    if moments == "exact":
        return q * m3, q * m5 - (q * m3) ** 2
    raise ValueError(f"unknown moments mode {moments!r}")


def received_power_scale(distance: np.ndarray, params: ChannelParams) -> np.ndarray:
    """P * hhat^2 in watts per unit |h|^2 (single-slope path loss, d clamped to d0)."""
    lam = SPEED_OF_LIGHT / float(params.freq_hz)
    d0 = float(params.d0_m)
    hhat = (
        lam
        / (4.0 * math.pi * d0)
        * np.sqrt((d0 / np.maximum(distance, d0)) ** float(params.pathloss_exp))
    )
    return float(params.tx_power_w) * hhat**2


def link_integral(
    c_s: float, mean: float, var: float, gamma_th: float, params: ChannelParams
) -> float:
    """int_beta^inf p(x) v(c_s x^2/gamma_th - sigma_n^2) dx for one link, by quad."""
    from scipy.integrate import quad  # scipy: optional (test extra), imported on use

    g, beta = float(params.fading.gamma), float(params.fading_threshold)
    noise = float(params.boltzmann) * float(params.noise_temp_k) * float(params.bandwidth_hz)
    if params.fading.kind == "rayleigh":
        x_hi = math.sqrt(beta * beta + 60.0 * g)  # p(x) tail beyond: e^{-60} e^{-b}
    else:
        x_hi = max(_x_max(params), beta)
    if mean > 0:
        s2 = math.log1p(var / (mean * mean))
        mu, sig = math.log(mean) - 0.5 * s2, math.sqrt(s2)
    pdf = _amplitude_pdf(params)

    def ccdf(y: float) -> float:
        if y <= 0:
            return 1.0
        if mean <= 0:
            return 0.0
        return 0.5 * math.erfc((math.log(y) - mu) / (math.sqrt(2.0) * sig))

    # breakpoints: where the CCDF argument crosses 0 and the log-normal median / +-4 sigma
    pts = [math.sqrt(noise * gamma_th / c_s)]
    if mean > 0:
        pts += [
            math.sqrt((math.exp(mu + k * sig) + noise) * gamma_th / c_s) for k in (-4.0, 0.0, 4.0)
        ]
    pts = sorted(p for p in pts if beta < p < x_hi)
    val, _ = quad(
        lambda x: pdf(x) * ccdf(c_s * x * x / gamma_th - noise),
        beta,
        x_hi,
        points=pts or None,
        **QUAD_OPTS,
    )
    return val


def link_statistics(
    target_xy: Any,
    neighbor_xy: Any,
    params: ChannelParams,
    moments: str,
    valid: Any = None,
    shadow_db: Any = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(c_s, E[I], D[I]) in watts for one target's n links (plain loops over interferers);
    `shadow_db` [n] scales each node's received power by 10^{X/10}."""
    t = np.asarray(target_xy, float)
    nb = np.asarray(neighbor_xy, float)
    n = nb.shape[0]
    ok = np.ones(n, bool) if valid is None else np.asarray(valid, bool)
    c = received_power_scale(np.hypot(*(nb - t).T), params)
    if shadow_db is not None:
        c = c * 10.0 ** (np.asarray(shadow_db, float) / 10.0)
    m1, v1 = moment_coefficients(params, moments)
    mean, var = np.zeros(n), np.zeros(n)
    for s in range(n):
        for r in range(n):
            if r != s and ok[r]:
                mean[s] += c[r] * m1
                var[s] += c[r] ** 2 * v1
    return c, mean, var


def error_probability_reference(
    target_xy: Any,
    neighbor_xy: Any,
    gamma_th: float,
    params: ChannelParams | None = None,
    moments: str = "paper",
    valid: Any = None,
    shadow_db: Any = None,
) -> np.ndarray:
    """P_err [n] of one target's links, link by link with scipy quad (1.0 for invalid slots)."""
    params = ChannelParams() if params is None else params
    n = np.asarray(neighbor_xy).shape[0]
    ok = np.ones(n, bool) if valid is None else np.asarray(valid, bool)
    c, mean, var = link_statistics(target_xy, neighbor_xy, params, moments, ok, shadow_db)
    return np.array(
        [
            link_integral(c[s], mean[s], var[s], float(gamma_th), params) if ok[s] else 1.0
            for s in range(n)
        ]
    )
