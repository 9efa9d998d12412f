"""FedDyn (Acar, Zhao, Matas, Mattina, Whatmough and Saligrama, "Federated Learning Based on
Dynamic Regularization", ICLR 2021), each slot the server of its group.

Slot ``s`` holds its server model ``theta_s``, its state ``g_s`` (the gradient of its
dynamic regularizer, zero at the start) and the server state ``h_s`` (zero). A round:

- local training from ``theta_s`` on
  ``f_s(theta) - <g_s, theta> + alpha/2 ||theta - theta_s||^2``, giving ``theta_s^+``;
- ``g_s <- g_s - alpha (theta_s^+ - theta_s)``;
- ``m_s = sum_j p_sj theta_j^+`` over the neighbor list; ``h_s <- h_s - alpha (m_s - theta_s)``;
  ``theta_s <- m_s - h_s / alpha``.

The state keeps ``h_s / alpha`` (it updates by ``-(m_s - theta_s)``), so no division by
``alpha`` happens and the server step does not depend on it.

Departures: the paper (Algorithm 1) and PFLlib (``serverdyn.py``) average uniformly and
update ``h`` by the mean change over all clients; here the group of each slot is its
neighbor list, with FedAvg's sample-count weights ``p_sj``, every neighbor taking part, so
the mean change is ``m_s - theta_s`` (the neighbors started from their own server models,
in single-target mode the same one).
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
    sq_norm_diff,
)
from pfedwn_jax.algorithms.mixing import group_average
from pfedwn_jax.engine import ClientState, default_loss


@hparams(name="feddyn")
class FedDynHParams:
    """FedDyn hyperparameters.

    Attributes:
      alpha: weight of the dynamic regularizer (> 0). Default 0.01, from the paper's grid
        {0.1, 0.01, 0.001} (Acar et al. 2021, Appendix) and PFLlib's default.
    """

    alpha: float = checked(0.01, check_float, 0.0, low_inclusive=False)


class FedDynState(NamedTuple):
    """``clients``: the server models ``theta [S, ...]``; ``grad``: each slot's ``g_s``;
    ``h``: each slot's server state over ``alpha``; ``train_loss [S]``."""

    clients: ClientState
    grad: Any
    h: Any
    train_loss: jax.Array


def _init(key: jax.Array, ctx: RoundContext, hp: FedDynHParams) -> FedDynState:
    clients = init_clients(key, ctx)
    zeros = jax.tree.map(jnp.zeros_like, clients.params)
    return FedDynState(clients, zeros, zeros, jnp.zeros((ctx.num_slots,), jnp.float32))


def _inner(a: Any, b: Any) -> jax.Array:
    leaves = jax.tree.leaves(jax.tree.map(lambda x, y: jnp.sum(x * y), a, b))
    return sum(leaves, jnp.zeros((), jnp.float32))


def _loss(base: Any, alpha: Any) -> Any:
    def loss_fn(params, x, y, w, aux):
        grad, anchor = aux
        dyn = 0.5 * alpha * sq_norm_diff(params, anchor) - _inner(grad, params)
        return base(params, x, y, w, None) + dyn

    return loss_fn


def _round(
    state: FedDynState, key: jax.Array, ctx: RoundContext, hp: FedDynHParams
) -> tuple[FedDynState, Any]:
    theta = state.clients.params
    loss_fn = _loss(default_loss(ctx.model), hp.alpha)
    trained, metrics = local_update(
        ctx, state.clients, key, loss_fn=loss_fn, aux=(state.grad, theta)
    )
    grad = jax.tree.map(lambda g, a, b: g - hp.alpha * (a - b), state.grad, trained.params, theta)
    mean = group_average(trained.params, ctx)
    h = jax.tree.map(lambda h, m, t: h - (m - t), state.h, mean, theta)
    clients = trained._replace(params=jax.tree.map(jnp.subtract, mean, h))
    return FedDynState(clients, grad, h, metrics["loss"]), trained.params


FEDDYN = register(
    baseline_algorithm(
        name="feddyn",
        tune=("alpha", (0.01, 0.1)),
        hparams=FedDynHParams,
        init=_init,
        round=_round,
        description="dynamic regularization aligning local and global stationary points",
        family="traditional",
        default=False,
    )
)
