"""FedNova (Wang, Liu, Liang, Joshi and Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020): normalized averaging, each slot the
server of its group.

Slot ``j`` trains locally from its model ``x_j`` for its ``tau_j`` steps (``tau_j`` follows
its data size under epochs), giving ``y_j``, and sends its normalized update
``d_j = (x_j - y_j) / a_j`` with ``a_j = ||a_j||_1`` its step count weighted by the local
momentum ``rho`` (``a_j = tau_j`` for plain SGD, else
``(tau_j - rho (1 - rho^tau_j) / (1 - rho)) / (1 - rho)``). Slot ``s`` steps

    ``x_s <- x_s - tau_eff_s sum_j p_sj d_j``,  ``tau_eff_s = sum_j p_sj a_j``

over its neighbor list (``p_sj`` FedAvg's sample-count weights). With equal local steps and
a common start (single-target mode) this is FedAvg's ``sum_j p_sj y_j``.

Departures: the paper has one server and one start ``x`` (in network mode each slot applies
its neighbors' normalized updates to its own model, so it departs from FedAvg there even
with equal steps). What a slot sends is its normalized update ``d_j`` (a stale link hands
over the last one received); ``a_j`` is known to its neighbors as its sample count is
(it follows from the count and the schedule). The local optimizer state stays local.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pfedwn_jax.algorithms.base import NoHParams, RoundContext, register
from pfedwn_jax.algorithms.common import (
    BaselineState,
    baseline_algorithm,
    group_average_weights,
    local_update,
    neighbor_models,
)
from pfedwn_jax.engine import mix_sparse


def step_norm(steps: jax.Array, momentum: Any) -> jax.Array:
    """``||a||_1 [S]`` of ``steps [S]`` local SGD steps with heavy-ball ``momentum`` (None: 0)."""
    tau = steps.astype(jnp.float32)
    if momentum is None:
        return tau
    rho = jnp.asarray(momentum, jnp.float32)
    return (tau - rho * (1.0 - rho**tau) / (1.0 - rho)) / (1.0 - rho)


def _round(
    state: BaselineState, key: jax.Array, ctx: RoundContext, hp: Any
) -> tuple[BaselineState, Any]:
    x = state.clients.params
    trained, metrics = local_update(ctx, state.clients, key)
    a = step_norm(metrics["steps"], ctx.momentum)

    def normalized(xs, ys):
        scale = jnp.where(a > 0, 1.0 / jnp.where(a > 0, a, 1.0), 0.0)
        return scale.reshape((-1,) + (1,) * (xs.ndim - 1)) * (xs - ys)

    d = jax.tree.map(normalized, x, trained.params)
    weights = group_average_weights(ctx.neighbors, ctx.neighbor_mask, ctx.num_samples)
    tau_eff = jnp.sum(weights * a[jnp.asarray(ctx.neighbors)], axis=1)
    pool, index = neighbor_models(d, ctx)
    step = mix_sparse(pool, index, weights, shards=ctx.shards)
    params = jax.tree.map(
        lambda xs, g: xs - tau_eff.reshape((-1,) + (1,) * (xs.ndim - 1)) * g, x, step
    )
    return BaselineState(trained._replace(params=params), metrics["loss"]), d


FEDNOVA = register(
    baseline_algorithm(
        name="fednova",
        hparams=NoHParams,
        round=_round,
        description="normalized averaging of the local updates by their step counts",
        family="traditional",
        default=False,
    )
)
