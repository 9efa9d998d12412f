"""pFedWN's EM (paper Alg. 1, App. B): the weights pi of each target over its neighbor list.

The per-target work (cross-evaluation of the components, E-step, M-steps) runs over chunks of
targets (``em_chunk``; ``engine.chunked_rows``); the refinement with fixed models then runs on
every target's ``[S, K - 1, N]`` losses at once. See ``pfedwn_jax.algorithms.pfedwn`` for the
method, its schedule and its hyperparameters (``PFedWNHParams``).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from pfedwn_jax.algorithms.base import RoundContext
from pfedwn_jax.algorithms.common import append_slots, local_update
from pfedwn_jax.em import estimate_weights, m_step, near_uniform, responsibilities
from pfedwn_jax.engine import ClientState, cross_evaluate, mix_sparse, take_slots
from pfedwn_jax.engine.evaluate import slot_bytes
from pfedwn_jax.engine.tree import block_size, chunked_rows


class EMHParams(Protocol):
    """The fields of ``pfedwn.PFedWNHParams`` the EM reads (typed here, so this module does
    not import the method's module, which imports this one)."""

    chunk: int
    component_epochs: int
    component_updates: bool
    em_iters: int
    em_steps: int
    em_tol: float
    floor: float
    mix_components: bool
    pi_from: str
    uniform_guard: float


#: Bytes of one chunk's working copies when the hyperparameter ``chunk`` is 0 (``em_chunk``).
CHUNK_BYTES = 256 * 2**20


def weighed(ctx: RoundContext) -> jax.Array:
    """``[S, K]`` bool: target row ``s`` weighs list entry ``k`` (a real neighbor, ``k >= 1``)."""
    k = ctx.neighbors.shape[1]
    return (jnp.arange(k) > 0)[None, :] & ctx.neighbor_mask & ctx.is_target[:, None]


class EMPairs(NamedTuple):
    """The EM components: list entries ``(slot, col)``, ``col >= 1``, real pairs first.

    Attributes:
      slot: ``[P]`` int32 target slot of each pair, ``P = S (K - 1)``.
      col: ``[P]`` int32 column of the pair in the target's neighbor list.
      neighbor: ``[P]`` int32 the neighbor's slot (``neighbors[slot, col]``).
      valid: ``[P]`` bool, a real pair (``weighed``); the masked pairs come last.
      inverse: ``[S * (K - 1)]`` int32, the pair of each row-major entry ``(s, k - 1)``.
    """

    slot: jax.Array
    col: jax.Array
    neighbor: jax.Array
    valid: jax.Array
    inverse: jax.Array


def em_pairs(ctx: RoundContext) -> EMPairs:
    """The ``S (K - 1)`` EM pairs of the lists (jittable, fixed shape; see ``EMPairs``).

    Real pairs keep their row-major order at the front, so pair ``p`` (whose index keys its
    minibatch order in ``local_update``) is the ``p``-th real target-neighbor link whatever the
    padding: results do not depend on ``K`` or on padded slots.
    """
    k = ctx.neighbors.shape[1]
    valid = weighed(ctx)[:, 1:].reshape(-1)  # [S (K - 1)] row-major
    order = jnp.argsort(~valid, stable=True).astype(jnp.int32)
    slot, col = order // (k - 1), order % (k - 1) + 1
    inverse = jnp.argsort(order).astype(jnp.int32)
    return EMPairs(slot, col, ctx.neighbors[slot, col], valid[order], inverse)


def _with_self_column(pi: jax.Array) -> jax.Array:
    """``[..., S, K - 1]`` weights over the neighbor columns -> ``[..., S, K]`` (column 0 = 0)."""
    pad = [(0, 0)] * (pi.ndim - 1) + [(1, 0)]
    return jnp.pad(pi, pad)


def materialises(hp: EMHParams) -> bool:
    """Whether the EM holds its components as models of their own (M-step 2 trains them, or
    the E-step evaluates them); otherwise it reads the received models in the pool."""
    return hp.pi_from != "received" or (hp.component_updates and hp.mix_components)


def chunk_size(hp: EMHParams, slots: int, width: int, model_bytes: int, samples: int) -> int:
    """Targets per chunk of the EM (static): ``hp.chunk``, or (0) as many as keep one chunk's
    working copies under ``CHUNK_BYTES``: per target its ``width - 1`` components
    (``model_bytes`` each, with optimizer state) where ``materialises``, else its losses,
    responsibilities and masks ``3 x [width - 1, samples]`` float32. At most ``slots``."""
    if hp.chunk:
        return min(hp.chunk, slots)
    per_entry = model_bytes if materialises(hp) else 3 * 4 * samples
    return block_size(slots, max(width - 1, 1) * per_entry, CHUNK_BYTES)


def em_chunk(params: Any, ctx: RoundContext, hp: EMHParams) -> int:
    """``chunk_size`` of a round's context and models (``params`` leaves ``[S, ...]``)."""
    one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), params)
    opt = jax.eval_shape(ctx.tx.init, one)
    model = slot_bytes(params) + sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(opt))
    s, k = ctx.neighbors.shape
    return chunk_size(hp, s, k, model, int(ctx.train.y.shape[1]))


