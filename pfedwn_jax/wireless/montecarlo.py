"""Packet-level Monte Carlo of the D2D links the P_err formula approximates.

"physical": every valid neighbor draws F i.i.d. fading amplitudes (`params.fading`, one
draw function: `fading.draw_power`) towards the target,
picks its best sub-channel f* and transmits on it only if that amplitude is >= beta. The
packet of neighbor s succeeds iff s transmits and
    c_s h_s^2 / (sigma_n^2 + sum_{r != s transmitting on f*_s} c_r h_r^2) >= gamma_th.
"lognormal": the model the formula assumes: one fading amplitude h_s, log-normal
interference with the mode's mean/variance; the error event is h_s >= beta and SINR <
gamma_th (so the success rate is exactly 1 - P_err in expectation; a packet with h_s < beta
counts as a success here, as in the printed formula).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax._checks import check_choice, check_int, is_concrete
from pfedwn_jax.wireless import fading as fd
from pfedwn_jax.wireless._inputs import Links, link_inputs
from pfedwn_jax.wireless.channel import log_noise_power
from pfedwn_jax.wireless.params import ChannelParams
from pfedwn_jax.wireless.perr import (
    interference_lognormal,
    link_geometry,
    moment_coefficients,
    power_ratio_matrix,
)

INTERFERENCE_MODES = ("physical", "lognormal")

# (ln c [..., n], rel [..., n]) of `link_geometry`
Geo = tuple[Any, Any]


def best_subchannel(u: Any, params: ChannelParams) -> tuple[Any, Any, Any]:
    """(u_max, f_star, transmits) [...] of one node's F sub-channels u [..., F] = h^2 / Gamma.

    The node picks its best sub-channel f* and transmits on it iff its amplitude is >= beta,
    i.e. iff u_max >= b = beta^2 / Gamma (paper Sec. III-B).
    """
    u_max = jnp.max(u, axis=-1)
    b = params.fading_threshold**2 / params.fading.gamma
    return u_max, jnp.argmax(u, axis=-1), u_max >= b


def sinr_success(
    u_max: Any, transmits: Any, log_c: Any, interf: Any, gamma_th: Any, params: ChannelParams
) -> Any:
    """Packet success [...]: transmits and c h^2 >= gamma_th (sigma_n^2 + I).

    Both sides are divided by c Gamma: u_max = h^2 / Gamma on the chosen sub-channel, ln c
    the link's received scale, interf = I / (c Gamma) the co-channel interference.
    """
    noise = jnp.exp(log_noise_power(params) - log_c - jnp.log(params.fading.gamma))
    return transmits & (u_max >= gamma_th * (noise + interf))


def concrete_num_subchannels(params: ChannelParams, who: str) -> int:
    """F as a Python int; `ValueError` when it is traced or not a scalar (`who` needs it)."""
    if not is_concrete(params.num_subchannels) or np.ndim(params.num_subchannels) != 0:
        raise ValueError(
            f"{who} needs a concrete scalar params.num_subchannels "
            "(it sets the number of amplitudes drawn per node)"
        )
    return int(np.asarray(params.num_subchannels))


def _physical(
    key: Any, links: Links, geo: Geo, params: ChannelParams, num_draws: int, num_sub: int
) -> Any:
    """Success [num_draws, ..., n] with every node's fading and sub-channel drawn."""
    log_c, rel = geo
    gamma_th, valid = links.gamma_th, links.valid
    rho = power_ratio_matrix(rel)
    shape = (num_draws, *valid.shape, num_sub)
    u = fd.draw_power(params.fading, key, shape, log_c.dtype)  # h^2 / Gamma per sub-channel
    u_max, f_star, tx = best_subchannel(u, params)
    tx = tx & valid
    same = (f_star[..., :, None] == f_star[..., None, :]) & tx[..., None, :]
    interf = jnp.sum(jnp.where(same, rho * u_max[..., None, :], 0.0), axis=-1)  # / (c_s Gamma)
    return sinr_success(u_max, tx, log_c, interf, gamma_th[..., None], params)


