"""Body/head machinery shared by the model-splitting methods (FedPer, FedRep, FedBABU,
LG-FedAvg, FedRoD): average one part of the model over the neighbor lists, train one part
with the other frozen.

The split is the model's own declaration (``pfedwn_jax.models.split``): the head is a set of
top-level parameter keys, the body the rest. A model that declares none is refused by name
(``split_keys``) when the method's state is built, before anything is compiled.
"""

from __future__ import annotations

from typing import Any

import jax

from pfedwn_jax.algorithms.base import RoundContext
from pfedwn_jax.algorithms.common import (
    BaselineState,
    group_average_weights,
    local_update,
    neighbor_models,
)
from pfedwn_jax.engine import ClientState, mix_sparse, weighted_ce
from pfedwn_jax.models.split import require_split


def split_keys(ctx: RoundContext, method: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(body keys, head keys)`` of the context's model (top-level parameter keys); a
    ``ValueError`` naming ``method`` and the model if the model declares no split."""
    model = require_split(ctx.model, method)
    keys = tuple(jax.eval_shape(model.init, jax.random.key(0)))
    return tuple(k for k in keys if k not in model.head), tuple(model.head)


def average_part(params: Any, ctx: RoundContext, keys: tuple[str, ...]) -> Any:
    """``params [S, ...]`` with the subtrees ``keys`` replaced by each slot's sample-weighted
    group average of them (FedAvg over the neighbor lists, ``neighbor_models``' pool: with
    stale links a failed link's last copy); the other subtrees stay each slot's own."""
    if not keys:
        return params
    weights = group_average_weights(ctx.neighbors, ctx.neighbor_mask, ctx.num_samples)
    pool, index = neighbor_models(params, ctx)
    mixed = mix_sparse({k: pool[k] for k in keys}, index, weights, shards=ctx.shards)
    return {**params, **mixed}


def frozen_loss(ctx: RoundContext, frozen: tuple[str, ...]) -> Any:
    """A ``loss_fn`` whose gradient is zero on the subtrees ``frozen`` (stop_gradient): the
    cross-entropy of the model, the other subtrees trained."""
    model = ctx.model

    def loss_fn(params, x, y, w, aux_s):
        del aux_s
        fixed = {k: jax.lax.stop_gradient(params[k]) for k in frozen}
        return weighted_ce(model.apply({**params, **fixed}, x), y, w)

    return loss_fn


def train_part(
    ctx: RoundContext,
    clients: ClientState,
    key: jax.Array,
    frozen: tuple[str, ...],
    **schedule: Any,
) -> tuple[ClientState, dict[str, jax.Array]]:
    """``local_update`` of every slot with the subtrees ``frozen`` held fixed: zero gradient,
    and their values restored afterwards (so an optimizer with momentum moves them neither)."""
    if not frozen:
        return local_update(ctx, clients, key, **schedule)
    trained, metrics = local_update(ctx, clients, key, loss_fn=frozen_loss(ctx, frozen), **schedule)
    params = {**trained.params, **{k: clients.params[k] for k in frozen}}
    return trained._replace(params=params), metrics


def train_then_average_part(
    state: BaselineState, key: jax.Array, ctx: RoundContext, keys: tuple[str, ...]
) -> tuple[BaselineState, Any]:
    """Local training of the whole model, then the subtrees ``keys`` averaged over each
    slot's group (``average_part``); returns ``(state, sent)``, ``sent`` the trained models."""
    clients, metrics = local_update(ctx, state.clients, key)
    params = average_part(clients.params, ctx, keys)
    return BaselineState(clients._replace(params=params), metrics["loss"]), clients.params
