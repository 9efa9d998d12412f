"""Pieces shared by the field's further methods (SCAFFOLD, FedDyn, FedNova, the
server optimizers): the group average of what the slots sent, and of side values (control
variates) that travel only with a fresh model.

A stale link (``stale=True``) hands over the last *model* received over it
(``neighbor_models``); side values are not cached, so they are averaged over the links that
delivered this round only (``fresh_average``): column 0, the slot itself, always is.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pfedwn_jax.algorithms.base import RoundContext
from pfedwn_jax.algorithms.common import group_average_weights, neighbor_models
from pfedwn_jax.engine import mix_sparse


def group_average(params: Any, ctx: RoundContext) -> Any:
    """``[S, ...]``: each slot's sample-weighted mean of the models ``params [S, ...]`` its
    neighbor list delivered (stale copies included): FedAvg's aggregate."""
    weights = group_average_weights(ctx.neighbors, ctx.neighbor_mask, ctx.num_samples)
    pool, index = neighbor_models(params, ctx)
    return mix_sparse(pool, index, weights, shards=ctx.shards)


def fresh_mask(ctx: RoundContext) -> jax.Array:
    """``[S, K]`` bool: the list entries whose model arrived this round (not a stale copy)."""
    index = ctx.links.source if _stale(ctx) else ctx.neighbors
    return jnp.asarray(ctx.neighbor_mask, bool) & (jnp.asarray(index) < ctx.num_slots)


def fresh_average(values: Any, ctx: RoundContext) -> Any:
    """``[S, ...]``: each slot's sample-weighted mean of ``values [S, ...]`` over the entries
    of its list that arrived this round (itself included)."""
    weights = group_average_weights(ctx.neighbors, fresh_mask(ctx), ctx.num_samples)
    return mix_sparse(values, jnp.asarray(ctx.neighbors), weights, shards=ctx.shards)


def check_sgd(ctx: RoundContext, name: str) -> None:
    """Raise a ValueError unless the context trains with its own SGD (``lr``): a method whose
    update rule needs the learning rate (SCAFFOLD's option II, APFL's clipped mixing weight)."""
    if ctx.optimizer is not None or ctx.lr is None:
        raise ValueError(f"{name} needs the context's SGD learning rate `lr`, not an optimizer")


def _stale(ctx: RoundContext) -> bool:
    links = getattr(ctx, "links", None)
    return links is not None and getattr(links, "cache", None) is not None
