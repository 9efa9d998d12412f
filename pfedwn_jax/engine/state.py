"""Stacked per-slot training state: parameters and optimizer state with a leading slot axis."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax

from pfedwn_jax._checks import check_int
from pfedwn_jax.engine.tree import broadcast_slots, num_slots_of
from pfedwn_jax.models import Model


class ClientState(NamedTuple):
    """Every model slot's parameters and optax state; every leaf has leading axis S.

    Attributes:
      params: model parameters, leaves `[S, ...]`.
      opt_state: `optimizer.init` of each slot's parameters, leaves `[S, ...]`.
    """

    params: Any
    opt_state: Any

    @property
    def num_slots(self) -> int:
        """S, the leading axis of the parameters."""
        return num_slots_of(self.params)


def init_client_state(
    model: Model,
    optimizer: optax.GradientTransformation,
    key: jax.Array,
    num_slots: int,
    same_init: bool = True,
) -> ClientState:
    """Initial state of `num_slots` slots.

    `same_init=True` gives every slot the same model `model.init(key)` (one shared initial model,
    as federated learning starts); `False` initialises slot s from `random.split(key, S)[s]`.
    """
    num_slots = check_int("num_slots", num_slots, 1)
    if same_init:
        params = broadcast_slots(model.init(key), num_slots)
    else:
        params = jax.vmap(model.init)(jax.random.split(key, num_slots))
    return ClientState(params, jax.vmap(optimizer.init)(params))
