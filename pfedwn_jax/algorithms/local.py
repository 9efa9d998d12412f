"""Local training only: every slot trains on its own data and never communicates."""

from __future__ import annotations

from typing import Any

import jax

from pfedwn_jax.algorithms.base import Algorithm, NoHParams, RoundContext, register
from pfedwn_jax.algorithms.common import (
    BaselineState,
    eval_own,
    init_baseline,
    local_update,
    train_loss_record,
)
from pfedwn_jax.algorithms.phases import Phase, Sizes, baseline


def _round(
    state: BaselineState, key: jax.Array, ctx: RoundContext, hp: Any
) -> tuple[BaselineState, None]:
    clients, metrics = local_update(ctx, state.clients, key)
    return BaselineState(clients, metrics["loss"]), None  # nothing is sent


def memory_phases(sz: Sizes, hp: Any) -> list[Phase]:
    """Local: train and evaluate (nothing is mixed)."""
    train, _, evaluation = baseline(sz, hp)
    return [train, evaluation]


LOCAL = register(
    Algorithm(
        name="local",
        hparams=NoHParams,
        init=init_baseline,
        round=_round,
        eval_params=eval_own,
        records=train_loss_record,
        description="local training only (no communication)",
        memory_phases=memory_phases,
        family="local",
    )
)
