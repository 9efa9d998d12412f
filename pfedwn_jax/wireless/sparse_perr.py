"""P_err of candidate links only, with the interference sum truncated to nearby nodes.

Link j -> i (j = idx[i, k]) is interfered by the interferer set R_i of its receiver minus j:
  "all":     every node but i (the dense `network_perr`; O(N K N) work, small networks);
  "radius":  the nodes within `cutoff` metres of i (but i);
  "nearest": the `num_interferers` nodes nearest to i (so links inside that set have one
             interferer fewer: j is excluded from the sums, not replaced).
Per link the sums sum_{r in R_i, r != j} c_r / c_j and (c_r / c_j)^2 give the log-normal
interference (App. A), and the same closed forms + Gauss-Legendre quadrature as
`error_probability` give P_err. One jitted program maps over chunks of receivers, so memory is
O(chunk K I) on top of the O(N K + N I) index lists; no [N, N] array at any N.

Dropping the far nodes biases the interference low (with path-loss exponent 3 the far sum
falls only like 1/cutoff); tail="mean" adds their expected contribution instead: the nodes
beyond each receiver's cutoff as a uniform density over the bounding box (`far_field_sums`),
10-25x smaller P_err errors at the same cutoff (docs/wireless.md).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax._checks import check_choice, check_finite, check_float, check_int, check_range
from pfedwn_jax.devices import check_device_bytes
from pfedwn_jax.wireless._inputs import float_dtype
from pfedwn_jax.wireless.channel import (
    MOMENT_MODES,
    log_received_scale,
    lognormal_from_moments,
)
from pfedwn_jax.wireless.fading import db_to_log, shadowing_db
from pfedwn_jax.wireless.neighbors import candidate_neighbors, check_positions
from pfedwn_jax.wireless.params import ChannelParams
from pfedwn_jax.wireless.perr import (
    default_num_nodes,
    link_geometry,
    moment_coefficients,
    perr_from_lognormal,
)

CUTOFF_MODES = ("all", "radius", "nearest")
# [chunk, K, I] floats per step of the map over receivers
CHUNK_ELEMENTS = 1 << 21
TAIL_MODES = ("none", "mean")
_TAIL_ANGLES = 256  # midpoint rule over the direction in `far_field_sums`


def interferer_sets(
    positions: Any,
    interference: str = "all",
    *,
    cutoff: float | None = None,
    num_interferers: int | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The interferer set R_i of every receiver: `(idx [N, I] int32, mask [N, I])`, or None
    for "all" (every other node; never materialised). See the module docstring."""
    xy = check_positions(positions)
    interference = check_choice("interference", interference, CUTOFF_MODES)
    if interference != "radius" and cutoff is not None:
        raise ValueError(f"cutoff applies to interference='radius' only; got {cutoff!r}")
    if interference != "nearest" and num_interferers is not None:
        raise ValueError(
            f"num_interferers applies to interference='nearest' only; got {num_interferers!r}"
        )
    if interference == "radius":
        if cutoff is None:
            raise ValueError("interference='radius' needs cutoff (metres, > 0)")
        cutoff = check_float("cutoff", cutoff, 0.0, None, low_inclusive=False)
        return candidate_neighbors(xy, radius=cutoff)
    if interference == "nearest":
        if num_interferers is None:
            raise ValueError("interference='nearest' needs num_interferers (an integer >= 1)")
        k = check_int("num_interferers", num_interferers, 1, len(xy) - 1)
        return candidate_neighbors(xy, k=k)
    return None