def _lognormal(
    key: Any,
    links: Links,
    geo: Geo,
    params: ChannelParams,
    m1: Any,
    var1: Any,
    num_draws: int,
) -> Any:
    """Success [num_draws, ..., n] with the interference drawn from its log-normal model."""
    log_c, rel = geo
    gamma_th, valid = links.gamma_th, links.valid
    k_h, k_i = jax.random.split(key)
    mu, s2, has = interference_lognormal(rel, m1, var1)
    shape = (num_draws, *valid.shape)
    z = jax.random.normal(k_i, shape, log_c.dtype)
    interf = jnp.where(has, jnp.exp(mu + jnp.sqrt(s2) * z), 0.0)
    u = fd.draw_power(params.fading, k_h, shape, log_c.dtype)
    b = params.fading_threshold**2 / params.fading.gamma
    noise = jnp.exp(log_noise_power(params) - log_c)
    signal = params.fading.gamma * u / gamma_th[..., None]  # c_s h^2 / gamma_th, / c_s
    error = (u >= b) & (signal - noise < interf)
    return valid & ~error


def _simulate_impl(
    key: Any,
    links: Links,
    params: ChannelParams,
    m1: Any,
    var1: Any,
    num_draws: int,
    interference: str,
    num_sub: int,
) -> Any:
    _, log_c, rel = link_geometry(links.target, links.neighbor, links.valid, params, links.shadow)
    if interference == "physical":
        return _physical(key, links, (log_c, rel), params, num_draws, num_sub)
    return _lognormal(key, links, (log_c, rel), params, m1, var1, num_draws)


_simulate_jit = jax.jit(_simulate_impl, static_argnames=("num_draws", "interference", "num_sub"))


def simulate_bytes(
    num_draws: int, interference: str, num_sub: int, targets: int, n: int, itemsize: int
) -> int:
    """Device bytes of one `simulate_links` call (XLA:CPU measured): "physical" holds every
    draw's `[n, n]` interference terms and F fades per link, "lognormal" the `[n, n]`
    moment sums once and a few numbers per draw and link."""
    links = num_draws * targets * n
    if interference == "physical":
        return itemsize * links * (n + 4 * num_sub)
    return itemsize * (n * n + 8 * links)


def simulate_links(
    key: Any,
    target_xy: Any,
    neighbor_xy: Any,
    gamma_th: Any,
    num_draws: int,
    params: ChannelParams | None = None,
    valid: Any = None,
    interference: str = "physical",
    moments: str = "paper",
    shadow_db: Any = None,
) -> jax.Array:
    """Per-draw packet success of each neighbor -> target link: bool [num_draws, ..., n].

    Shapes as in `error_probability`. Draws are independent fading realisations (block
    fading: one per draw). Padded slots never succeed and never interfere. `moments` only
    matters for interference="lognormal". `shadow_db` [..., n]: each link's shadowing (dB),
    fixed over the draws (as `error_probability`'s). Memory ~ num_draws * links * F floats
    (physical); split the draws over several keys for very large runs.
    """
    params = ChannelParams() if params is None else params
    check_choice("interference", interference, INTERFERENCE_MODES)
    num_draws = check_int("num_draws", num_draws, 1, None)
    num_sub = concrete_num_subchannels(params, "simulate_links")
    footprint = functools.partial(simulate_bytes, num_draws, interference, num_sub)
    links, params = link_inputs(
        target_xy,
        neighbor_xy,
        gamma_th,
        valid,
        params,
        moments,
        footprint=footprint,
        caller=f"simulate_links ({num_draws} draws)",
        change="split the draws over several calls (keys) or give fewer links per call",
        shadow_db=shadow_db,
    )
    m1, var1 = moment_coefficients(params, moments=moments)
    return _simulate_jit(
        key,
        links,
        params,
        m1,
        var1,
        num_draws=num_draws,
        interference=interference,
        num_sub=num_sub,
    )
