"""Averaging over the delivered neighbors, shared by the methods (pure, jittable).

The group average (FedAvg's aggregate, used by SCAFFOLD, FedDyn, FedNova, the server
optimizers) and the gossip pieces of the decentralized and clustered methods. A stale link
(``stale=True``) hands over the last *model* received over it (``neighbor_models``); side
values (control variates, push-sum's weights) are not cached, so they are averaged over the
links that delivered this round only (``fresh_mask``, ``fresh_average``).

Inside a round ``ctx.neighbor_mask`` holds the links whose model the slot may combine (what
arrived, or with ``stale`` links a last copy); ``listed_mask`` is the mask the selection
made before this round's draw. The gossip weights are built from the listed graph (what a
node knows in advance: its neighbors and their degrees, sent along with their models) and
restricted to what arrived (``engine.gossip.metropolis_weights``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pfedwn_jax.algorithms.base import RoundContext
from pfedwn_jax.algorithms.common import group_average_weights, neighbor_models
from pfedwn_jax.engine import mix_sparse
from pfedwn_jax.engine.gossip import metropolis_weights


def listed_mask(ctx: RoundContext) -> jax.Array:
    """``[S, K]`` bool: the listed links of this round (before the link draw)."""
    links = ctx.links
    listed = None if links is None else getattr(links, "listed", None)
    return jnp.asarray(ctx.neighbor_mask if listed is None else listed, bool)


def fresh_mask(ctx: RoundContext) -> jax.Array:
    """``[S, K]`` bool: the links that delivered a model *this* round (``ctx.neighbor_mask``
    without the stale copies of failed links); for methods whose messages carry mass or a
    state that must not be counted twice (push-sum's weights)."""
    mask = jnp.asarray(ctx.neighbor_mask, bool)
    links = ctx.links
    if links is None or getattr(links, "source", None) is None:
        return mask
    return mask & (links.source < ctx.num_slots)


def group_average(params: Any, ctx: RoundContext) -> Any:
    """``[S, ...]``: each slot's sample-weighted mean of the models ``params [S, ...]`` its
    neighbor list delivered (stale copies included): FedAvg's aggregate."""
    weights = group_average_weights(ctx.neighbors, ctx.neighbor_mask, ctx.num_samples)
    return gossip(params, ctx, weights)


def fresh_average(values: Any, ctx: RoundContext) -> Any:
    """``[S, ...]``: each slot's sample-weighted mean of ``values [S, ...]`` over the entries
    of its list that arrived this round (itself included)."""
    weights = group_average_weights(ctx.neighbors, fresh_mask(ctx), ctx.num_samples)
    return mix_sparse(values, jnp.asarray(ctx.neighbors), weights, shards=ctx.shards)


def mh_weights(ctx: RoundContext) -> jax.Array:
    """``[S, K]`` Metropolis-Hastings weights of the listed graph over the links usable this
    round (``ctx.neighbor_mask``), renormalised per row."""
    return metropolis_weights(ctx.neighbors, listed_mask(ctx), ctx.neighbor_mask)


def gossip(params: Any, ctx: RoundContext, weights: jax.Array) -> Any:
    """``out_s = sum_k weights[s, k] model(s, k)`` over the models on ``s``'s list
    (``neighbor_models``: with stale links a failed link's last copy); ``params [S, ...]``
    are the models the slots send this round."""
    pool, index = neighbor_models(params, ctx)
    return mix_sparse(pool, index, weights, shards=ctx.shards)