def _interference(
    log_c: Any, log_ci: Any, use: Any, tail: Any, m1: Any, var1: Any, sigma_db: Any = 0.0
) -> tuple[Any, Any, Any]:
    """(mu, sigma^2, has) [C, K] of I / c_s from ln c of links [C, K] and interferers [C, I].

    Powers are taken relative to each receiver's strongest interferer (no overflow for far
    links); `use` [C, K, I] selects the interferers of each link (masked sums, no
    total-minus-own cancellation); `tail` is None or (ln sum c, ln sum c^2) [C] of the
    mean-field far nodes (`far_field_sums`), added to every link of the receiver, their
    unknown shadowing of deviation `sigma_db` averaged (`_shadowed_tail`).
    """
    top = jnp.max(jnp.where(use, log_ci[:, None, :], -jnp.inf), axis=(1, 2))  # [C]
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    a = jnp.exp(log_ci - top[:, None])  # [C, I]
    s1 = jnp.sum(jnp.where(use, a[:, None, :], 0.0), axis=-1)
    s2 = jnp.sum(jnp.where(use, (a * a)[:, None, :], 0.0), axis=-1)
    if tail is not None:
        g1, g2 = _shadowed_tail(m1, var1, sigma_db)
        s1 = s1 + (g1 * jnp.exp(tail[0] - top))[:, None]
        s2 = s2 + (g2 * jnp.exp(tail[1] - 2.0 * top))[:, None]
    mu, s2_log, has = lognormal_from_moments(m1 * s1, var1 * s2)
    return mu + (top[:, None] - log_c), s2_log, has


def _shadowed_tail(m1: Any, var1: Any, sigma_db: Any) -> tuple[Any, Any]:
    """Factors `(g1, g2)` of the mean-field sums (sum c, sum c^2) for far nodes whose
    shadowing Y ~ N(0, s^2) (s = sigma_db ln 10 / 10) is not known: E[c e^Y u] = c e^{s^2/2}
    m1 and Var[c e^Y u] = c^2 (e^{2 s^2} (var1 + m1^2) - e^{s^2} m1^2), so the tail enters
    as `m1 g1 sum c` and `var1 g2 sum c^2`; both 1 at sigma_db = 0."""
    s2 = jnp.square(db_to_log(jnp.asarray(sigma_db, jnp.result_type(m1, float))))
    g2 = jnp.exp(2.0 * s2) + (jnp.exp(2.0 * s2) - jnp.exp(s2)) * m1 * m1 / var1
    return jnp.exp(0.5 * s2), g2


def _shadow_log(shadow: tuple[Any, Any], rows: Any, nodes: Any, sigma_db: Any) -> Any:
    """ln of the shadowing gain [C, J] of receivers `rows` [C] with nodes `nodes` [C, J]
    (`shadow` = (key, ids [N]): node r is node ids[r] of the key's topology)."""
    key, ids = shadow
    rx = jnp.broadcast_to(ids[rows][:, None], nodes.shape)
    return db_to_log(shadowing_db(key, rx, ids[nodes], sigma_db))


def _chunk_perr(
    rows: Any,
    xy: Any,
    idx: Any,
    mask: Any,
    intf: Any,
    gamma: Any,
    tail: Any,
    consts: tuple,
    num_nodes: int,
) -> Any:
    """P_err [C, K] for receivers `rows` [C] (chunk of the map in `_sparse_impl`)."""
    params, m1, var1, shadow = consts
    rx = xy[rows]
    _, log_c, _ = link_geometry(rx, xy[idx], mask, params)
    if intf is None:  # every node but the receiver
        iid = jnp.broadcast_to(jnp.arange(xy.shape[0]), (rows.shape[0], xy.shape[0]))
        imask = iid != rows[:, None]
    else:
        iid, imask = intf
    _, log_ci, _ = link_geometry(rx, xy[iid], imask, params)
    if shadow is not None:
        log_c = log_c + _shadow_log(shadow, rows, idx, params.shadowing_db)
        log_ci = log_ci + _shadow_log(shadow, rows, iid, params.shadowing_db)
    use = imask[:, None, :] & (iid[:, None, :] != idx[:, :, None])  # [C, K, I]
    lognormal = _interference(log_c, log_ci, use, tail, m1, var1, params.shadowing_db)
    return perr_from_lognormal(log_c, lognormal, gamma[:, None], mask, params, num_nodes)


def _sparse_impl(
    xy: Any,
    idx: Any,
    mask: Any,
    intf: Any,
    gamma: Any,
    tail: Any,
    consts: tuple,
    num_nodes: int,
    chunk: int,
) -> Any:
    n, k = idx.shape
    pad = (-n) % chunk
    blocks = lambda a: jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)).reshape(
        -1, chunk, *a.shape[1:]
    )
    rows = jnp.arange(n)  # padding: receiver 0 with masked links, dropped below
    per = (blocks(rows), blocks(idx), blocks(mask), blocks(gamma))
    per_intf = None if intf is None else (blocks(intf[0]), blocks(intf[1]))
    per_tail = None if tail is None else (blocks(tail[0]), blocks(tail[1]))

    def step(args: tuple) -> Any:
        (r, i, m, g), it, tl = args
        return _chunk_perr(r, xy, i, m, it, g, tl, consts, num_nodes)

    out = jax.lax.map(step, (per, per_intf, per_tail))
    return out.reshape(n + pad, k)[:n]


