"""FedAvg (McMahan et al. 2017) inside each slot's group.

Each round every slot trains locally from the model it holds, then slot ``i`` takes the
sample-count weighted average of the models along its adjacency row. In single-target mode
the group is fully connected, so every member ends the round with the same group model, and
the target is evaluated with it. Optimizer state stays local (plain SGD has none).
"""

from __future__ import annotations

from typing import Any

import jax

from pfedwn_jax.algorithms.base import NoHParams, RoundContext, register
from pfedwn_jax.algorithms.common import BaselineState, baseline_algorithm, train_then_average


def _round(
    state: BaselineState, key: jax.Array, ctx: RoundContext, hp: Any
) -> tuple[BaselineState, Any]:
    return train_then_average(state, key, ctx)


FEDAVG = register(
    baseline_algorithm(
        name="fedavg",
        hparams=NoHParams,
        round=_round,
        description="sample-weighted model average inside each group",
        family="traditional",
    )
)
