"""Local training only: every slot trains on its own data and never communicates."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from pfedwn_jax.algorithms.base import (
    Algorithm,
    NoHParams,
    RoundContext,
    init_clients,
    local_update,
    register,
)


class BaselineState(NamedTuple):
    """State of the non-personalised baselines.

    Attributes:
      clients: stacked engine ``ClientState`` (params and optimizer state, leading axis S).
      train_loss: ``[S]`` mean local training loss of the last round (0 before round 1).
    """

    clients: Any
    train_loss: jax.Array


def init_baseline(key: jax.Array, ctx: RoundContext, hp: Any) -> BaselineState:
    """One shared initial model in every slot (shared by local, fedavg and fedprox)."""
    clients = init_clients(key, ctx)
    return BaselineState(clients, jax.numpy.zeros((ctx.num_slots,), jax.numpy.float32))


def eval_own(state: BaselineState, ctx: RoundContext, hp: Any):
    """Each slot is evaluated with the model it holds."""
    return state.clients.params


def train_loss_record(state: BaselineState, ctx: RoundContext, hp: Any) -> dict[str, jax.Array]:
    return {"train_loss": state.train_loss}


def _round(state: BaselineState, key: jax.Array, ctx: RoundContext, hp: Any) -> BaselineState:
    clients, metrics = local_update(ctx, state.clients, key)
    return BaselineState(clients, metrics["loss"])


LOCAL = register(
    Algorithm(
        name="local",
        hparams=NoHParams,
        init=init_baseline,
        round=_round,
        eval_params=eval_own,
        records=train_loss_record,
        description="local training only (no communication)",
    )
)
