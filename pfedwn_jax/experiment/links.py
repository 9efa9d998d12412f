"""Which models arrive this round: the link model of an experiment, drawn inside the round.

A federation says who *may* receive whom (the selected neighbors, the context's neighbor
lists `[S, K]`, column 0 the slot itself). With `link_model="ideal"` every such model arrives
every round (no `Links` at all: the compiled round is the one of a run without the option).
Otherwise the context carries `Links`, each listed link's P_err and what a draw needs, and
`sample_received(key, links, neighbors, neighbor_mask)` draws one round's outcome for all
links of all targets at once: `bernoulli` (independent failures with P_err or a fixed
probability, the draws of `wireless.bernoulli_received` keyed per link) or `physical`
(block fading and interference redrawn, `wireless.links.physical_received`). The round then
trains with `neighbor_mask & received`, so every algorithm combines only what arrived (see
docs/robustness.md for what that means per algorithm).

Two options keep per-link state across rounds (`LinkTrack`, in the run's state next to
the algorithm's): `stale=True` keeps the last model received over every listed link
(`[S, K, ...]`, K models per slot), caches what arrived of what the round sent (the models
the algorithm's round returns as `sent`), and hands a failed link's copy to the algorithm
(`algorithms.common.neighbor_models`); `mobility` moves the nodes between rounds
(`wireless.mobility`), so the links' P_err and the physical draw follow the geometry, and
re-selects the neighbor lists every `reselect_every` rounds (fixed width K, the mask marks
the real entries). `begin_round` / `end_round` are the two halves the round step calls
around the algorithm's round; everything is arrays inside the compiled step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax.algorithms import neighbor_lists
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.federation import (
    Federation,
    channel_params,
    network_perr,
    shadow_matrix,
)
from pfedwn_jax.wireless import (
    ChannelParams,
    GaussianWalk,
    RandomWaypoint,
    error_probability,
    grid,
    physical_received,
)
from pfedwn_jax.wireless._inputs import float_dtype
from pfedwn_jax.wireless.fading import Fading, traced_fading
from pfedwn_jax.wireless.perr import default_num_nodes
from pfedwn_jax.wireless.sparse_perr import traced_error_probability

#: Folded into the round key for the link draw, so training keys stay those of `ideal`.
LINK_SALT = 0x11A5
#: Folded into the round key (and the init key) for the node movement.
MOTION_SALT = 0x30B1


class Motion(flax.struct.PyTreeNode):
    """What moving the nodes and re-selecting their neighbors needs (`mobility` set).

    Attributes:
      speed: `[]` m/s. dt: `[]` seconds per round. area: `[]` side of the square (m).
      eps: `[]` selection threshold (inf without channel-aware selection: every node in
        range; an array, so runs with and without selection share a program).
      width: `[]` int32, neighbors a re-selection may list (the run's own list width - 1; a
        sweep pads the lists of several runs to the widest).
      model: "waypoint" or "gaussian". Static.
      reselect_every: rounds between re-selections (0: never). Static.
      single: single-target mode (slot 0 selects, its group is fully connected). Static.
      moments: moment mode of the P_err formula. Static.
      track_perr: recompute the listed links' P_err every round (bernoulli with P_err). Static.
      sparse: `SparseMotion` on a network of candidate lists (`candidates`), else None
        (dense: every slot a candidate and an interferer). Static.
    """

    speed: jax.Array
    dt: jax.Array
    area: jax.Array
    eps: jax.Array
    width: jax.Array
    model: str = flax.struct.field(pytree_node=False)
    reselect_every: int = flax.struct.field(pytree_node=False)
    single: bool = flax.struct.field(pytree_node=False)
    moments: str = flax.struct.field(pytree_node=False)
    track_perr: bool = flax.struct.field(pytree_node=False)
    sparse: Any = flax.struct.field(pytree_node=False, default=None)


@dataclasses.dataclass(frozen=True)
class SparseMotion:
    """Mobility over candidate lists: each round the `candidates` nearest slots are found
    again (`wireless.grid.nearest` on `near`), interfered by the slots within `cutoff`
    metres (`wireless.grid.within` on `far`; None: every slot) plus, with `tail`, the
    mean-field rest; `num_nodes` quadrature nodes per link (the weakest link of the area)."""

    candidates: int
    near: grid.Grid
    far: grid.Grid | None
    cutoff: float | None
    tail: bool
    num_nodes: int


class Links(flax.struct.PyTreeNode):
    """What a draw of every slot's incoming links needs (the links themselves are the
    context's neighbor lists).

    Attributes:
      perr: `[S, K]` float32 P_err of each listed link (0 for column 0 and padding).
      positions: `[S, 2]` float32 slot positions (m).
      active: `[S]` bool, slots that transmit (every real slot; False on a sweep's padding).
      gamma_th: `[]` float32 SINR threshold.
      failure: `[]` float32 fixed failure probability, or None (each link's P_err).
      params: `ChannelParams` (physical model). Static (the sub-channel count sets shapes);
        its fading is the kind's default, the run's is `fading`.
      fading: the run's `wireless.fading.Fading` with its parameter and mean power `[]`
        float32 leaves (runs that differ only in them share a program), or None (Rayleigh:
        all in `params`); see `channel`.
      model: "ideal" (only with mobility), "bernoulli" or "physical". Static.
      stale: keep the last received model per link (`LinkTrack.cache`). Static.
      motion: `Motion` (nodes move, lists re-selected) or None.
      cache: inside a round with `stale`: `[S * K, ...]` the last model received over each
        listed link (row `s * K + k`), else None.
      source: inside a round with `stale`: `[S, K]` int32 index of each listed link's model
        in `concat(params, cache)` (the fresh one if it arrived, else its stale copy).
      reselected: inside a round with `motion`: `[]` bool, the lists changed this round.
    """

    perr: jax.Array
    positions: jax.Array
    active: jax.Array
    gamma_th: jax.Array
    failure: Any
    params: ChannelParams = flax.struct.field(pytree_node=False)
    fading: Any = None
    model: str = flax.struct.field(pytree_node=False, default="bernoulli")
    stale: bool = flax.struct.field(pytree_node=False, default=False)
    motion: Any = None
    cache: Any = None
    source: Any = None
    reselected: Any = None

    def channel(self) -> ChannelParams:
        """The run's `ChannelParams`: `params` with the (traced) `fading`."""
        return self.params if self.fading is None else self.params.replace(fading=self.fading)


def slot_perr(fed: Federation, config: ExperimentConfig) -> np.ndarray:
    """`[S, S]` P_err of link j -> i between the slots (all network nodes interfering)."""
    if fed.mode == "network":
        return np.asarray(fed.perr)
    params, n = channel_params(config), len(fed.positions)
    shadow = shadow_matrix(config, n)
    full = network_perr(fed.positions, config.gamma_th, params, config.moments, shadow=shadow)
    return full[np.ix_(fed.data_client, fed.data_client)]


def build_links(fed: Federation, config: ExperimentConfig) -> Links | None:
    """The `Links` of a federation (None for `link_model="ideal"` without mobility)."""
    if config.link_model == "ideal" and config.mobility == "none":
        return None
    if fed.neighbor_lists is not None:  # a large network: its lists and their P_err
        assert fed.neighbor_mask is not None and fed.neighbor_perr is not None  # set together
        lists, mask, perr = fed.neighbor_lists, fed.neighbor_mask, fed.neighbor_perr.copy()
    else:  # the runner's lists of the adjacency (`algorithms.neighbor_lists`)
        lists, mask = neighbor_lists(np.asarray(fed.adjacency, bool))
        perr = np.take_along_axis(slot_perr(fed, config), lists, 1)
    s = lists.shape[0]
    perr = np.where(mask, perr, 0.0)  # the runner builds the context's lists the same way
    perr[:, 0] = 0.0
    failure = None if config.link_failure is None else jnp.float32(config.link_failure)
    return Links(
        perr=jnp.asarray(perr, jnp.float32),
        positions=jnp.asarray(fed.positions[fed.data_client], jnp.float32),
        active=jnp.ones((s,), bool),
        gamma_th=jnp.float32(config.gamma_th),
        failure=failure,
        **_channel_split(config),
        model=config.link_model,
        stale=config.stale,
        motion=_motion(fed, config, lists.shape[1] - 1),
    )


def _channel_split(config: ExperimentConfig) -> dict[str, Any]:
    """`params` (static) and `fading` (dynamic) of the `Links` of `config`: Rayleigh, which
    has no shape parameter, stays all static (None)."""
    params = channel_params(config)
    if params.fading.kind == "rayleigh":
        return {"params": params, "fading": None}
    return {
        "params": params.replace(fading=Fading.of(params.fading.kind)),
        "fading": traced_fading(params.fading),
    }


def _motion(fed: Federation, config: ExperimentConfig, width: int) -> Motion | None:
    if config.mobility == "none":
        return None
    return Motion(
        speed=jnp.float32(config.speed),
        dt=jnp.float32(config.round_seconds),
        area=jnp.float32(channel_params(config).area_m),
        eps=jnp.float32(config.eps if config.selection else np.inf),
        width=jnp.int32(width),
        model=config.mobility,
        reselect_every=config.reselect_every,
        single=fed.mode == "single",
        moments=config.moments,
        track_perr=config.link_model == "bernoulli" and config.link_failure is None,
        sparse=_sparse_motion(fed, config),
    )


def _sparse_motion(fed: Federation, config: ExperimentConfig) -> SparseMotion | None:
    """The `SparseMotion` of a network of candidate lists (None otherwise)."""
    if fed.neighbor_lists is None or config.candidates is None:
        return None
    params, n, k = channel_params(config), fed.num_slots, config.candidates
    area, cut = float(params.area_m), config.interference_cutoff
    corners = np.array([[0.0, 0.0], [area, area]])  # the weakest link a move can make
    dtype = jnp.dtype(float_dtype()).name
    return SparseMotion(
        candidates=k,
        near=grid.make_grid(n, area, grid.knn_radius(n, area, k)),
        far=None if cut is None else grid.make_grid(n, area, cut),
        cutoff=cut,
        tail=cut is not None and config.interference_tail == "mean",
        num_nodes=default_num_nodes(corners[:1], corners[1:], config.gamma_th, params, dtype),
    )


def mobile_federation(fed: Federation, config: ExperimentConfig) -> Federation:
    """The federation a run with `mobility` trains: single mode makes every client a slot
    (target, its selected neighbors, then the others, who train locally until selected), so
    a re-selection can bring anyone in; the slots of `fed` keep their indices (and keys)."""
    if config.mobility == "none" or fed.mode != "single":
        return fed
    rest = fed.neighbors[~np.asarray(fed.selected, bool)]
    data_client = np.concatenate([fed.data_client, rest]).astype(np.int64)
    n, s0 = len(data_client), fed.num_slots
    adjacency = np.eye(n, dtype=bool)
    adjacency[:s0, :s0] = True
    return dataclasses.replace(
        fed, data_client=data_client, adjacency=adjacency, is_target=np.arange(n) == 0
    )


def sample_received(
    key: jax.Array, links: Links, neighbors: jax.Array, neighbor_mask: jax.Array
) -> jax.Array:
    """`[S, K]` bool: which listed links (`neighbors`, `neighbor_mask` `[S, K]`, the
    context's) deliver this round (column 0, the slot itself, always)."""
    if links.model == "ideal":
        return neighbor_mask.at[:, 0].set(True)
    if links.model == "bernoulli":
        p = links.perr if links.failure is None else links.failure
        got = neighbor_mask & (_link_uniforms(key, *neighbors.shape) >= p)
    else:
        s, k = neighbors.shape
        rx = jnp.broadcast_to(jnp.arange(s)[:, None], (s, k)).reshape(-1)
        got = physical_received(
            key,
            links.positions,
            rx,
            neighbors.reshape(-1),
            links.active,
            links.gamma_th,
            links.channel(),
        ).reshape(s, k)
        got = got & neighbor_mask
    return got.at[:, 0].set(True)


def _link_uniforms(key: jax.Array, s: int, k: int) -> jax.Array:
    """`[S, K]` U[0, 1) draws, link (i, k) from `fold_in(fold_in(key, i), k)`: a link's draw
    does not depend on how many slots or links are stacked with it (a sweep's padding)."""

    def one(i: jax.Array, j: jax.Array) -> jax.Array:
        return jax.random.uniform(jax.random.fold_in(jax.random.fold_in(key, i), j))

    return jax.vmap(lambda i: jax.vmap(lambda j: one(i, j))(jnp.arange(k)))(jnp.arange(s))


# --------------------------------------------------------------------------- state across rounds
class LinkTrack(flax.struct.PyTreeNode):
    """Per-link state the runner keeps across rounds (`stale` and/or `mobility`).

    Attributes:
      cache: `[S, K, ...]` params pytree, the last model received over each listed link
        (zeros before the first), or None without `stale`.
      age: `[S, K]` int32 rounds since the link last delivered (0: this round), or None.
      seen: `[S, K]` bool, a model has arrived over the link since it was listed, or None.
      walk: the mobility state (`RandomWaypoint` / `GaussianWalk`, positions `[S, 2]`) or None.
      neighbors: `[S, K]` int32 current lists (re-selected with mobility), or None.
      neighbor_mask: `[S, K]` bool, or None.
      rounds_done: `[]` int32.
    """

    cache: Any
    age: Any
    seen: Any
    walk: Any
    neighbors: Any
    neighbor_mask: Any
    rounds_done: jax.Array


def needs_track(links: Links | None) -> bool:
    """Whether the runner keeps a `LinkTrack` for these links."""
    return links is not None and (links.stale or links.motion is not None)


def init_track(key: jax.Array, ctx: Any, params: Any) -> LinkTrack:
    """The initial `LinkTrack` of a context (`params [S, ...]`: one slot's model shapes);
    `key` is the run's init key (the waypoints' first draw)."""
    links = ctx.links
    shape = ctx.neighbors.shape
    cache = age = seen = walk = None
    if links.stale:
        cache = jax.tree.map(lambda p: jnp.zeros(shape + p.shape[1:], p.dtype), params)
        age, seen = jnp.zeros(shape, jnp.int32), jnp.zeros(shape, bool)
    if links.motion is not None:
        m = links.motion
        walker = RandomWaypoint if m.model == "waypoint" else GaussianWalk
        walk = walker.init(jax.random.fold_in(key, MOTION_SALT), links.positions, m.area, m.speed)
    lists = (ctx.neighbors, ctx.neighbor_mask) if links.motion is not None else (None, None)
    track = LinkTrack(cache, age, seen, walk, lists[0], lists[1], jnp.zeros((), jnp.int32))
    return jax.tree.map(lambda a: jnp.array(a, copy=True), track)  # the round donates it


class Drawn(flax.struct.PyTreeNode):
    """A round's lists and outcome: `received`, `neighbors`, `neighbor_mask` `[S, K]` (the
    lists before the draw restricted the mask)."""

    received: jax.Array
    neighbors: jax.Array
    neighbor_mask: jax.Array


def begin_round(ctx: Any, track: LinkTrack | None, key: jax.Array) -> tuple[Any, dict, Drawn]:
    """The round's context and records, and what was drawn (`Drawn`).

    With mobility: the current lists (re-selected at rounds `reselect_every`, 2x, ...), the
    positions and the listed links' P_err of the current geometry. Then this round's draw;
    with `stale`: a failed link that delivered before stays in the mask, its model taken from
    the cache (`Links.source`). `ctx.neighbor_mask` holds what the algorithm may combine.
    """
    links = ctx.links
    records: dict[str, Any] = {}
    if track is not None and links.motion is not None:
        ctx, records = _moved(ctx, track)
        links = ctx.links
    drawn_lists = (ctx.neighbors, ctx.neighbor_mask)
    received = sample_received(
        jax.random.fold_in(key, LINK_SALT), links, ctx.neighbors, ctx.neighbor_mask
    )
    real = ctx.neighbor_mask.at[:, 0].set(False)
    rate = 1.0 - (received & real).sum() / jnp.maximum(real.sum(), 1)
    records = {**records, "link_received": received, "link_failure_rate": rate.astype(jnp.float32)}
    mask = ctx.neighbor_mask & received
    drawn = Drawn(received, *drawn_lists)
    if links.stale:
        assert track is not None  # the runner keeps a track whenever links are stale
        seen = _kept(track.seen, drawn, track)
        mask, source = stale_view(received, seen, ctx.neighbors, ctx.neighbor_mask)
        cache = jax.tree.map(lambda c: c.reshape((-1, *c.shape[2:])), track.cache)
        links = links.replace(cache=cache, source=source)
    return ctx.replace(neighbor_mask=mask, links=links), records, drawn


def end_round(
    ctx: Any, track: LinkTrack, drawn: Drawn, sent: Any, key: jax.Array
) -> tuple[LinkTrack, dict]:
    """After the algorithm's round: cache what arrived of what was `sent` (`[S, ...]` the
    models the round returned as sent; None: nothing, as Local), age the links, move the
    nodes. Returns the new track and the records (`link_age [S, K]`)."""
    links, records = ctx.links, {}
    if links.stale:
        got = drawn.received & drawn.neighbor_mask
        seen, age = _kept(track.seen, drawn, track), _kept(track.age, drawn, track)
        cache = track.cache
        if sent is not None:
            cache = update_cache(cache, sent, drawn.neighbors, got)
            seen = seen | got
        age = jnp.where(got, 0, jnp.minimum(age, np.iinfo(np.int32).max - 1) + 1)
        track = track.replace(cache=cache, seen=seen, age=age.astype(jnp.int32))
        records["link_age"] = track.age
    if links.motion is not None:
        m = links.motion
        walk = track.walk.step(jax.random.fold_in(key, MOTION_SALT), m.dt)
        lists = {"neighbors": drawn.neighbors, "neighbor_mask": drawn.neighbor_mask}
        track = track.replace(walk=walk, **lists)
    return track.replace(rounds_done=track.rounds_done + 1), records


def _kept(values: jax.Array, drawn: Drawn, track: LinkTrack) -> jax.Array:
    """Per-link values of the track, reset (0 / False) where a re-selection changed the link."""
    if track.neighbors is None:
        return values
    same = (drawn.neighbors == track.neighbors) & (drawn.neighbor_mask == track.neighbor_mask)
    return jnp.where(same, values, jnp.zeros_like(values))


def stale_view(
    received: jax.Array, seen: jax.Array, neighbors: jax.Array, neighbor_mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """`(mask, source)` `[S, K]`: a listed link is usable if it delivered now or before;
    `source[s, k]` is `neighbors[s, k]` (fresh) or `S + s K + k` (its row in the cache)."""
    s, k = neighbors.shape
    mask = neighbor_mask & (received | seen)
    cached = s + jnp.arange(s * k, dtype=jnp.int32).reshape(s, k)
    return mask, jnp.where(received, neighbors, cached).astype(jnp.int32)


def update_cache(cache: Any, sent: Any, neighbors: jax.Array, received: jax.Array) -> Any:
    """`cache [S, K, ...]` with `sent[neighbors[s, k]]` where `received [S, K]`."""

    def leaf(c: jax.Array, p: jax.Array) -> jax.Array:
        got = received.reshape(received.shape + (1,) * (p.ndim - 1))
        return jnp.where(got, jnp.take(p, neighbors, axis=0), c)

    return jax.tree.map(leaf, cache, sent)


# --------------------------------------------------------------------------- mobility
def _moved(ctx: Any, track: LinkTrack) -> tuple[Any, dict]:
    """The context at the track's positions: lists re-selected when due, P_err updated."""
    links, m = ctx.links, ctx.links.motion
    if m.sparse is not None:
        return _moved_sparse(ctx, track)
    pos = track.walk.positions.astype(jnp.float32)
    nbr, mask = track.neighbors, track.neighbor_mask
    full = None
    if m.reselect_every > 0 or m.track_perr:
        full = slot_perr_matrix(pos, links.gamma_th, links.channel(), m.moments)
    changed = jnp.zeros((), bool)
    if m.reselect_every > 0:
        assert full is not None
        due = (track.rounds_done > 0) & (track.rounds_done % m.reselect_every == 0)
        new_nbr, new_mask = reselect(full, nbr.shape[1], m.eps, m.single, m.width, links.active)
        nbr, mask = jnp.where(due, new_nbr, nbr), jnp.where(due, new_mask, mask)
        changed = due & ((nbr != track.neighbors) | (mask != track.neighbor_mask)).any()
    perr = links.perr
    if m.track_perr:
        assert full is not None
        perr = jnp.where(mask, jnp.take_along_axis(full, nbr, 1), 0.0).at[:, 0].set(0.0)
    links = links.replace(positions=pos, perr=perr, reselected=changed)
    records = {"positions": pos, "neighbors": nbr, "neighbor_mask": mask, "reselected": changed}
    return ctx.replace(neighbors=nbr, neighbor_mask=mask, links=links), records


def _moved_sparse(ctx: Any, track: LinkTrack) -> tuple[Any, dict]:
    """`_moved` over candidate lists: the `candidates` nearest found again, P_err of them
    and of the current lists only, O(S K) links (each with its cutoff's interferers)."""
    links, m = ctx.links, ctx.links.motion
    pos = track.walk.positions.astype(jnp.float32)
    nbr, mask = track.neighbors, track.neighbor_mask
    changed, perr = jnp.zeros((), bool), links.perr
    if m.reselect_every > 0 or m.track_perr:
        cand, cmask, cperr, lperr = _sparse_perr(pos, nbr, mask, links)
        if m.reselect_every > 0:
            due = (track.rounds_done > 0) & (track.rounds_done % m.reselect_every == 0)
            new = reselect_sparse(cand, cmask, cperr, nbr.shape[1], m.eps, m.width)
            nbr, mask = jnp.where(due, new[0], nbr), jnp.where(due, new[1], mask)
            lperr = jnp.where(due, new[2], lperr)
            changed = due & ((nbr != track.neighbors) | (mask != track.neighbor_mask)).any()
        if m.track_perr:
            perr = jnp.where(mask, lperr, 0.0).at[:, 0].set(0.0)
    links = links.replace(positions=pos, perr=perr, reselected=changed)
    records = {"positions": pos, "neighbors": nbr, "neighbor_mask": mask, "reselected": changed}
    return ctx.replace(neighbors=nbr, neighbor_mask=mask, links=links), records


def _sparse_perr(
    pos: jax.Array, nbr: jax.Array, mask: jax.Array, links: Links
) -> tuple[jax.Array, ...]:
    """At positions `pos [S, 2]`: the candidates `(idx, mask) [S, C]` among the active
    slots, their P_err `[S, C]` and the current lists' `[S, K]` (column 0: 0), one call."""
    sp, m = links.motion.sparse, links.motion
    cand, cmask, _ = grid.nearest(pos, sp.candidates, sp.near, valid=links.active)
    far = None
    if sp.far is not None:
        far = grid.within(pos, sp.cutoff, sp.far, valid=links.active)[:2]
    idx = jnp.concatenate([cand, nbr[:, 1:]], axis=1)
    both = jnp.concatenate([cmask, mask[:, 1:]], axis=1)
    p = traced_error_probability(
        pos,
        idx,
        both,
        links.gamma_th,
        links.channel(),
        moments=m.moments,
        num_nodes=sp.num_nodes,
        interferers=far,
        cutoff=sp.cutoff,
        tail=sp.tail,
    )
    c = cand.shape[1]
    lperr = jnp.concatenate([jnp.zeros_like(p[:, :1]), p[:, c:]], axis=1)
    return cand, cmask, p[:, :c], lperr


def reselect_sparse(
    cand: jax.Array,
    cmask: jax.Array,
    cperr: jax.Array,
    k: int,
    eps: jax.Array,
    width: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`reselect` over candidate lists: row i keeps the (at most `width`, default K - 1)
    candidates `cand [S, C]` (`cmask`) with `P_err < eps` (every one with `eps = inf`), the
    lowest P_err first (ties: the lower slot index, as `reselect`). Returns the lists and
    mask `[S, K]` and each listed link's P_err `[S, K]` (column 0 and padding 0)."""
    s, c = cand.shape
    by_index = jnp.argsort(cand, axis=1, stable=True)
    cand, cmask, cperr = (jnp.take_along_axis(a, by_index, 1) for a in (cand, cmask, cperr))
    ok = cmask & (cperr < eps)
    chosen = jax.vmap(_lowest, (0, 0, None))(ok, cperr, k - 1 if width is None else width)
    last = jnp.iinfo(jnp.int32).max  # the unchosen after the chosen, these by index
    at = jnp.argsort(jnp.where(chosen, cand, last), axis=1, stable=True)[:, : k - 1]
    if at.shape[1] < k - 1:  # fewer candidates than list columns
        at = jnp.pad(at, ((0, 0), (0, k - 1 - at.shape[1])), constant_values=0)
        chosen = jnp.pad(chosen, ((0, 0), (0, k - 1 - c)))
    real = jnp.take_along_axis(chosen, at, 1)
    own = jnp.arange(s, dtype=jnp.int32)[:, None]
    picked = jnp.where(real, jnp.take_along_axis(cand, at, 1), own)
    nbr = jnp.concatenate([own, picked], axis=1).astype(jnp.int32)
    link = jnp.where(real, jnp.take_along_axis(cperr, at, 1), 0.0)
    perr = jnp.concatenate([jnp.zeros((s, 1), cperr.dtype), link], axis=1)
    return nbr, jnp.concatenate([jnp.ones((s, 1), bool), real], axis=1), perr


def mobility_summary(methods: dict[str, dict[str, Any]]) -> dict[str, list]:
    """The result's `network["mobility"]`: positions and lists at round 1 and at every
    re-selection that changed them, `{"rounds": [R'], "positions": [R'][S][2],
    "neighbors": [R'][S][K], "neighbor_mask": [R'][S][K]}` (rounds counted from 1, as the
    rows; every method sees the same movement, the longest record is used). Per round the
    methods' records hold `positions`, `neighbors`, `neighbor_mask` and `reselected`."""
    recs = [m["records"] for m in methods.values() if "reselected" in m.get("records", {})]
    if not recs:
        return {}
    rec = max(recs, key=lambda r: len(r["reselected"]))
    rounds = [r for r, flag in enumerate(rec["reselected"]) if r == 0 or flag]
    out = {"rounds": [r + 1 for r in rounds]}
    for key in ("positions", "neighbors", "neighbor_mask"):
        out[key] = [rec[key][r] for r in rounds]
    return out


def slot_perr_matrix(
    positions: jax.Array, gamma_th: jax.Array, params: ChannelParams, moments: str
) -> jax.Array:
    """`[S, S]` P_err of link j -> i between slots at `positions [S, 2]`, every other slot
    interfering (jittable; diagonal 0). O(S^3) quadrature terms."""
    s = positions.shape[0]
    if s == 1:
        return jnp.zeros((1, 1), jnp.float32)
    others = np.array([[j for j in range(s) if j != i] for i in range(s)], np.int32)
    p = error_probability(positions, positions[others], gamma_th, params, moments=moments)
    rows = np.repeat(np.arange(s), s - 1).reshape(s, s - 1)
    return jnp.zeros((s, s), jnp.float32).at[rows, others].set(p.astype(jnp.float32))


def reselect(
    perr: jax.Array,
    k: int,
    eps: jax.Array,
    single: bool,
    width: jax.Array | None = None,
    active: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Neighbor lists `[S, K]` (the `neighbor_lists` layout) re-selected from `perr [S, S]`.

    Network mode: row i keeps the (at most `width`, default K - 1) links j -> i with `P_err <
    eps` (every link with `eps = inf`: no channel-aware selection) from `active [S]` slots
    (default all), the lowest P_err first. Single mode: slot 0 selects so, and its group
    (slot 0 and the selected) is fully connected; every other slot lists only itself.
    """
    s = perr.shape[0]
    limit = k - 1 if width is None else width
    off = ~jnp.eye(s, dtype=bool)
    ok = off & (perr < eps)
    if active is not None:
        ok = ok & active[None, :]
    best = jax.vmap(lambda o, p: _lowest(o, p, limit))
    if single:
        group = best(ok[:1], perr[:1])[0].at[0].set(True)
        ok = group[:, None] & group[None, :] & off
    chosen = best(ok, perr)
    idx = jnp.sort(jnp.where(chosen, jnp.arange(s), s), axis=1)[:, : k - 1]
    own = jnp.arange(s, dtype=jnp.int32)[:, None]
    real = idx < s
    nbr = jnp.concatenate([own, jnp.where(real, idx, own)], axis=1).astype(jnp.int32)
    return nbr, jnp.concatenate([jnp.ones((s, 1), bool), real], axis=1)


def _lowest(ok: jax.Array, score: jax.Array, m: int | jax.Array) -> jax.Array:
    """`[S]` bool: the (at most) `m` entries of `ok` with the lowest `score` (ties: index)."""
    order = jnp.argsort(jnp.where(ok, score, jnp.inf), stable=True)
    rank = jnp.argsort(order)
    return ok & (rank < m)
