"""FedFomo (Zhang et al. 2021, "Personalized Federated Learning with First Order Model
Optimization", ICLR): each slot weighs its neighbors' models by how much they lower the loss
on its own validation data, per unit of distance.

Slot ``i`` holds its model ``theta_i`` (trained last round) and receives its neighbors'
``theta_n`` (what they trained last round; the round's ``sent``). On its validation split
``V_i`` it computes

    w_n = max(0, (L_i(theta_i) - L_i(theta_n)) / (||theta_n - theta_i|| + 1e-5))

normalises them (``w_n / sum_m w_m``) and takes ``theta_i <- theta_i + sum_n w_n (theta_n -
theta_i) = sum_n w_n theta_n``, keeping ``theta_i`` when no neighbor helps (all ``w_n = 0``:
so in round 1, where every model is the shared initial one). Then it trains the result locally
on its training split. This is the paper's update (eq. 6-7) and PFLlib's ``clientfomo`` order
(aggregate, then train); the record ``fomo_weights [S, K]`` holds the weights of each row.

Validation split: the last ``floor(val_fraction * n_i)`` of slot ``i``'s training samples
(PFLlib's ``val_ratio``, default 0.2); the local training uses the rest.

Departures: the paper downloads ``M`` models chosen by an affinity matrix with epsilon-greedy
exploration; here the links decide who is received (every model on the slot's neighbor list
that arrived, with stale links a failed link's last copy), so there is no affinity matrix.

Limit: ``val_fraction = 0`` (no validation data, every weight 0) is Local.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_float
from pfedwn_jax.algorithms.base import RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import (
    baseline_algorithm,
    init_clients,
    local_update,
    neighbor_distances,
    neighbor_models,
    state_records,
)
from pfedwn_jax.engine import ClientState, mix_sparse, weighted_ce


@hparams(name="fedfomo")
class FedFomoHParams:
    """FedFomo hyperparameters.

    Attributes:
      val_fraction: share of each slot's training samples held out as its validation split
        (in [0, 1)); default 0.2, PFLlib's ``val_ratio``.
    """

    val_fraction: float = checked(0.2, check_float, 0.0, 1.0, high_inclusive=False)


class FedFomoState(NamedTuple):
    """FedFomo's state: the slots' models, ``train_loss [S]`` and the last aggregation
    weights ``weights [S, K]`` (columns as ``ctx.neighbors``)."""

    clients: ClientState
    train_loss: jax.Array
    weights: jax.Array


def split_train(ctx: RoundContext, val_fraction: Any) -> tuple[Any, jax.Array]:
    """``(train ClientData without the validation samples, val weights [S, M])``: the last
    ``floor(val_fraction * count)`` samples of each slot's data client are its validation."""
    data = ctx.train
    count = jnp.asarray(data.count)
    n_val = jnp.floor(val_fraction * count).astype(count.dtype)
    keep = count - n_val
    pos = jnp.arange(data.y.shape[1])[None, :]
    train = data._replace(mask=pos < keep[:, None], count=keep)
    val = ((pos >= keep[:, None]) & (pos < count[:, None]))[jnp.asarray(ctx.data_client)]
    return train, val.astype(jnp.float32)


def val_losses(ctx: RoundContext, pool: Any, index: jax.Array, val: jax.Array) -> jax.Array:
    """``[S, K]`` mean cross-entropy of model ``pool[index[s, k]]`` on slot ``s``'s validation
    samples (weights ``val [S, M]``; 0 without any), one column of models at a time."""
    model, dc = ctx.model, jnp.asarray(ctx.data_client)
    x_all, y_all = jnp.asarray(ctx.train.x), jnp.asarray(ctx.train.y)

    def one(params, d, w):
        return weighted_ce(model.apply(params, x_all[d]), y_all[d], w)

    def column(idx: jax.Array) -> jax.Array:
        models = jax.tree.map(lambda p: p[idx], pool)
        return jax.vmap(one)(models, dc, val)

    return jax.lax.map(column, index.T).T


def fomo_weights(own_loss: jax.Array, losses: jax.Array, sq_dist: jax.Array, mask: Any) -> Any:
    """``[S, K]`` row weights: ``max(0, (own - loss) / (dist + 1e-5))`` on real entries,
    normalised; a row without a positive weight keeps its own model (1 on column 0)."""
    w = (own_loss[:, None] - losses) / (jnp.sqrt(sq_dist) + 1e-5)
    w = jnp.where(jnp.asarray(mask, bool), jnp.maximum(w, 0.0), 0.0)
    total = w.sum(axis=1, keepdims=True)
    own = (jnp.arange(w.shape[1]) == 0).astype(w.dtype)[None, :]
    return jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), own)


def _init(key: jax.Array, ctx: RoundContext, hp: FedFomoHParams) -> FedFomoState:
    clients = init_clients(key, ctx)
    zeros = jnp.zeros((ctx.num_slots,), jnp.float32)
    weights = jnp.zeros(jnp.shape(ctx.neighbors), jnp.float32).at[:, 0].set(1.0)
    return FedFomoState(clients, zeros, weights)


def _round(
    state: FedFomoState, key: jax.Array, ctx: RoundContext, hp: FedFomoHParams
) -> tuple[FedFomoState, Any]:
    sent = state.clients.params
    train, val = split_train(ctx, hp.val_fraction)
    pool, index = neighbor_models(sent, ctx)
    losses = val_losses(ctx, pool, index, val)
    dist = neighbor_distances(sent, pool, index, shards=ctx.shards)
    weights = fomo_weights(losses[:, 0], losses, dist, ctx.neighbor_mask)
    params = mix_sparse(pool, index, weights, shards=ctx.shards)
    clients, metrics = local_update(
        ctx.replace(train=train), state.clients._replace(params=params), key
    )
    return FedFomoState(clients, metrics["loss"], weights), sent


FEDFOMO = register(
    baseline_algorithm(
        name="fedfomo",
        hparams=FedFomoHParams,
        init=_init,
        round=_round,
        records=state_records(fomo_weights="weights"),
        description="neighbors weighted by their loss improvement on own validation data",
        family="personalized-aggregation",
        default=False,
    )
)
