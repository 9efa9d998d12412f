"""Gossip pieces shared by the decentralized and clustered methods (pure, jittable).

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
from pfedwn_jax.algorithms.common import neighbor_models
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