_sparse_jit = jax.jit(_sparse_impl, static_argnames=("num_nodes", "chunk"))


def _radial_integral(rho: Any, far: Any, power: Any) -> Any:
    """int_rho^far r^{1 - power} dr (0 where far <= rho); `power` > 0, any value."""
    e = 2.0 - power
    near_two = jnp.abs(e) < 1e-6
    safe = jnp.where(near_two, 1.0, e)
    val = jnp.where(near_two, jnp.log(far / rho), (far**e - rho**e) / safe)
    return jnp.where(far > rho, val, 0.0)


def _far_field_impl(rx: Any, rho: Any, box: Any, density: Any, params: ChannelParams) -> Any:
    """(ln sum c, ln sum c^2) [N] of the nodes beyond rho [N], as a density over the box."""
    m = _TAIL_ANGLES
    theta = (jnp.arange(m, dtype=rx.dtype) + 0.5) * (2.0 * jnp.pi / m)
    u = jnp.stack([jnp.cos(theta), jnp.sin(theta)], -1)  # [M, 2]
    lo, hi = box[0], box[1]
    # distance to the box edge along u: the nearest wall ahead in x and in y
    gap = jnp.where(u > 0, hi - rx[:, None, :], lo - rx[:, None, :])  # [N, M, 2]
    safe_u = jnp.where(jnp.abs(u) > 1e-12, u, 1e-12)
    far = jnp.min(jnp.where(jnp.abs(u) > 1e-12, gap / safe_u, jnp.inf), axis=-1)  # [N, M]
    rho = jnp.maximum(rho, params.d0_m)[:, None]
    alpha = params.pathloss_exp
    log_c0 = log_received_scale(params.d0_m, params) + alpha * jnp.log(params.d0_m)
    outs = []
    for k in (1.0, 2.0):  # c(r) = exp(log_c0) r^-alpha; c^2 = exp(2 log_c0) r^-2 alpha
        j = jnp.mean(_radial_integral(rho, far, k * alpha), axis=-1) * (2.0 * jnp.pi)
        outs.append(jnp.log(density) + k * log_c0 + jnp.log(j))
    return tuple(outs)


_far_field_jit = jax.jit(_far_field_impl)


def far_field_sums(
    positions: Any, rho: Any, params: ChannelParams | None = None
) -> tuple[jax.Array, jax.Array]:
    """Mean-field (ln sum_r c_r, ln sum_r c_r^2) [N] over the nodes beyond rho [N] metres.

    The nodes are taken as spread uniformly over their bounding box (as `place_uniform` and
    PPP placements are) with density (N - 1) / box area, so the sums are lambda times the
    integrals of c(d) = P hhat^2(d) and c(d)^2 over the box minus the disc of radius rho
    around each receiver (closed form in the radius, midpoint rule over 256 angles; rho is
    clamped to d0). -inf where nothing lies beyond rho.
    """
    params = ChannelParams() if params is None else params
    xy = check_positions(positions)
    lo, hi = xy.min(axis=0), xy.max(axis=0)
    side = float(np.max(hi - lo))
    density = (len(xy) - 1) / max(side * side, np.finfo(float).tiny)
    box = np.stack([lo, lo + side])
    dtype = float_dtype()
    rho = np.broadcast_to(np.asarray(rho, np.float64), (len(xy),))
    return _far_field_jit(
        jnp.asarray(xy, dtype), jnp.asarray(rho, dtype), jnp.asarray(box, dtype), density, params
    )


