"""A server optimizer at each target over its neighbors' average: FedAvgM (Hsu, Qi and Brown,
"Measuring the Effects of Non-Identical Data Distribution for Federated Visual
Classification", 2019) and FedAdam (Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar
and McMahan, "Adaptive Federated Optimization", ICLR 2021).

Slot ``s`` holds its server model ``x_s`` and a server optimizer state. A round: every slot
trains locally from its ``x_s`` (FedAvg's local training, giving ``y_s``, which it sends);
slot ``s`` forms the pseudo-gradient ``Delta_s = x_s - sum_j p_sj y_j`` over its neighbor list
(``p_sj`` FedAvg's sample-count weights) and steps ``x_s`` with an optax optimizer on it:

- FedAvgM: ``v_s <- beta v_s + Delta_s``, ``x_s <- x_s - eta v_s`` (``optax.sgd``);
- FedAdam: ``m <- b1 m + (1 - b1) Delta``, ``v <- b2 v + (1 - b2) Delta^2``,
  ``x_s <- x_s - eta mhat / (sqrt(vhat) + tau)`` (``optax.adam``).

FedAvgM with ``beta = 0`` and ``eta = 1`` is FedAvg.

Departures: each slot is a server over its own neighbor list (the papers have one server);
FedAdam uses optax's bias-corrected Adam (``mhat``, ``vhat``; as FL-bench's FedOpt with
torch's Adam) where the paper's Algorithm 2 has no bias correction; after the first rounds
the two agree. The local optimizer state stays local, as FedAvg's here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax

from pfedwn_jax._checks import check_float
from pfedwn_jax.algorithms.base import Algorithm, RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import baseline_algorithm, init_clients, local_update
from pfedwn_jax.algorithms.mixing import group_average
from pfedwn_jax.engine import ClientState


@hparams(name="fedavgm")
class FedAvgMHParams:
    """FedAvgM hyperparameters (Hsu et al. 2019).

    Attributes:
      server_lr: server step size ``eta`` (> 0). Default 1.0, the paper's server learning
        rate with the effective rate ``eta / (1 - beta)`` they study.
      momentum: server momentum ``beta`` in [0, 1). Default 0.9 (the paper's common value).
    """

    server_lr: float = checked(1.0, check_float, 0.0, low_inclusive=False)
    momentum: float = checked(0.9, check_float, 0.0, 1.0, high_inclusive=False)


@hparams(name="fedadam")
class FedAdamHParams:
    """FedAdam hyperparameters (Reddi et al. 2021).

    Attributes:
      server_lr: server step size ``eta`` (> 0). Default 0.01, from the paper's grid
        (Appendix D; their best values lie between 10^-2.5 and 10^-1 by task).
      b1, b2: moment decays in [0, 1). Defaults 0.9 and 0.99, the paper's (Sec. 5).
      tau: adaptivity ``tau`` (> 0). Default 1e-3, from the paper's grid.
    """

    server_lr: float = checked(0.01, check_float, 0.0, low_inclusive=False)
    b1: float = checked(0.9, check_float, 0.0, 1.0, high_inclusive=False)
    b2: float = checked(0.99, check_float, 0.0, 1.0, high_inclusive=False)
    tau: float = checked(1e-3, check_float, 0.0, low_inclusive=False)


class ServerOptState(NamedTuple):
    """``clients``: the server models ``x [S, ...]`` (with local optimizer state);
    ``server``: each slot's server optimizer state ``[S, ...]``; ``train_loss [S]``."""

    clients: ClientState
    server: Any
    train_loss: jax.Array


def _fedavgm_tx(hp: FedAvgMHParams) -> optax.GradientTransformation:
    return optax.sgd(hp.server_lr, momentum=hp.momentum)


def _fedadam_tx(hp: FedAdamHParams) -> optax.GradientTransformation:
    return optax.adam(hp.server_lr, b1=hp.b1, b2=hp.b2, eps=hp.tau)


def _algorithm(
    name: str, hp_type: type, make_tx: Any, description: str, tune: tuple[str, tuple]
) -> Algorithm:
    def init(key: jax.Array, ctx: RoundContext, hp: Any) -> ServerOptState:
        clients = init_clients(key, ctx)
        server = jax.vmap(make_tx(hp).init)(clients.params)
        return ServerOptState(clients, server, jax.numpy.zeros((ctx.num_slots,), "float32"))

    def round_(state: ServerOptState, key: jax.Array, ctx: RoundContext, hp: Any):
        x = state.clients.params
        trained, metrics = local_update(ctx, state.clients, key)
        delta = jax.tree.map(lambda a, b: a - b, x, group_average(trained.params, ctx))
        updates, server = jax.vmap(make_tx(hp).update)(delta, state.server, x)
        clients = trained._replace(params=optax.apply_updates(x, updates))
        return ServerOptState(clients, server, metrics["loss"]), trained.params

    return baseline_algorithm(
        name=name,
        hparams=hp_type,
        init=init,
        round=round_,
        description=description,
        family="traditional",
        default=False,
        tune=tune,
    )


FEDAVGM = register(
    _algorithm(
        "fedavgm",
        FedAvgMHParams,
        _fedavgm_tx,
        "server momentum on the group average",
        ("momentum", (0.5, 0.9)),
    )
)
FEDADAM = register(
    _algorithm(
        "fedadam",
        FedAdamHParams,
        _fedadam_tx,
        "server Adam on the group average",
        ("server_lr", (0.01, 0.1)),
    )
)
