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

The host half (`Links`, `Motion`, `build_links`: the link model a run is set up with) is
`experiment.link_setup`.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax.experiment.link_setup import Links, Shadow
from pfedwn_jax.wireless import (
    ChannelParams,
    GaussianWalk,
    RandomWaypoint,
    cost,
    error_probability,
    grid,
    physical_received,
)
from pfedwn_jax.wireless.links import physical_draw
from pfedwn_jax.wireless.sparse_perr import traced_error_probability

#: Folded into the round key for the link draw, so training keys stay those of `ideal`.
LINK_SALT = 0x11A5
#: Folded into the round key (and the init key) for the node movement.
MOTION_SALT = 0x30B1


def sample_received(
    key: jax.Array, links: Links, neighbors: jax.Array, neighbor_mask: jax.Array
) -> jax.Array:
    """`[S, K]` bool: which listed links (`neighbors`, `neighbor_mask` `[S, K]`, the
    context's) deliver this round (column 0, the slot itself, always)."""
    return sample_links(key, links, neighbors, neighbor_mask)[0]


def sample_links(
    key: jax.Array, links: Links, neighbors: jax.Array, neighbor_mask: jax.Array
) -> tuple[jax.Array, jax.Array | None]:
    """`(received, sinr)`: `sample_received`'s draw and, where the round's cost needs each
    link's rate from its SINR (`needs_sinr`), the `[S, K]` SINR (linear, 0 where the sender
    did not transmit) of the same physical draw on its sub-channel; else None."""
    if links.model == "ideal":
        return neighbor_mask.at[:, 0].set(True), None
    if links.model == "bernoulli":
        p = links.perr if links.failure is None else links.failure
        got = neighbor_mask & (_link_uniforms(key, *neighbors.shape) >= p)
        return got.at[:, 0].set(True), None
    s, k = neighbors.shape
    rx = jnp.broadcast_to(jnp.arange(s)[:, None], (s, k)).reshape(-1)
    args = (key, links.positions, rx, neighbors.reshape(-1), links.active, links.gamma_th)
    shadow = {}
    if links.shadow is not None:
        shadow = {"shadow_key": links.shadow.key, "node_ids": links.shadow.ids}
    sinr = None
    if needs_sinr(links):
        got, sinr = physical_draw(*args, links.channel(), **shadow)
        sinr = sinr.reshape(s, k)
    else:
        got = physical_received(*args, links.channel(), **shadow)
    got = got.reshape(s, k) & neighbor_mask
    return got.at[:, 0].set(True), sinr


def needs_sinr(links: Links) -> bool:
    """Whether the round's cost takes each link's rate from its SINR (``"shannon"`` /
    ``"mcs"``; the config allows them with the physical link model only)."""
    return links.cost is not None and links.cost.params.rate_model != "threshold"


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
    received, sinr = sample_links(
        jax.random.fold_in(key, LINK_SALT), links, ctx.neighbors, ctx.neighbor_mask
    )
    if links.cost is not None:  # retries and the deadline decide what arrives
        received, more = with_cost(ctx, received, key, sinr)
        records = {**records, **more}
    real = ctx.neighbor_mask.at[:, 0].set(False)
    rate = 1.0 - (received & real).sum() / jnp.maximum(real.sum(), 1)
    records = {**records, "link_received": received, "link_failure_rate": rate.astype(jnp.float32)}
    mask = ctx.neighbor_mask & received
    links = links.replace(listed=ctx.neighbor_mask)
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


def with_cost(
    ctx: Any, received: jax.Array, key: jax.Array, sinr: jax.Array | None = None
) -> tuple[jax.Array, dict]:
    """`(delivered [S, K], records)`: the link draw `received` after ARQ retries and the
    deadline (`wireless.cost.round_cost` of `ctx.links.cost`, each link at the rate of its
    `sinr [S, K]` where the rate model needs it), and the round's cost."""
    links = ctx.links
    perr = links.perr if links.failure is None else links.failure
    out = cost.round_cost(
        jax.random.fold_in(key, cost.COST_SALT),
        links.cost,
        links.channel(),
        links.gamma_th,
        ctx.neighbors,
        ctx.neighbor_mask,
        received,
        perr,
        sinr=sinr,
        active=links.active,
    )
    return out.delivered, cost.cost_records(out)


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
        full = slot_perr_matrix(pos, links.gamma_th, links.channel(), m.moments, links.shadow)
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
        shadow=None if links.shadow is None else (links.shadow.key, links.shadow.ids),
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
    positions: jax.Array,
    gamma_th: jax.Array,
    params: ChannelParams,
    moments: str,
    shadow: Shadow | None = None,
) -> jax.Array:
    """`[S, S]` P_err of link j -> i between slots at `positions [S, 2]`, every other slot
    interfering, each pair shadowed by `shadow` if given (jittable; diagonal 0). O(S^3)
    quadrature terms."""
    s = positions.shape[0]
    if s == 1:
        return jnp.zeros((1, 1), jnp.float32)
    others = np.array([[j for j in range(s) if j != i] for i in range(s)], np.int32)
    rows = np.repeat(np.arange(s), s - 1).reshape(s, s - 1)
    shadow_db = None if shadow is None else shadow.pairs(rows, others)
    p = error_probability(
        positions, positions[others], gamma_th, params, moments=moments, shadow_db=shadow_db
    )
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
