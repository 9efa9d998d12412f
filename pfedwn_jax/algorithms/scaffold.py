"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, "SCAFFOLD: Stochastic
Controlled Averaging for Federated Learning", ICML 2020), each slot the server of its group.

Slot ``s`` holds its group model ``x_s``, the group's control variate ``c_s`` and its own
control variate ``c_i`` (all zero at the start). A round:

- local training from ``x_s`` with the corrected gradient ``g_i(y) - c_i + c_s`` for the
  slot's ``K_i`` steps, giving ``y_i``;
- ``c_i <- c_i - c_s + (x_s - y_i) / (K_i lr)`` (the paper's option II; kept where the slot
  took no step);
- ``x_s <- xbar_s + (eta_g - 1)(xbar_s - x_s)`` with ``xbar_s = sum_j p_sj y_j`` over the
  slot's neighbor list, i.e. ``x_s + eta_g (xbar_s - x_s)``, and ``c_s <- sum_j p_sj c_j``
  over the neighbors whose model arrived this round.

With zero control variates and one local step a round is FedAvg's; ``eta_g = 1`` (the
paper's experiments) keeps the server step FedAvg's average.

Departures: the paper and PFLlib (``serverscaffold.py``) average uniformly over the sampled
clients and update ``c`` by ``|S|/N`` of the mean change; with every neighbor taking part and
``c`` started at the mean of the ``c_i`` that is the neighbors' mean, taken here with FedAvg's
sample-count weights ``p_sj`` (as this package's FedAvg) so that the limit above holds. Each
slot averages its neighbors' models, which started from their own group models (in the paper
every client starts from the one server model; in single-target mode they coincide). A stale
link hands over a cached model but no control variate (``mixing``). Option II needs the SGD
learning rate: the context's ``lr`` (a custom ``optimizer`` is refused); with momentum the
same formula is used, as PFLlib does.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_float
from pfedwn_jax.algorithms.base import RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import baseline_algorithm, check_sgd, init_clients, local_update
from pfedwn_jax.algorithms.mixing import fresh_average, group_average
from pfedwn_jax.algorithms.payload import params_per_slot
from pfedwn_jax.engine import ClientState, default_loss


@hparams(name="scaffold")
class ScaffoldHParams:
    """SCAFFOLD hyperparameters.

    Attributes:
      server_lr: the global step size ``eta_g`` (> 0). Default 1, the paper's experiments
        (Karimireddy et al. 2020, Sec. 7) and PFLlib's default.
    """

    server_lr: float = checked(1.0, check_float, 0.0, low_inclusive=False)


class ScaffoldState(NamedTuple):
    """SCAFFOLD's state: the group models ``clients``, the slots' own control variates
    ``c_local [S, ...]``, the groups' ``c_group [S, ...]`` and ``train_loss [S]``."""

    clients: ClientState
    c_local: Any
    c_group: Any
    train_loss: jax.Array


def _init(key: jax.Array, ctx: RoundContext, hp: ScaffoldHParams) -> ScaffoldState:
    check_sgd(ctx, "scaffold")
    clients = init_clients(key, ctx)
    zeros = jax.tree.map(jnp.zeros_like, clients.params)
    return ScaffoldState(clients, zeros, zeros, jnp.zeros((ctx.num_slots,), jnp.float32))


def corrected_grad(base_loss: Any) -> Any:
    """``grad_fn`` whose gradient is ``grad base_loss + aux_s`` (``aux_s`` a params-shaped
    correction)."""

    def grad_fn(params, x, y, w, aux_s, key):
        value, grads = jax.value_and_grad(base_loss)(params, x, y, w, None)
        return value, jax.tree.map(jnp.add, grads, aux_s)

    return grad_fn


def _round(
    state: ScaffoldState, key: jax.Array, ctx: RoundContext, hp: ScaffoldHParams
) -> tuple[ScaffoldState, Any]:
    x = state.clients.params
    correction = jax.tree.map(jnp.subtract, state.c_group, state.c_local)
    grad_fn = corrected_grad(default_loss(ctx.model))
    trained, metrics = local_update(ctx, state.clients, key, grad_fn=grad_fn, aux=correction)
    k = metrics["steps"].astype(jnp.float32)
    scale = jnp.where(k > 0, 1.0 / (jnp.maximum(k, 1.0) * ctx.lr), 0.0)

    def new_control(ci, c, xs, ys):
        s = scale.reshape((-1,) + (1,) * (ci.ndim - 1))
        return jnp.where(s > 0, ci - c + s * (xs - ys), ci)

    c_local = jax.tree.map(new_control, state.c_local, state.c_group, x, trained.params)
    mean = group_average(trained.params, ctx)
    params = jax.tree.map(lambda m, xs: m + (hp.server_lr - 1.0) * (m - xs), mean, x)
    new = ScaffoldState(
        trained._replace(params=params), c_local, fresh_average(c_local, ctx), metrics["loss"]
    )
    return new, trained.params


def payload_bits(state: ScaffoldState, ctx: RoundContext, hp: Any, value_bits: Any) -> Any:
    """A slot sends its trained model and its control variate ``c_i``: two models' worth."""
    return 2 * value_bits * params_per_slot(state.clients.params)


SCAFFOLD = register(
    baseline_algorithm(
        name="scaffold",
        hparams=ScaffoldHParams,
        init=_init,
        round=_round,
        payload_bits=payload_bits,
        description="FedAvg with control variates correcting the local gradients (option II)",
        family="traditional",
        default=False,
    )
)
