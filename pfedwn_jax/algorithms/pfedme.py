"""pFedMe (T. Dinh, Tran and Nguyen, "Personalized Federated Learning with Moreau Envelopes",
NeurIPS 2020): personal models as the proximal points of the local loss around the group
model.

Slot ``s`` holds its group model ``w_s``; at the round start its local model ``w`` and its
personal model ``theta`` are ``w_s``. Each local step on a minibatch ``xi``:

- ``K`` steps ``theta <- theta - personal_lr (grad f_s(theta; xi) + lam (theta - w))``
  (approximately the Moreau envelope's proximal point ``theta(w)``);
- ``w <- w - eta lam (w - theta)`` (``eta`` the local learning rate: the context's
  optimizer on the gradient ``lam (w - theta)``).

After the local steps ``w_s <- (1 - beta) w_s + beta sum_j p_sj w_j`` over the neighbor list
(``p_sj`` FedAvg's sample-count weights). The slot is evaluated with its last ``theta``.

Departures: the paper (Algorithm 1) and the authors' code (``clientpFedMe.py``, also in
PFLlib) average uniformly over the sampled clients and keep ``theta`` across the round's
minibatches, starting from the received model, as here; the sample-count weights are
FedAvg's, as elsewhere in this package.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from pfedwn_jax._checks import check_float, check_int
from pfedwn_jax.algorithms.base import RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import baseline_algorithm, init_clients, local_update
from pfedwn_jax.algorithms.mixing import group_average
from pfedwn_jax.engine import ClientState, default_loss


@hparams(name="pfedme")
class PFedMeHParams:
    """pFedMe hyperparameters; defaults from the authors' code (``main.py``: ``lamda=15``,
    ``K=5``, ``personal_learning_rate=0.09``, ``beta=1``), as in the paper's MNIST runs.

    Attributes:
      lam: the Moreau envelope's regularization ``lam`` (> 0).
      personal_lr: step size of the inner steps (> 0).
      beta: the server's mixing of the new average with its old model, in (0, 2] (1: the
        average).
      inner_steps: ``K``, inner steps per local step (>= 1). Static.
    """

    lam: float = checked(15.0, check_float, 0.0, low_inclusive=False)
    personal_lr: float = checked(0.09, check_float, 0.0, low_inclusive=False)
    beta: float = checked(1.0, check_float, 0.0, 2.0, low_inclusive=False)
    inner_steps: int = checked(5, check_int, 1, static=True)


class PFedMeState(NamedTuple):
    """``clients``: params ``(w, theta)`` ``[S, ...]`` (the group model and the last personal
    model) with their optimizer state; ``train_loss [S]`` the personal models' mean loss."""

    clients: ClientState
    train_loss: jax.Array


def _tx(ctx: RoundContext) -> optax.GradientTransformation:
    """The context's optimizer on ``w``; ``theta``'s "gradient" is ``theta - theta_new``, so
    ``scale(-1)`` sets it to ``theta_new``."""
    labels = lambda p: (jax.tree.map(lambda _: "w", p[0]), jax.tree.map(lambda _: "t", p[1]))
    return optax.multi_transform({"w": ctx.tx, "t": optax.scale(-1.0)}, labels)


def _init(key: jax.Array, ctx: RoundContext, hp: PFedMeHParams) -> PFedMeState:
    w = init_clients(key, ctx).params
    params = (w, jax.tree.map(jnp.copy, w))
    clients = ClientState(params, jax.vmap(_tx(ctx).init)(params))
    return PFedMeState(clients, jnp.zeros((ctx.num_slots,), jnp.float32))


def _grad_fn(ctx: RoundContext, hp: PFedMeHParams) -> Any:
    base = default_loss(ctx.model)

    def grad_fn(params, x, y, sw, aux, key):
        w, theta = params
        objective = lambda t: base(t, x, y, sw, None)

        def inner(_, carry):
            t, _ = carry
            loss, g = jax.value_and_grad(objective)(t)
            t = jax.tree.map(lambda a, b, c: a - hp.personal_lr * (b + hp.lam * (a - c)), t, g, w)
            return t, loss

        new, loss = jax.lax.fori_loop(0, hp.inner_steps, inner, (theta, jnp.zeros(())))
        grads_w = jax.tree.map(lambda a, b: hp.lam * (a - b), w, new)
        return loss, (grads_w, jax.tree.map(jnp.subtract, theta, new))

    return grad_fn


def _round(
    state: PFedMeState, key: jax.Array, ctx: RoundContext, hp: PFedMeHParams
) -> tuple[PFedMeState, Any]:
    w0 = state.clients.params[0]
    start = state.clients._replace(params=(w0, w0))
    tx_ctx = ctx.replace(optimizer=_tx(ctx))
    trained, metrics = local_update(tx_ctx, start, key, grad_fn=_grad_fn(ctx, hp))
    w, theta = trained.params
    mean = group_average(w, ctx)
    w_new = jax.tree.map(lambda a, m: m + (hp.beta - 1.0) * (m - a), w0, mean)
    return PFedMeState(trained._replace(params=(w_new, theta)), metrics["loss"]), w


def _eval(state: PFedMeState, ctx: RoundContext, hp: PFedMeHParams) -> Any:
    return state.clients.params[1]


PFEDME = register(
    baseline_algorithm(
        name="pfedme",
        tune=("lam", (1.0, 15.0)),
        hparams=PFedMeHParams,
        init=_init,
        round=_round,
        eval_params=_eval,
        description="personal models as Moreau-envelope proximal points around the group model",
        family="regularized",
        default=False,
    )
)
