"""FedALA (Zhang et al. 2023, "FedALA: Adaptive Local Aggregation for Personalized Federated
Learning", AAAI): each slot mixes the received (group) model into its own with element-wise
weights it learns on its own data, on the higher layers only.

Round of slot ``i`` holding ``theta_i`` (trained last round): ``theta_g`` = the sample-weighted
average of its neighbor list's models (what they trained last round; the round's ``sent``).
Adaptive local aggregation (ALA):

- lower layers (the body): ``theta_i <- theta_g``;
- higher layers (the head): ``theta_i <- theta_i + (theta_g - theta_i) * W_i``, with
  ``W_i`` (one weight per parameter, starting at 1, kept across rounds) learned by
  ``W_i <- clip(W_i - eta * grad_theta L_i * (theta_g - theta_i), 0, 1)`` over minibatches
  of a random contiguous ``rand_fraction`` share of the slot's training samples (batch size
  the training's, the last partial batch dropped), one pass per round, ``start_epochs``
  passes in the first round where ``theta_g`` differs from ``theta_i``;

then local training of the result; the slot is evaluated with its trained model. This is the
paper's Algorithm 1 and PFLlib's ``utils/ALA.py``, whose defaults these are: ``eta = 1``,
``rand_fraction = 0.8`` (``rand_percent`` 80), the higher layers the head (``layer_idx`` one
layer, the paper's ``p = 1``).

Departures: the first active round trains ``W`` a fixed ``start_epochs`` passes (default 20)
where the paper trains until the standard deviation of the last 10 pass losses is below 0.1
(at least 11 passes): a static loop keeps one program for every slot and run. The higher
layers are the model's declared head (``pfedwn_jax.models.split``) rather than the last
``p`` parameter tensors. The global model is each slot's group average over its neighbor
list (D2D), not a server's.

Limit: ``eta = 0`` keeps ``W = 1``: the slot starts each round from its group average, as
FedAvg's models do (FedALA's round ``r`` is FedAvg's ``r - 1`` rounds then one local one).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_float, check_int
from pfedwn_jax.algorithms.base import RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import (
    baseline_algorithm,
    group_average_weights,
    init_clients,
    local_update,
    neighbor_models,
)
from pfedwn_jax.algorithms.split import split_keys
from pfedwn_jax.engine import ClientState, mix_sparse, weighted_ce
from pfedwn_jax.models.split import head_of, with_head


@hparams(name="fedala")
class FedALAHParams:
    """FedALA hyperparameters (defaults: Zhang et al. 2023 and PFLlib's ``ALA``).

    Attributes:
      eta: learning rate of the aggregation weights (>= 0; 0 keeps them at 1). Default 1.
      rand_fraction: share of the slot's samples the weights learn on, in (0, 1]. Default 0.8.
      start_epochs: passes of weight learning in the first active round (static). Default 20.
    """

    eta: float = checked(1.0, check_float, 0.0)
    rand_fraction: float = checked(0.8, check_float, 0.0, 1.0, low_inclusive=False)
    start_epochs: int = checked(20, check_int, 1, static=True)


class FedALAState(NamedTuple):
    """FedALA's state: the slots' models, the weights ``ala_weights`` (the head's shapes,
    ``[S, ...]``), ``started [S]`` (ALA has run once) and ``train_loss [S]``."""

    clients: ClientState
    ala_weights: Any
    started: jax.Array
    train_loss: jax.Array


def _init(key: jax.Array, ctx: RoundContext, hp: FedALAHParams) -> FedALAState:
    split_keys(ctx, "fedala")
    clients = init_clients(key, ctx)
    ones = jax.tree.map(jnp.ones_like, head_of(ctx.model, clients.params))
    zeros = jnp.zeros((ctx.num_slots,), jnp.float32)
    return FedALAState(clients, ones, jnp.zeros((ctx.num_slots,), bool), zeros)


def learn_weights(
    ctx: RoundContext, params: Any, glob: Any, weights: Any, started: jax.Array, key: Any, hp: Any
) -> tuple[Any, Any, jax.Array]:
    """ALA of every slot: ``(its new model, the learned weights, started)`` from its own
    model ``params [S, ...]``, the group model ``glob [S, ...]`` and the weights (see the
    module docstring)."""
    model, b = ctx.model, ctx.batch_size
    x_all, y_all = jnp.asarray(ctx.train.x), jnp.asarray(ctx.train.y)
    count = jnp.asarray(ctx.train.count)[jnp.asarray(ctx.data_client)]
    max_batches = y_all.shape[1] // b

    def slot(own, g, w, started, d, n, k):
        h, hg = head_of(model, own), head_of(model, g)
        diff = jax.tree.map(jnp.subtract, hg, h)
        mix = lambda w: jax.tree.map(lambda p, dp, wt: p + dp * wt, h, diff, w)
        rand_num = jnp.floor(hp.rand_fraction * n).astype(jnp.int32)
        start = jax.random.randint(k, (), 0, n - rand_num + 1)
        batches = rand_num // b
        active = sum(jnp.sum(jnp.abs(v)) for v in jax.tree.leaves(diff)) > 0

        def step(i, w):
            idx = start + i * b + jnp.arange(b)
            x, y = x_all[d, idx], y_all[d, idx]
            loss = lambda hh: weighted_ce(model.apply(with_head(model, g, hh), x), y, jnp.ones(b))
            grad = jax.grad(loss)(mix(w))
            new = jax.tree.map(
                lambda wt, gr, dp: jnp.clip(wt - hp.eta * gr * dp, 0, 1), w, grad, diff
            )
            return jax.tree.map(lambda a, o: jnp.where(i < batches, a, o), new, w)

        epochs = jnp.where(active, jnp.where(started, 1, hp.start_epochs), 0)
        pass_ = lambda e, w: jax.lax.fori_loop(0, max_batches, step, w)
        w = jax.lax.fori_loop(0, epochs, pass_, w)
        return with_head(model, g, mix(w)), w, started | active

    keys = jax.random.split(key, ctx.num_slots)
    dc = jnp.asarray(ctx.data_client)
    return jax.vmap(slot)(params, glob, weights, started, dc, count, keys)


def _round(
    state: FedALAState, key: jax.Array, ctx: RoundContext, hp: FedALAHParams
) -> tuple[FedALAState, Any]:
    split_keys(ctx, "fedala")
    sent = state.clients.params
    pool, index = neighbor_models(sent, ctx)
    avg = group_average_weights(ctx.neighbors, ctx.neighbor_mask, ctx.num_samples)
    glob = mix_sparse(pool, index, avg, shards=ctx.shards)
    ala_key = jax.random.fold_in(key, 1)
    params, weights, started = learn_weights(
        ctx, sent, glob, state.ala_weights, state.started, ala_key, hp
    )
    clients, metrics = local_update(ctx, state.clients._replace(params=params), key)
    return FedALAState(clients, weights, started, metrics["loss"]), sent


FEDALA = register(
    baseline_algorithm(
        name="fedala",
        tune=("eta", (0.1, 1.0)),
        hparams=FedALAHParams,
        init=_init,
        round=_round,
        description="group model mixed into the own head with learned element-wise weights",
        family="personalized-aggregation",
        default=False,
    )
)
