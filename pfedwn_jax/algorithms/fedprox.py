"""FedProx (Li et al. 2020): FedAvg with a proximal term in the local objective.

Local objective of slot ``s`` in a round: ``f_s(w) + mu/2 * ||w - w_s^start||^2`` where
``w_s^start`` is the (group) model the slot holds when the round starts; its gradient
``mu (w - w_start)`` is part of every local step. Aggregation is FedAvg's.
"""

from __future__ import annotations

from typing import Any

import jax

from pfedwn_jax._checks import check_float
from pfedwn_jax.algorithms.base import RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import (
    BaselineState,
    baseline_algorithm,
    proximal_loss,
    train_then_average,
)
from pfedwn_jax.algorithms.phases import Phase, Sizes, baseline, plus
from pfedwn_jax.engine import default_loss


@hparams(name="fedprox")
class FedProxHParams:
    """FedProx hyperparameters.

    Attributes:
      mu: proximal coefficient (>= 0; 0 gives FedAvg). Default 0.01, from the grid
        {0.001, 0.01, 0.1, 1} of Li et al. 2020 (our pick for the small MNIST models).
    """

    mu: float = checked(0.01, check_float, 0.0)


def _round(
    state: BaselineState, key: jax.Array, ctx: RoundContext, hp: FedProxHParams
) -> tuple[BaselineState, Any]:
    anchor = state.clients.params
    loss_fn = proximal_loss(default_loss(ctx.model), hp.mu)
    return train_then_average(state, key, ctx, loss_fn=loss_fn, aux=anchor)


def memory_phases(sz: Sizes, hp: Any) -> list[Phase]:
    """FedProx: the anchor (round-start models) stays live through training."""
    train, *rest = baseline(sz, hp)
    return [plus(train, sz.slots * sz.param), *rest]


FEDPROX = register(
    baseline_algorithm(
        name="fedprox",
        tune=("mu", (0.01, 0.1)),
        hparams=FedProxHParams,
        round=_round,
        description="FedAvg with a proximal term mu/2 ||w - w_round_start||^2",
        memory_phases=memory_phases,
        family="traditional",
    )
)
