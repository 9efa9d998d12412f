"""Ditto (Li, Hu, Beirami and Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021): a global model trained by FedAvg, and beside it a personal
model pulled towards the global one.

Each round slot ``s`` holds the group model ``w_s`` (what FedAvg holds) and its personal
model ``v_s``. From the same round start, with the schedule of the context:

- ``v_s`` trains on ``F_s(v) + lam/2 ||v - w_s||^2`` (``w_s`` the round-start group model);
- ``w_s`` trains on ``F_s(w)``, then ``w_s <- sum_j p_sj w_j`` over the slot's neighbor list
  (``p_sj`` the group's sample-count weights, FedAvg's aggregation).

The slot is evaluated with ``v_s``. ``lam = 0`` makes ``v_s`` Local's model; a large ``lam``
holds it at the global model. The personal training uses the round's key as Local does
(the same minibatches), the global training a key folded from it.

Departures: the paper (Algorithm 1) and PFLlib (``clientditto.py``: ``ptrain`` then
``train``, both from the received model) take the same steps; PFLlib's personal optimizer is
SGD with the proximal gradient added, which is ``ctx.tx`` on the proximal objective here, with
its own optimizer state. The personal schedule is the context's local schedule (the paper's
``s`` local steps; PFLlib's ``plocal_epochs``, default 1).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_float
from pfedwn_jax.algorithms.base import RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import (
    average_in_groups,
    baseline_algorithm,
    init_clients,
    local_update,
    proximal_loss,
)
from pfedwn_jax.engine import ClientState, default_loss


@hparams(name="ditto")
class DittoHParams:
    """Ditto hyperparameters.

    Attributes:
      lam: weight of the pull ``lam/2 ||v - w||^2`` of the personal model towards the global
        one (>= 0; 0 gives Local's personal models). Default 0.1, from the grid {0.05, 0.1,
        0.2, 0.5, 1, 2} of Li et al. 2021 (their appendix; our pick for the small models).
    """

    lam: float = checked(0.1, check_float, 0.0)


class DittoState(NamedTuple):
    """Ditto's state.

    Attributes:
      clients: the global (group) models ``w [S, ...]`` with their optimizer state.
      personal: the personal models ``v [S, ...]`` with their own optimizer state.
      train_loss: ``[S]`` the personal objective's mean over the last round's steps.
    """

    clients: ClientState
    personal: ClientState
    train_loss: jax.Array


def _init(key: jax.Array, ctx: RoundContext, hp: DittoHParams) -> DittoState:
    clients = init_clients(key, ctx)
    copy = jax.tree.map(jnp.copy, clients)
    return DittoState(clients, copy, jnp.zeros((ctx.num_slots,), jnp.float32))


def _round(
    state: DittoState, key: jax.Array, ctx: RoundContext, hp: DittoHParams
) -> tuple[DittoState, Any]:
    anchor = state.clients.params
    loss_fn = proximal_loss(default_loss(ctx.model), hp.lam)
    personal, metrics = local_update(ctx, state.personal, key, loss_fn=loss_fn, aux=anchor)
    clients, _ = local_update(ctx, state.clients, jax.random.fold_in(key, 1))
    return DittoState(average_in_groups(clients, ctx), personal, metrics["loss"]), clients.params


def _eval(state: DittoState, ctx: RoundContext, hp: DittoHParams) -> Any:
    return state.personal.params


DITTO = register(
    baseline_algorithm(
        name="ditto",
        tune=("lam", (0.1, 1.0)),
        hparams=DittoHParams,
        init=_init,
        round=_round,
        eval_params=_eval,
        description="FedAvg's global model plus a personal model pulled towards it",
        family="regularized",
        default=False,
    )
)
