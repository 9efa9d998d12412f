"""Local training only: every slot trains on its own data and never communicates."""

from __future__ import annotations

from typing import Any

import jax

from pfedwn_jax.algorithms.base import NoHParams, RoundContext, register
from pfedwn_jax.algorithms.common import BaselineState, baseline_algorithm, local_update
from pfedwn_jax.algorithms.payload import nothing_sent
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
    baseline_algorithm(
        name="local",
        hparams=NoHParams,
        round=_round,
        description="local training only (no communication)",
        memory_phases=memory_phases,
        payload_bits=nothing_sent,
        family="local",
    )
)
