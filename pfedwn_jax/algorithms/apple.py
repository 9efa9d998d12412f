"""APPLE (Luo and Wu, "Adapt to Adaptation: Learning Personalization for Cross-Silo Federated
Learning", IJCAI 2022): each slot learns how much of each neighbor's core model goes into its
personalized model.

Slot ``s`` holds its core model ``theta_s`` (what it sends) and its directed relationship
(DR) vector ``p_s [K]`` over its neighbor list (column 0 itself). Each round it receives its
neighbors' cores ``theta_k`` (what they trained last round: the round's ``sent``) and trains,
on its own minibatches, its personalized model

    theta_hat_s = p_s0 theta_s + sum_{k >= 1} p_sk theta_k

against ``L_s(theta_hat_s) + lambda(r) ||p_s - p0_s||^2``: SGD on ``theta_s`` (gradient
``p_s0 grad L``: only the own core is trained) and on ``p_s`` (gradient
``<grad L, theta_k> + 2 lambda(r) (p_sk - p0_sk)``, with its own learning rate ``lr_dr``).
``p0_s`` is the sample shares of the slot's list (``n_k / sum n``), ``p_s``'s start. The
regularizer fades out over the first ``reg_rounds`` rounds, ``lambda(r) = mu 0.001^(r /
reg_rounds)`` and 0 from round ``reg_rounds`` on (the authors' default "exponential"
schedule). The slot is evaluated with ``theta_hat_s`` as it stands after training; record
``dr_weights [S, K]`` is ``p``.

A list entry that did not arrive this round (a lost packet, no stale copy) takes no part:
its term is left out of ``theta_hat_s`` and its ``p_sk`` is kept as it was.

Limits: with ``lr_dr = 0``, ``p`` stays at the sample shares ``p0``; a slot
whose list is itself then trains ``1 * theta_s``: Local.

Departures, and which source is followed:
- The authors' code (``pFL-APPLE/train_APPLE.py``) trains with momentum 0.9 and each
  client's core from its own random initial model; here the context's SGD (momentum as
  configured, also on ``p``) and the shared initial model of every method here.
- PFLlib (``clientapple.py``) multiplies the core's learning rate by the number of clients
  and replaces ``<grad L, theta_k>`` by a mean over parameter tensors of ``grad * theta_k``;
  the gradient of the paper's objective (the authors' autograd) is followed here.
- The paper downloads every client's core (or ``M`` of them under limited bandwidth, by
  ``p``); here the links decide which neighbors' cores are received.
- ``lr_dr`` is applied by scaling ``p``'s gradient by ``lr_dr / lr`` (so it needs the
  context's SGD learning rate, as APFL does).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_float, check_int
from pfedwn_jax.algorithms.base import Algorithm, RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import (
    check_sgd,
    init_clients,
    local_update,
    neighbor_models,
    train_loss_record,
)
from pfedwn_jax.algorithms.phases import Phase, Sizes, baseline, plus
from pfedwn_jax.engine import ClientState, default_loss


@hparams(name="apple")
class APPLEHParams:
    """APPLE hyperparameters (defaults: the authors' code, ``pFL-APPLE/utils/utils.py``).

    Attributes:
      lr_dr: learning rate of the DR vector ``p`` (``lr_coef``, 0.001).
      mu: weight of the pull of ``p`` towards the sample shares ``p0`` (0.1).
      reg_rounds: rounds over which that pull fades to 0 (``reg_last_round_over_total_round``
        0.1 of the paper's 160 rounds: 16); 0: no pull.
    """

    lr_dr: float = checked(1e-3, check_float, 0.0)
    mu: float = checked(0.1, check_float, 0.0)
    reg_rounds: int = checked(16, check_int, 0)


class APPLEState(NamedTuple):
    """``clients``: params ``(theta [S, ...], p [S, K])`` with their optimizer state;
    ``p0 [S, K]`` the sample shares of each list; ``personal [S, ...]`` the personalized
    models after the last round; ``round [S]`` rounds done; ``train_loss [S]``."""

    clients: ClientState
    p0: jax.Array
    personal: Any
    round: jax.Array
    train_loss: jax.Array


def sample_shares(ctx: RoundContext) -> jax.Array:
    """``[S, K]`` each list entry's share of its list's training samples (0 off the list)."""
    n = jnp.asarray(ctx.num_samples, jnp.float32)[jnp.asarray(ctx.neighbors)]
    n = jnp.where(jnp.asarray(ctx.neighbor_mask, bool), n, 0.0)
    return n / jnp.maximum(n.sum(axis=1, keepdims=True), 1e-12)


def _init(key: jax.Array, ctx: RoundContext, hp: APPLEHParams) -> APPLEState:
    check_sgd(ctx, "apple")
    theta = init_clients(key, ctx).params
    p0 = sample_shares(ctx)
    params = (theta, p0)
    clients = ClientState(params, jax.vmap(ctx.tx.init)(params))
    zeros = jnp.zeros((ctx.num_slots,), jnp.float32)
    return APPLEState(clients, p0, theta, jnp.zeros((ctx.num_slots,), jnp.int32), zeros)


def personalized(theta: Any, p: jax.Array, received: Any, live: jax.Array) -> Any:
    """One slot's ``p_0 theta + sum_{k >= 1} live_k p_k received_k`` (``received [K, ...]``,
    its column 0 replaced by the slot's own ``theta``)."""
    w = jnp.where(live, p, 0.0)
    return jax.tree.map(lambda t, r: jnp.tensordot(w, r.at[0].set(t), axes=1), theta, received)


def pull(hp: APPLEHParams, rounds: jax.Array) -> jax.Array:
    """``lambda(r) = mu 0.001^(r / reg_rounds)`` for ``r < reg_rounds``, else 0."""
    span = jnp.maximum(hp.reg_rounds, 1)
    return jnp.where(rounds < hp.reg_rounds, hp.mu * 0.001 ** (rounds / span), 0.0)


def _grad_fn(ctx: RoundContext, hp: APPLEHParams) -> Any:
    base, scale = default_loss(ctx.model), hp.lr_dr / ctx.lr

    def grad_fn(params, x, y, sw, aux, key):
        received, live, p0, coef = aux

        def objective(theta, p):
            model = personalized(theta, p, received, live)
            reg = jnp.sum(jnp.where(live, (p - p0) ** 2, 0.0))
            return base(model, x, y, sw, None) + coef * reg

        loss, (g_theta, g_p) = jax.value_and_grad(objective, argnums=(0, 1))(*params)
        return loss, (g_theta, jnp.where(live, g_p * scale, 0.0))

    return grad_fn


def _round(
    state: APPLEState, key: jax.Array, ctx: RoundContext, hp: APPLEHParams
) -> tuple[APPLEState, Any]:
    sent = state.clients.params[0]
    pool, index = neighbor_models(sent, ctx)
    received = jax.tree.map(lambda a: a[index], pool)  # [S, K, ...]
    live = jnp.asarray(ctx.neighbor_mask, bool)
    aux = (received, live, state.p0, pull(hp, state.round))
    trained, metrics = local_update(ctx, state.clients, key, grad_fn=_grad_fn(ctx, hp), aux=aux)
    theta, p = trained.params
    personal = jax.vmap(personalized)(theta, p, received, live)
    new = APPLEState(trained, state.p0, personal, state.round + 1, metrics["loss"])
    return new, sent


def _eval(state: APPLEState, ctx: RoundContext, hp: APPLEHParams) -> Any:
    return state.personal


def _records(state: APPLEState, ctx: RoundContext, hp: APPLEHParams) -> dict[str, jax.Array]:
    return {**train_loss_record(state, ctx, hp), "dr_weights": state.clients.params[1]}


def _sent(state: APPLEState, ctx: RoundContext, hp: APPLEHParams) -> Any:
    return state.clients.params[0]


def memory_phases(sz: Sizes, hp: Any) -> list[Phase]:
    """The baseline's phases, training holding every slot's received cores ``[S, K, ...]``."""
    train, mixing, evaluation = baseline(sz, hp)
    width = sz.pairs // sz.slots + 1
    return [plus(train, sz.slots * width * sz.param), mixing, evaluation]


APPLE = register(
    Algorithm(
        name="apple",
        tune=("mu", (0.01, 0.1)),
        hparams=APPLEHParams,
        init=_init,
        round=_round,
        eval_params=_eval,
        records=_records,
        sent_params=_sent,
        memory_phases=memory_phases,
        description="personalized models as learned combinations of the neighbors' cores",
        family="personalized-aggregation",
        default=False,
    )
)