def _check_links(idx: Any, mask: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """idx [N, K] integer in [0, N) and mask [N, K] bool, as int32 / bool arrays."""
    idx_a, mask_a = np.asarray(idx), np.asarray(mask)
    if idx_a.ndim != 2 or idx_a.shape[0] != n or idx_a.shape[1] < 1:
        raise ValueError(f"idx must have shape [N, K] with N = {n}, K >= 1; got {idx_a.shape}")
    if idx_a.dtype.kind not in "iu":
        raise ValueError(f"idx must hold integer node indices; got dtype {idx_a.dtype}")
    check_range("idx", idx_a, 0, n - 1)
    if mask_a.shape != idx_a.shape or mask_a.dtype != bool:
        raise ValueError(
            f"mask must be a boolean array of shape {list(idx_a.shape)} (idx's); "
            f"got {mask_a.dtype} {list(mask_a.shape)}"
        )
    return idx_a.astype(np.int32), mask_a


def _check_gamma(gamma_th: Any, n: int) -> np.ndarray:
    """gamma_th scalar or [N] (per receiver), finite and > 0, as [N]."""
    g = np.asarray(gamma_th, np.float64) if np.ndim(gamma_th) else np.float64(gamma_th)
    if np.ndim(g) not in (0, 1) or (np.ndim(g) == 1 and g.shape[0] != n):
        raise ValueError(f"gamma_th must be a scalar or have shape [N] = [{n}]; got {np.shape(g)}")
    check_finite("gamma_th", g)
    check_range("gamma_th", g, 0.0, None, low_inclusive=False)
    return np.broadcast_to(g, (n,))


def _node_count(
    xy: np.ndarray, idx: np.ndarray, mask: np.ndarray, gamma: np.ndarray, params: ChannelParams
) -> int:
    """`default_num_nodes` for the longest candidate link (the weakest c_s decides)."""
    d = np.hypot(*(xy[idx] - xy[:, None, :]).transpose(2, 0, 1))
    d_max = float(np.max(np.where(mask, d, 0.0)))
    far = np.array([[d_max / math.sqrt(2.0)] * 2])  # span d/sqrt(2): the bound is d itself
    return default_num_nodes(np.zeros(2), far, gamma, params, jnp.dtype(float_dtype()).name)


def _tail(
    xy: np.ndarray, intf: Any, cutoff: float | None, tail: str, params: ChannelParams
) -> tuple[jax.Array, jax.Array] | None:
    """`far_field_sums` beyond each receiver's cutoff (the farthest interferer for "nearest")."""
    if tail == "none":
        return None
    if intf is None:
        raise ValueError("tail='mean' needs interference='radius' or 'nearest' (a cutoff)")
    if cutoff is None:
        d = np.hypot(*(xy[intf[0]] - xy[:, None, :]).transpose(2, 0, 1))
        cutoff = np.max(np.where(intf[1], d, 0.0), axis=1)
    return far_field_sums(xy, cutoff, params)


def sparse_bytes(n: int, k: int, listed: int, step: int) -> int:
    """Device bytes of one `sparse_error_probability` call: the `[N, K]` links and the
    `[N, listed]` interferer lists (0 for "all": never materialised), about 16 bytes an entry,
    plus one chunk's `step` = C x K x I entries (XLA:CPU measured 9-15 bytes each)."""
    return 16 * n * (k + listed) + 16 * step


def sparse_error_probability(
    positions: Any,
    idx: Any,
    mask: Any,
    gamma_th: Any,
    params: ChannelParams | None = None,
    *,
    moments: str = "paper",
    interference: str = "all",
    cutoff: float | None = None,
    num_interferers: int | None = None,
    tail: str = "none",
    num_nodes: int | None = None,
    shadow_key: Any = None,
) -> jax.Array:
    """P_err [N, K] of the candidate links j = idx[i, k] -> i; masked slots get 1.0.

    Args:
      positions: [N, 2] node positions (m).
      idx, mask: [N, K] candidate links (`candidate_neighbors`).
      gamma_th: SINR threshold (> 0), scalar or per receiver [N].
      params, moments: as in `error_probability`.
      interference: "all" (equals the dense `network_perr` on the candidate entries),
        "radius" (nodes within `cutoff` metres of the receiver) or "nearest" (the
        `num_interferers` nearest to the receiver); see the module docstring.
      tail: with "radius" / "nearest", "mean" adds the mean-field interference of the nodes
        beyond the cutoff (`far_field_sums`: nodes uniform over their bounding box), "none"
        drops them.
      num_nodes: Gauss-Legendre nodes per link; default as in `error_probability`, decided
        by the longest candidate link.
      shadow_key: the topology's shadowing key (None: none): pair (i, r) has the shadowing
        `fading.shadowing_db(shadow_key, i, r, params.shadowing_db)`, known for the links
        and the listed interferers; the mean-field tail averages it (`_shadowed_tail`).
    """
    params = ChannelParams() if params is None else params
    if not isinstance(params, ChannelParams):
        raise ValueError(f"params must be a ChannelParams; got {type(params).__name__}")
    check_choice("moments", moments, MOMENT_MODES)
    xy = check_positions(positions)
    n = len(xy)
    idx_a, mask_a = _check_links(idx, mask, n)
    gamma = _check_gamma(gamma_th, n)
    intf = interferer_sets(xy, interference, cutoff=cutoff, num_interferers=num_interferers)
    tail_sums = _tail(xy, intf, cutoff, check_choice("tail", tail, TAIL_MODES), params)
    if num_nodes is None:
        num_nodes = _node_count(xy, idx_a, mask_a, gamma, params)
    num_nodes = check_int("num_nodes", num_nodes, 2, 4096)
    width = n if intf is None else intf[0].shape[1]
    chunk = max(1, min(n, CHUNK_ELEMENTS // (idx_a.shape[1] * width)))
    check_device_bytes(
        sparse_bytes(
            n, idx_a.shape[1], 0 if intf is None else width, chunk * idx_a.shape[1] * width
        ),
        f"sparse_error_probability of {n} nodes x {idx_a.shape[1]} candidates "
        f"({width} interferers per receiver)",
        "fewer interferers per receiver (interference='radius' with a smaller cutoff, or "
        "'nearest') or fewer candidates",
    )
    dtype = float_dtype()
    m1, var1 = moment_coefficients(params, moments=moments)
    shadow = None if shadow_key is None else (shadow_key, jnp.arange(n, dtype=jnp.int32))
    return _sparse_jit(
        jnp.asarray(xy, dtype),
        jnp.asarray(idx_a),
        jnp.asarray(mask_a),
        None if intf is None else (jnp.asarray(intf[0]), jnp.asarray(intf[1])),
        jnp.asarray(gamma, dtype),
        tail_sums,
        (params, m1, var1, shadow),
        num_nodes=num_nodes,
        chunk=chunk,
    )


def traced_error_probability(
    xy: Any,
    idx: Any,
    mask: Any,
    gamma_th: Any,
    params: ChannelParams,
    *,
    moments: str,
    num_nodes: int,
    interferers: tuple[Any, Any] | None = None,
    cutoff: float | None = None,
    tail: bool = False,
    shadow: tuple[Any, Any] | None = None,
) -> jax.Array:
    """`sparse_error_probability` inside a compiled program (traced positions): P_err
    `[N, K]` of the links `idx [N, K] -> i` (masked: 1.0), interfered by `interferers`
    (`(idx, mask) [N, I]`, e.g. `grid.within(xy, cutoff, ...)`; None: every other node)
    plus, with `tail`, the mean-field nodes beyond `cutoff` over the positions' bounding box;
    `shadow` = (key, ids [N]): node r's pairs shadowed as node ids[r]'s of the key's
    topology (deviation `params.shadowing_db`), or None. No checks (the caller's shapes are
    static), `num_nodes` given."""
    n, k = idx.shape
    width = n if interferers is None else interferers[0].shape[1]
    chunk = max(1, min(n, CHUNK_ELEMENTS // (k * width)))
    m1, var1 = moment_coefficients(params, moments=moments)
    sums = None
    if tail:
        lo, hi = xy.min(axis=0), xy.max(axis=0)
        side = jnp.maximum(jnp.max(hi - lo), jnp.finfo(xy.dtype).tiny)
        box = jnp.stack([lo, lo + side])
        rho = jnp.full((n,), jnp.inf if cutoff is None else cutoff, xy.dtype)
        sums = _far_field_impl(xy, rho, box, (n - 1) / (side * side), params)
    gamma = jnp.broadcast_to(jnp.asarray(gamma_th, xy.dtype), (n,))
    consts = (params, m1, var1, shadow)
    return _sparse_impl(xy, idx, mask, interferers, gamma, sums, consts, num_nodes, chunk)
