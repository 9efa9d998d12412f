"""Per-round link realisations: which transmitted models arrive.

Pure, jittable functions a compiled training round calls for all links of all targets at
once; the runner combines them as `received = neighbor_mask & sample(key, ...)`:

* "ideal": every masked link succeeds (today's behaviour; nothing to sample).
* "bernoulli" (`bernoulli_received`): each masked link fails independently with its
  probability (the formula P_err of any moments mode, or a fixed `failure`).
* "physical" (`physical_received`): one block-fading realisation per round of the packet-level
  model of `montecarlo.simulate_links` (best sub-channel above the fading threshold,
  co-channel interference from the other nodes transmitting that round, SINR >= gamma_th).

`LinkAge` keeps, per link, the number of rounds since its last model arrived (for `stale`).
See docs/robustness.md for the maths and every parameter.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from pfedwn_jax._checks import (
    INT32_MAX,
    check_choice,
    check_finite,
    check_float,
    check_int,
    check_range,
    check_rank,
    check_shape,
    is_concrete,
)
from pfedwn_jax.devices import check_device_bytes
from pfedwn_jax.wireless._inputs import float_dtype
from pfedwn_jax.wireless.channel import log_noise_power, log_received_scale
from pfedwn_jax.wireless.fading import Fading, db_to_log, draw_power, shadowing_db
from pfedwn_jax.wireless.montecarlo import (
    best_subchannel,
    concrete_num_subchannels,
    sinr_success,
)
from pfedwn_jax.wireless.params import ChannelParams

LINK_MODELS = ("ideal", "bernoulli", "physical")

# Links per batch of `physical_received`'s sequential map: bounds the [batch, candidates, F]
# draws and the [batch, N] interferer search to about this many numbers.
_BATCH_NUMBERS = 2**22


def check_link_model(name: Any) -> str:
    """Return `name` if it is one of `LINK_MODELS`; `ValueError` naming `link_model` if not."""
    return check_choice("link_model", name, LINK_MODELS)


# --------------------------------------------------------------------------------- bernoulli


def bernoulli_received(key: Any, perr: Any, mask: Any, *, failure: Any = None) -> jax.Array:
    """Which masked links deliver this round: bool [..., K] (shapes broadcast together).

    Link k succeeds iff mask[k] and U_k >= p_k, U_k ~ U[0, 1) i.i.d. (so with probability
    1 - p_k), where p = perr [..., K] (e.g. the formula P_err) or, when given, the fixed
    failure probability `failure` (scalar or broadcastable; `perr` may then be None).
    failure=0 delivers every masked link, failure=1 none. Independent across links and across
    keys (split the key per round); jittable and vmappable. Concrete probabilities are
    checked on the host (finite, in [0, 1]); traced ones are not.
    """
    name, p = ("failure", failure) if failure is not None else ("perr", perr)
    if p is None:
        raise ValueError("bernoulli_received needs perr [..., K] or failure; got neither")
    check_finite(name, p)
    check_range(name, p, 0.0, 1.0)
    if is_concrete(mask) and np.asarray(mask).dtype != bool:
        raise ValueError(f"mask must be a boolean array; got dtype {np.asarray(mask).dtype}")
    p = jnp.asarray(p, float_dtype())
    shape = jnp.broadcast_shapes(jnp.shape(p), jnp.shape(mask))
    u = jax.random.uniform(key, shape, p.dtype)
    return jnp.asarray(mask, bool) & (u >= p)


# ---------------------------------------------------------------------------------- physical


def pair_fading(
    key: Any, receiver: Any, node: Any, num_sub: int, dtype: Any, fading: Fading | None = None
) -> jax.Array:
    """u [F] = h^2 / Gamma of node -> receiver on each sub-channel (`fading.draw_power`;
    None: Rayleigh, i.i.d. Exp(1)).

    Keyed by the (receiver, node) pair, so one round's fading of a pair is the same wherever
    it appears (as a link, or as an interferer of another link at that receiver).
    """
    k = jax.random.fold_in(jax.random.fold_in(key, receiver), node)
    return draw_power(Fading() if fading is None else fading, k, (num_sub,), dtype)


def _log_scale(positions: Any, receiver: Any, nodes: Any, params: ChannelParams) -> Any:
    """ln c [...] of `nodes` [...] at `receiver` (received power scale P hhat^2)."""
    diff = positions[nodes] - positions[receiver]
    return log_received_scale(jnp.sqrt(jnp.sum(diff * diff, axis=-1)), params)


def _eligible(positions: Any, rx: Any, tx: Any, idx: Any, active: Any, cutoff_m: Any) -> Any:
    """Which nodes idx [C] may interfere with link tx -> rx: active, not rx/tx, in range."""
    diff = positions[idx] - positions[rx]
    ok = (idx >= 0) & active[idx] & (idx != rx) & (idx != tx)
    if cutoff_m is not None:
        ok = ok & (jnp.sum(diff * diff, axis=-1) <= cutoff_m * cutoff_m)
    return ok


def _nearest(positions: Any, link: Any, active: Any, num: int, cutoff_m: Any) -> Any:
    """idx [num] int32: the `num` nearest eligible interferers of one link (-1: none)."""
    rx, tx = link
    idx = jnp.arange(positions.shape[0])
    diff = positions - positions[rx]
    score = jnp.where(
        _eligible(positions, rx, tx, idx, active, cutoff_m),
        -jnp.sum(diff * diff, axis=-1),
        -jnp.inf,
    )
    neg, near = jax.lax.top_k(score, num)
    return jnp.where(jnp.isfinite(neg), near, -1).astype(jnp.int32)


def _one_link(
    keys: tuple[Any, Any, Any],
    positions: Any,
    active: Any,
    link: tuple[Any, Any, Any, Any],
    params: ChannelParams,
    num_sub: int,
    cutoff_m: Any,
    sinr: bool | str = False,
) -> Any:
    """Success (bool scalar) of one link (rx, tx, gamma_th, candidates [C]) this round, or
    with `sinr` its SINR (linear; 0 when the link does not send), or with ``sinr="both"``
    the pair (success, SINR) of one draw; `keys` = (this round's fading key, the topology's
    shadowing key or None, the node ids [N] the shadowing is keyed by)."""
    key, shadow_key, ids = keys
    rx, tx, gamma_th, cand = link
    ok = _eligible(positions, rx, tx, cand, active, cutoff_m)
    nodes = jnp.concatenate([tx[None], jnp.maximum(cand, 0)])
    fading = params.fading
    u = jax.vmap(lambda r: pair_fading(key, rx, r, num_sub, positions.dtype, fading))(nodes)
    u_max, f_star, sends = best_subchannel(u, params)  # [1 + C]
    log_c = _log_scale(positions, rx, nodes, params)
    if shadow_key is not None:
        rxs = jnp.broadcast_to(ids[rx], nodes.shape)
        log_c = log_c + db_to_log(shadowing_db(shadow_key, rxs, ids[nodes], params.shadowing_db))
    hit = ok & sends[1:] & (f_star[1:] == f_star[0])
    interf = jnp.sum(jnp.where(hit, jnp.exp(log_c[1:] - log_c[0]) * u_max[1:], 0.0))
    up = active[tx] & (rx != tx)
    ok = sinr_success(u_max[0], sends[0], log_c[0], interf, gamma_th, params) & up
    if not sinr:
        return ok
    # u / (sigma_n^2 / (c Gamma) + I / (c Gamma))
    noise = jnp.exp(log_noise_power(params) - log_c[0] - jnp.log(params.fading.gamma))
    value = jnp.where(up & sends[0], u_max[0] / (noise + interf), 0.0)
    return (ok, value) if sinr == "both" else value


def _map_links(fn: Any, links: Any, numbers_per_link: int) -> Any:
    """vmap of fn over the leading axis of `links`, in sequential batches when that is big."""
    batch = max(1, _BATCH_NUMBERS // numbers_per_link)
    if jax.tree.leaves(links)[0].shape[0] <= batch:
        return jax.vmap(fn)(links)
    return jax.lax.map(fn, links, batch_size=batch)  # bounded memory for large networks


def _nearest_impl(
    positions: Any, links: Any, active: Any, cutoff_m: Any, num_interferers: int
) -> Any:
    near = lambda lk: _nearest(positions, lk, active, num_interferers, cutoff_m)
    return _map_links(near, links, 2 * positions.shape[0])


_nearest_jit = jax.jit(_nearest_impl, static_argnames="num_interferers")


def _physical_impl(
    keys: tuple[Any, Any, Any],
    positions: Any,
    links: tuple[Any, Any, Any, Any],
    active: Any,
    params: ChannelParams,
    cutoff_m: Any,
    num_sub: int,
    sinr: bool | str,
) -> Any:
    one = lambda lk: _one_link(keys, positions, active, lk, params, num_sub, cutoff_m, sinr)
    return _map_links(one, links, (links[3].shape[1] + 1) * (num_sub + 2))


_physical_jit = jax.jit(_physical_impl, static_argnames=("num_sub", "sinr"))


def _link_indices(name: str, x: Any, n: int, low: int = 0) -> Any:
    """`x` as int32; `ValueError` unless integer with concrete values in [low, n)."""
    if is_concrete(x):
        arr = np.asarray(x)
        if arr.dtype.kind not in "iu":
            raise ValueError(f"{name} must hold integer node indices; got dtype {arr.dtype}")
        check_range(name, arr, low, n - 1)
    return jnp.asarray(x, jnp.int32)


def _network_inputs(
    positions: Any, receivers: Any, transmitters: Any, active_tx: Any, cutoff_m: Any
) -> tuple[Any, Any, Any, Any, Any]:
    """Validated (positions [N, 2], rx [L], tx [L], active [N], cutoff_m) of the link API."""
    check_shape("positions", positions, (None, 2), "[N, 2]")
    check_finite("positions", positions)
    n = int(np.shape(positions)[0])
    check_rank("receivers", receivers, 1, "[L]")
    rx = _link_indices("receivers", receivers, n)
    tx = _link_indices("transmitters", transmitters, n)
    check_shape("transmitters", tx, rx.shape, "[L] like receivers")
    check_shape("active_tx", active_tx, (n,), "[N]")
    if is_concrete(active_tx) and np.asarray(active_tx).dtype != bool:
        raise ValueError(f"active_tx must be a boolean mask; got {np.asarray(active_tx).dtype}")
    if cutoff_m is not None:
        cutoff_m = check_float("cutoff_m", cutoff_m, 0.0, None, low_inclusive=False)
    xy = jnp.asarray(positions, float_dtype())
    return xy, rx, tx, jnp.asarray(active_tx, bool), cutoff_m


def nearest_interferers(
    positions: Any,
    receivers: Any,
    transmitters: Any,
    active_tx: Any,
    num_interferers: int,
    *,
    cutoff_m: float | None = None,
) -> jax.Array:
    """idx [L, K] int32: per link the K nearest nodes that may interfere at its receiver.

    Eligible: active_tx, neither the link's receiver nor its transmitter, within cutoff_m of
    the receiver (None: any distance); -1 pads links with fewer than K. Nearest = strongest
    mean received power (one path-loss law). Work ~ L N (batched); compute it once per
    placement (and active set) and pass it to `physical_received(..., interferers=)`.
    """
    xy, rx, tx, active, cutoff_m = _network_inputs(
        positions, receivers, transmitters, active_tx, cutoff_m
    )
    k = check_int("num_interferers", num_interferers, 1, xy.shape[0])
    if rx.shape[0] == 0:
        return jnp.zeros((0, k), jnp.int32)
    return _nearest_jit(xy, (rx, tx), active, cutoff_m, num_interferers=k)


def physical_received(
    key: Any,
    positions: Any,
    receivers: Any,
    transmitters: Any,
    active_tx: Any,
    gamma_th: Any,
    params: ChannelParams | None = None,
    *,
    num_interferers: int | None = None,
    cutoff_m: float | None = None,
    interferers: Any = None,
    shadow_key: Any = None,
    node_ids: Any = None,
    sinr: bool | str = False,
) -> Any:
    """Which links deliver in one block-fading round: bool [L] (`sinr=True`: float [L], each
    link's SINR, linear, on its chosen sub-channel; 0 where it does not send; ``"both"``:
    the pair, `physical_draw`).

    Args:
      key: this round's PRNG key (one fading realisation per key).
      positions: [N, 2] node positions (m).
      receivers, transmitters: [L] int node indices of each link transmitter -> receiver.
      active_tx: [N] bool, the nodes transmitting this round: they interfere, and a link
        whose transmitter is not active is not received.
      gamma_th: SINR decoding threshold (linear, > 0), scalar or [L].
      params: channel constants (Table I defaults); `num_subchannels` must be concrete.
      num_interferers: None: every other active node interferes at the receiver (work and
        memory ~ L N F). An int K: only the K nearest eligible ones (`nearest_interferers`,
        work ~ L (N + K F)). Truncation only drops the weakest interference: with the same
        key every link succeeds at least as often as with all interferers.
      cutoff_m: optional radius (m); active nodes farther from the receiver do not interfere.
      interferers: optional [L, C] int candidate lists (-1: none), e.g. from
        `nearest_interferers` computed once per placement (work ~ L C F, no search);
        candidates that are inactive, the link's ends or beyond cutoff_m are ignored.
      shadow_key: the topology's shadowing key (None: no shadowing): every pair's received
        power is scaled by 10^{X/10}, X = `fading.shadowing_db(shadow_key, i, r,
        params.shadowing_db)`, the same in every round (keep the key fixed per topology).
      node_ids: optional [N] int ids the shadowing is keyed by (default 0..N-1): node r of
        `positions` is node `node_ids[r]` of the topology whose pairs `shadow_key` draws
        (the slots of a run, a subset of its network, keep their network pairs' values).

    At receiver i every node r draws F fades (`params.fading`) towards i (keyed by (i, r): shared by
    all links at i), picks its best sub-channel and sends iff that amplitude is >= beta;
    link j -> i succeeds iff j sends and its SINR on its sub-channel, against the active
    nodes r != i, j sending on the same one, is >= gamma_th. With one receiver and all of its
    neighbors active this is `simulate_links(..., interference="physical")`. A self link
    (i == j) never succeeds. Jittable (validation on the host is skipped for traced values).
    """
    params = ChannelParams() if params is None else params
    if not isinstance(params, ChannelParams):
        raise ValueError(f"params must be a ChannelParams; got {type(params).__name__}")
    num_sub = concrete_num_subchannels(params, "physical_received")
    xy, rx, tx, active, cutoff_m = _network_inputs(
        positions, receivers, transmitters, active_tx, cutoff_m
    )
    if np.shape(gamma_th) not in ((), (1,), rx.shape):
        raise ValueError(
            f"gamma_th must be a scalar or have shape [L] = {rx.shape}; got {np.shape(gamma_th)}"
        )
    check_finite("gamma_th", gamma_th)
    check_range("gamma_th", gamma_th, 0.0, None, low_inclusive=False)
    n, num_links = xy.shape[0], rx.shape[0]
    cand = _candidate_lists(xy, rx, tx, active, cutoff_m, num_interferers, interferers)
    if num_links == 0:
        none = jnp.zeros((0,), bool), jnp.zeros((0,), xy.dtype)
        return none if sinr == "both" else none[1 if sinr else 0]
    gamma = jnp.broadcast_to(jnp.asarray(gamma_th, xy.dtype), rx.shape)
    links = (rx, tx, gamma, cand)
    keys = (key, shadow_key, _shadow_ids(node_ids, n))
    return _physical_jit(keys, xy, links, active, params, cutoff_m, num_sub=num_sub, sinr=sinr)


def _candidate_lists(
    xy: Any,
    rx: Any,
    tx: Any,
    active: Any,
    cutoff_m: Any,
    num_interferers: int | None,
    interferers: Any,
) -> jax.Array:
    """`[L, C]` int32 interferer candidates of each link: the given `interferers` lists
    (checked), the `num_interferers` nearest, or every node (its memory checked)."""
    n, num_links = xy.shape[0], rx.shape[0]
    if interferers is not None:
        check_shape("interferers", interferers, (num_links, None), "[L, C]")
        return _link_indices("interferers", interferers, n, low=-1)
    if num_interferers is not None:
        return nearest_interferers(xy, rx, tx, active, num_interferers, cutoff_m=cutoff_m)
    check_device_bytes(
        4 * num_links * n,  # [L, N] int32 candidate lists (the map over links is batched)
        f"physical_received of {num_links} link(s) with every one of {n} nodes interfering",
        "pass num_interferers (the K nearest interferers) or interferers lists, or give "
        "fewer links per call",
    )
    return jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (num_links, n))


def _shadow_ids(node_ids: Any, n: int) -> jax.Array:
    """`node_ids` checked as `[N]` int32 (None: `0..N-1`)."""
    if node_ids is None:
        return jnp.arange(n, dtype=jnp.int32)
    check_shape("node_ids", node_ids, (n,), "[N] like positions")
    if is_concrete(node_ids) and np.asarray(node_ids).dtype.kind not in "iu":
        raise ValueError(f"node_ids must hold integer ids; got dtype {np.asarray(node_ids).dtype}")
    return jnp.asarray(node_ids, jnp.int32)


def physical_sinr(
    key: Any, positions: Any, receivers: Any, transmitters: Any, *args: Any, **kwargs: Any
) -> jax.Array:
    """float [L]: each link's SINR (linear) in one block-fading round, on the sub-channel it
    chose, 0 where it does not send (its best amplitude below beta, or inactive): the draw
    of `physical_received` (same arguments, same key: `physical_received` is exactly
    `sinr >= gamma_th` up to rounding), for rate and cost models. dB: 10 log10(sinr)."""
    return physical_received(key, positions, receivers, transmitters, *args, sinr=True, **kwargs)


def physical_draw(
    key: Any, positions: Any, receivers: Any, transmitters: Any, *args: Any, **kwargs: Any
) -> tuple[jax.Array, jax.Array]:
    """``(received bool [L], sinr float [L])`` of one block-fading round in one pass (same
    arguments as `physical_received`): ``received`` is exactly `physical_received`'s and
    ``sinr`` `physical_sinr`'s, for a round that needs both (the cost of a link at its rate)."""
    return physical_received(key, positions, receivers, transmitters, *args, sinr="both", **kwargs)


# ------------------------------------------------------------------------------- staleness


class LinkAge(struct.PyTreeNode):
    """Per-link age of the last model that arrived: age [S, K] int32, seen [S, K] bool.

    age counts rounds since the link last delivered (0: it delivered this round); before its
    first delivery it counts rounds since `init`. seen marks links that have delivered at
    least once (a stale copy exists). Any shape works; [S, K] is the runner's.
    """

    age: Any
    seen: Any

    @classmethod
    def init(cls, shape: tuple[int, ...], *, seen: bool = False) -> LinkAge:
        """Ages 0; `seen=True` when every link's initial model is known (a shared init)."""
        return cls(jnp.zeros(shape, jnp.int32), jnp.full(shape, seen, bool))

    def update(self, received: Any) -> LinkAge:
        """After one round: age 0 where received, else age + 1 (saturating at int32 max)."""
        received = jnp.asarray(received, bool)
        older = jnp.where(self.age < INT32_MAX, self.age + 1, self.age)
        return LinkAge(jnp.where(received, 0, older).astype(jnp.int32), self.seen | received)
