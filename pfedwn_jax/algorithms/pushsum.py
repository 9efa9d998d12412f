"""Push-sum / stochastic gradient push (Nedic and Olshevsky 2015, IEEE TAC; Assran et al. 2019,
ICML): gossip on directed graphs with a push-sum weight per node.

Node ``j`` holds a numerator ``x_j`` and a weight ``w_j``; its model is ``z_j = x_j / w_j``.
Round ``t``::

    x_j^{t+1/2} = w_j z'_j,  z'_j = local training of z_j      (gradient at the de-biased z)
    x_i^{t+1}   = sum_{j in N_i} p_j x_j^{t+1/2},   w_i^{t+1} = sum_{j in N_i} p_j w_j
    z_i^{t+1}   = x_i^{t+1} / w_i^{t+1}

``p_j = 1 / (1 + out_j)``: node ``j`` splits its mass equally between itself and the ``out_j``
nodes that list it (the listed graph, directed as selection makes it: column-stochastic,
no symmetric links needed). The state keeps ``z`` (the models) and ``w``; after each round
every ``w`` is divided by their mean, one common factor (the iteration is linear, so a
common rescaling of every ``x`` and ``w`` leaves every ``z`` unchanged) that keeps ``w`` away
from float32 underflow when links fail.

**Lost packets.** A packet carries ``p_j x_j`` and ``p_j w_j`` together: what is lost, is lost
from both, so every ``z_i`` stays a convex combination of what was delivered and the weights
stay consistent with it (the total mass shrinks; the sender does not learn of the loss). A
stale copy of a failed link is *not* used: its mass was delivered before and counting it
again would break the weights (``fresh_mask``). A node with nothing delivered keeps ``z``.

**Departures.** Several local steps per round (the context's schedule) instead of Assran et
al.'s one; no overlap (tau-delayed messages) and a fixed listed graph instead of their
time-varying exponential graph. On a regular symmetric graph ``p_j = 1 / (1 + d)`` equals
the Metropolis-Hastings weights, so push-sum then matches D-PSGD exactly.

Records: ``train_loss [S]``, ``push_weight [S]`` (after the rescaling). Its
``mixing_weights`` are the round's column-stochastic shares over the delivered links (the
engine's ``spectral_gap`` metric: the same norm as for the transpose).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pfedwn_jax.algorithms.base import NoHParams, RoundContext, register
from pfedwn_jax.algorithms.common import (
    baseline_algorithm,
    init_clients,
    local_update,
    state_records,
)
from pfedwn_jax.algorithms.mixing import fresh_mask, gossip, listed_mask
from pfedwn_jax.algorithms.payload import params_per_slot
from pfedwn_jax.engine import ClientState


class PushSumState(NamedTuple):
    """Attributes: ``clients`` (models ``z [S, ...]``, optimizer state), ``weight [S]`` the
    push-sum weights (mean 1), ``train_loss [S]``."""

    clients: ClientState
    weight: jax.Array
    train_loss: jax.Array


def _init(key: jax.Array, ctx: RoundContext, hp: Any) -> PushSumState:
    s = ctx.num_slots
    return PushSumState(init_clients(key, ctx), jnp.ones((s,), jnp.float32), jnp.zeros((s,)))


def push_shares(ctx: RoundContext) -> jax.Array:
    """``[S, K]`` float32 ``p_{neighbors[i, k]}`` on the links delivered this round (0 else):
    the round's column-stochastic matrix in list form (``P[i, j] = p_j``)."""
    nbr, listed = jnp.asarray(ctx.neighbors), listed_mask(ctx).at[:, 0].set(False)
    out = jnp.zeros((nbr.shape[0],), jnp.float32).at[nbr].add(listed.astype(jnp.float32))
    share = 1.0 / (1.0 + out)
    return jnp.where(fresh_mask(ctx).at[:, 0].set(True), share[nbr], 0.0)


def _round(
    state: PushSumState, key: jax.Array, ctx: RoundContext, hp: Any
) -> tuple[PushSumState, Any]:
    clients, metrics = local_update(ctx, state.clients, key)
    mass = push_shares(ctx) * state.weight[jnp.asarray(ctx.neighbors)]  # [S, K] p_j w_j
    weight = mass.sum(axis=1)
    z = gossip(clients.params, ctx, mass / weight[:, None])  # x_i / w_i
    new = PushSumState(clients._replace(params=z), weight / weight.mean(), metrics["loss"])
    return new, clients.params


def _mixing(state: PushSumState, ctx: RoundContext, hp: Any) -> jax.Array:
    return push_shares(ctx)


def payload_bits(state: PushSumState, ctx: RoundContext, hp: Any, value_bits: Any) -> Any:
    """A slot pushes its model share and its weight share: one model and one value."""
    return value_bits * (params_per_slot(state.clients.params) + 1)


PUSHSUM = register(
    baseline_algorithm(
        name="pushsum",
        hparams=NoHParams,
        init=_init,
        round=_round,
        records=state_records(push_weight="weight"),
        mixing_weights=_mixing,
        payload_bits=payload_bits,
        description="stochastic gradient push: push-sum gossip on the directed selected graph",
        family="decentralized",
        default=False,
    )
)