def estimate_pi(
    params: Any,
    key: jax.Array,
    ctx: RoundContext,
    hp: EMHParams,
    received: tuple[Any, jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """EM estimate of pi from the slots' current models (see the module docstring).

    ``received``: ``neighbor_models(params, ctx)``, where the components come from (stale
    links: a failed link's cached copy); default ``(params, ctx.neighbors)``. The per-target
    work (cross-evaluation, E-step, M-steps) runs over chunks of ``em_chunk`` targets
    (``chunked_rows``); the refinement with fixed models then runs on every target's
    ``[S, K - 1, N]`` losses at once. The result does not depend on the chunk.

    Returns ``(pi [S, K], trace [em_steps + 2, S, K])`` (prior, each outer step, final).
    """
    s = ctx.num_slots
    pool = (params, ctx.neighbors) if received is None else received
    train = hp.component_updates and hp.pi_from != "received"  # pi needs the trained ones

    def chunk(rows: jax.Array, real: jax.Array) -> tuple[jax.Array, jax.Array]:
        trace, losses, _ = _chunk_em(rows, real, key, ctx, hp, pool, train)
        return jnp.swapaxes(trace, 0, 1), losses  # [C, em_steps, K - 1], [C, K - 1, N]

    steps, losses = chunked_rows(chunk, s, em_chunk(params, ctx, hp))
    nmask, smask = weighed(ctx)[:, 1:], ctx.train.mask[ctx.data_client]
    nmask = nmask & ~near_uniform(losses, smask, ctx.model.num_classes, hp.uniform_guard)
    pi0 = _uniform(nmask)
    last = steps[:, -1] if hp.em_steps else pi0
    pi = estimate_weights(
        losses, smask, nmask, last, num_iters=hp.em_iters, tol=hp.em_tol, floor=hp.floor
    )
    trace = jnp.concatenate([pi0[None], jnp.swapaxes(steps, 0, 1), pi[None]], axis=0)
    return _with_self_column(pi), _with_self_column(trace)


def _uniform(nmask: jax.Array) -> jax.Array:
    """The uniform prior ``[..., K - 1]`` over each row's weighed neighbors."""
    return (nmask / jnp.maximum(nmask.sum(-1, keepdims=True), 1)).astype(jnp.float32)


def _chunk_em(
    rows: jax.Array,
    real: jax.Array,
    key: jax.Array,
    ctx: RoundContext,
    hp: EMHParams,
    received: tuple[Any, Any],
    train: bool,
) -> tuple[jax.Array, Any, Any]:
    """The outer EM steps of the targets ``rows [C]`` (``real [C]``: False on padding):
    ``(trace [em_steps, C, K - 1], losses [C, K - 1, N], components)``.

    ``losses`` are what the refinement evaluates (the received models', or with
    ``pi_from="components"`` the components' after the last M-step 2); ``components``
    (leaves ``[C (K - 1), ...]``, entry ``(c, k - 1)`` at row ``c (K - 1) + k - 1``) the
    components after M-step 2 when ``train``, else None. Entry ``(s, k)`` trains with the
    key of its EM pair (``em_pairs``), so a chunk trains as the whole network would.
    """
    pool, index = received
    c, k1 = rows.shape[0], ctx.neighbors.shape[1] - 1
    nmask = weighed(ctx)[rows, 1:] & real[:, None]  # [C, K - 1]
    smask = ctx.train.mask[ctx.data_client[rows]]  # [C, N] the target's real samples
    dc = jnp.repeat(ctx.data_client[rows], k1)  # entry (c, k) is evaluated on c's data
    source = index[rows, 1:].reshape(-1)  # [C (K - 1)] each entry's model in the pool

    def losses_of(models: Any) -> jax.Array:  # None: the received models, in the pool
        at = source if models is None else jnp.arange(c * k1, dtype=jnp.int32)
        per = cross_evaluate(ctx.model, pool if models is None else models, ctx.train, at, dc)
        return per["loss"].astype(jnp.float32).reshape(c, k1, -1)

    on_received = hp.pi_from == "received"
    fixed = losses_of(None) if on_received else None  # the E-step's losses, every step
    comps = None
    if train or not on_received:  # (``materialises``)
        models = take_slots(pool, source)
        comps = ClientState(models, jax.vmap(ctx.tx.init)(models))
    ids = em_pairs(ctx).inverse.reshape(-1, k1)[rows].reshape(-1)

    def em_step(carry: tuple[Any, jax.Array], step: jax.Array):
        comp_state, pi = carry
        losses = fixed if on_received else losses_of(comp_state.params)
        lam = responsibilities(losses, pi, smask, nmask)  # E-step
        pi = m_step(lam, smask, nmask, hp.floor)  # M-step 1: pi = mean_i lambda
        if train:  # M-step 2: responsibility-weighted training
            step_key = jax.random.fold_in(key, step)
            comp_state = _m_step_2(ctx, comp_state, step_key, lam, nmask, dc, ids, hp)
        return (comp_state, pi), pi

    carry, trace = jax.lax.scan(em_step, (comps, _uniform(nmask)), jnp.arange(hp.em_steps))
    final: Any = carry[0]  # ClientState where held (``train or not on_received``)
    losses = fixed if on_received else losses_of(final.params)
    return trace, losses, final.params if train else None


def _m_step_2(
    ctx: RoundContext,
    comps: ClientState,
    key: jax.Array,
    lam: jax.Array,
    nmask: jax.Array,
    dc: jax.Array,
    ids: jax.Array,
    hp: EMHParams,
) -> ClientState:
    """App. B's M-step 2: ``component_epochs`` epochs of every component (``[C (K - 1), ...]``)
    on its target's data (``dc``), sample ``i`` weighted by ``lam [C, K - 1, N]``; entries
    off ``nmask`` take no step; ``ids`` key each component's minibatch order."""
    comps, _ = local_update(
        ctx,
        comps,
        key,
        data_client=dc,
        epochs=hp.component_epochs,
        sample_weight=lam.reshape(-1, lam.shape[-1]),
        active=nmask.reshape(-1),
        slot_ids=ids,
    )
    return comps


def em_components(
    params: Any,
    key: jax.Array,
    ctx: RoundContext,
    hp: EMHParams,
    received: tuple[Any, jax.Array] | None = None,
) -> Any:
    """The components of every ``(target, list column k >= 1)`` entry after the outer EM
    steps, leaves ``[S, K - 1, ...]``: after M-step 2 where the round uses them (see the
    module docstring), else the received models. All at once (``S (K - 1)`` models: small
    networks, tests and studies; the round handles them chunk by chunk)."""
    s, k = ctx.neighbors.shape
    pool = (params, ctx.neighbors) if received is None else received
    rows, real = jnp.arange(s, dtype=jnp.int32), jnp.ones((s,), bool)
    train = hp.component_updates and (hp.mix_components or hp.pi_from != "received")
    _, _, comps = _chunk_em(rows, real, key, ctx, hp, pool, train)
    if comps is None:
        comps = take_slots(pool[0], jnp.asarray(pool[1])[:, 1:].reshape(-1))
    return jax.tree.map(lambda a: a.reshape(s, k - 1, *a.shape[1:]), comps)


def mix_tuned_components(
    params: Any,
    key: jax.Array,
    ctx: RoundContext,
    hp: EMHParams,
    received: tuple[Any, jax.Array],
    weights: jax.Array,
) -> Any:
    """Eq. 5 over M-step 2's components (``mix_components``): ``[S, ...]``, chunk by chunk,
    row ``s`` = ``weights[s, 0] params[s] + sum_k weights[s, k] component(s, k)`` (the
    components recomputed as ``estimate_pi`` computed them)."""
    s, k = ctx.neighbors.shape

    def chunk(rows: jax.Array, real: jax.Array) -> Any:
        _, _, comps = _chunk_em(rows, real, key, ctx, hp, received, True)
        c = rows.shape[0]
        pool = append_slots(take_slots(params, rows), comps)
        cols = c + jnp.arange(c * (k - 1), dtype=jnp.int32).reshape(c, k - 1)
        index = jnp.concatenate([jnp.arange(c, dtype=jnp.int32)[:, None], cols], axis=1)
        return mix_sparse(pool, index, weights[rows])

    return chunked_rows(chunk, s, em_chunk(params, ctx, hp))
