"""APFL (Deng, Kamani and Mahdavi, "Adaptive Personalized Federated Learning", 2020): each slot
interpolates between the group model and a local one with a learned mixing weight.

Slot ``s`` holds the group model ``w_s``, its local model ``v_s`` and its weight
``alpha_s in [0, 1]``; its personalized model is ``vbar_s = alpha_s v_s + (1 - alpha_s) w_s``.
Each local step on a minibatch ``xi`` (the paper's Algorithm 1):

- ``w <- w - eta grad f_s(w; xi)``;
- ``v <- v - eta grad_v f_s(vbar; xi)`` (``= alpha grad f_s(vbar)``);
- ``alpha <- clip(alpha - eta <v - w, grad f_s(vbar; xi)>, 0, 1)`` (adaptive ``alpha``;
  fixed with ``adaptive = false``), all from the values before the step.

After the local steps ``w_s`` is averaged over the neighbor list (FedAvg); ``v_s`` and
``alpha_s`` stay. The slot is evaluated with ``vbar_s``. ``alpha`` fixed at 0 is FedAvg;
fixed at 1 it is Local.

Departures: the authors' code (FedTorch, copied by PFLlib ``clientapfl.py``) adds
``0.02 alpha`` to ``alpha``'s gradient, and PFLlib trains ``v`` on its own loss rather than
the mixture's; the paper's rule is followed here. ``alpha``'s step uses the local learning
rate (as the authors' code) and is clipped after every step; it needs the context's SGD
``lr`` (with momentum, the momentum applies to the three parts alike). Once ``alpha``
reaches 0, ``v`` gets no gradient and the slot is FedAvg's (seen on small MNIST runs within
the first round; ``docs/algorithms.md``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_bool, check_float
from pfedwn_jax.algorithms.base import Algorithm, RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import check_sgd, init_clients, local_update, train_loss_record
from pfedwn_jax.algorithms.mixing import group_average
from pfedwn_jax.engine import ClientState, default_loss


@hparams(name="apfl")
class APFLHParams:
    """APFL hyperparameters.

    Attributes:
      alpha: the initial mixing weight in [0, 1]. Default 0.5 (our pick; the paper studies
        0.25, 0.5 and 0.75 fixed, and the adaptive one).
      adaptive: learn ``alpha`` by gradient steps (the paper's Algorithm 1; default true),
        or keep it fixed. Static.
    """

    alpha: float = checked(0.5, check_float, 0.0, 1.0)
    adaptive: bool = checked(True, check_bool, static=True)


class APFLState(NamedTuple):
    """``clients``: params ``(w, v, alpha)`` ``[S, ...]`` with their optimizer state;
    ``train_loss [S]`` the personalized model's mean loss over the last round's steps."""

    clients: ClientState
    train_loss: jax.Array


def _init(key: jax.Array, ctx: RoundContext, hp: APFLHParams) -> APFLState:
    check_sgd(ctx, "apfl")
    w = init_clients(key, ctx).params
    alpha = jnp.full((ctx.num_slots,), hp.alpha, jnp.float32)
    params = (w, jax.tree.map(jnp.copy, w), alpha)
    clients = ClientState(params, jax.vmap(ctx.tx.init)(params))
    return APFLState(clients, jnp.zeros((ctx.num_slots,), jnp.float32))


def mixed(alpha: jax.Array, v: Any, w: Any) -> Any:
    """``alpha v + (1 - alpha) w`` of one slot's models."""
    return jax.tree.map(lambda a, b: alpha * a + (1.0 - alpha) * b, v, w)


def _grad_fn(ctx: RoundContext, hp: APFLHParams) -> Any:
    base, lr = default_loss(ctx.model), ctx.lr

    def grad_fn(params, x, y, sw, aux, key):
        w, v, alpha = params
        gw = jax.grad(lambda p: base(p, x, y, sw, None))(w)
        personal = lambda v_, a_: base(mixed(a_, v_, w), x, y, sw, None)
        loss, (gv, ga) = jax.value_and_grad(personal, argnums=(0, 1))(v, alpha)
        if hp.adaptive:  # the clipped SGD step, as a gradient the SGD step reproduces
            ga = (alpha - jnp.clip(alpha - lr * ga, 0.0, 1.0)) / lr
        else:
            ga = jnp.zeros_like(alpha)
        return loss, (gw, gv, ga)

    return grad_fn


def _round(
    state: APFLState, key: jax.Array, ctx: RoundContext, hp: APFLHParams
) -> tuple[APFLState, Any]:
    trained, metrics = local_update(ctx, state.clients, key, grad_fn=_grad_fn(ctx, hp))
    w, v, alpha = trained.params
    params = (group_average(w, ctx), v, alpha)
    return APFLState(trained._replace(params=params), metrics["loss"]), w


def _eval(state: APFLState, ctx: RoundContext, hp: APFLHParams) -> Any:
    w, v, alpha = state.clients.params
    return jax.vmap(mixed)(alpha, v, w)


def _records(state: APFLState, ctx: RoundContext, hp: APFLHParams) -> dict[str, jax.Array]:
    return {**train_loss_record(state, ctx, hp), "alpha": state.clients.params[2]}


APFL = register(
    Algorithm(
        name="apfl",
        tune=("alpha", (0.25, 0.75)),
        hparams=APFLHParams,
        init=_init,
        round=_round,
        eval_params=_eval,
        records=_records,
        description="a learned interpolation of the group model and a local one",
        family="regularized",
        default=False,
    )
)
