"""DFedAvgM (Sun, Li and Wang 2022, IEEE TPAMI, "Decentralized Federated Averaging"): local
SGD with heavy-ball momentum, then a gossip average.

Round ``t``, every node ``i``, ``K`` local steps (the context's schedule) from
``y^{-1} = y^0 = x_i^t``::

    y^{k+1}   = y^k - eta grad f_i(y^k; xi) + theta (y^k - y^{k-1})
    x_i^{t+1} = sum_{j in N_i} W_ij y_j^K

The momentum restarts every round (the paper's ``y^{t,-1} = y^{t,0}``): a fresh
``optax.sgd(lr, momentum=theta)`` state (heavy ball, the same iterates) per round, made for
one chunk of nodes at a time (``MOMENTUM_BYTES`` of it at most), so a large network holds one
chunk's momentum, not a second copy of every model; the chunks train as one call would. ``W`` is
D-PSGD's: Metropolis-Hastings weights of the symmetrized listed graph, each row renormalised
over the links that delivered (``engine.gossip.metropolis_weights``), so a lost packet hands
its weight to the rest of the row and a node with nothing delivered keeps its trained model.

**Departures.** The paper's quantized variant is not built here; ``W`` is row-stochastic only
on a directed selected graph (the paper assumes symmetric doubly stochastic). A user's own
``optimizer`` in the config is used as it is, without the momentum ``theta`` (the context's
``momentum`` setting is replaced by ``theta``).

Hyperparameters: ``momentum`` theta (default 0.9, the heavy-ball momentum commonly used in
its experiments). ``momentum = 0`` is D-PSGD.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from pfedwn_jax._checks import check_float
from pfedwn_jax.algorithms.base import RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import BaselineState, baseline_algorithm, local_update
from pfedwn_jax.algorithms.dpsgd import mh_mixing
from pfedwn_jax.algorithms.mixing import gossip, mh_weights
from pfedwn_jax.algorithms.phases import Phase, Sizes, baseline, plus
from pfedwn_jax.engine import ClientState
from pfedwn_jax.engine.evaluate import slot_bytes
from pfedwn_jax.engine.tree import rows_in_place


@hparams(name="dfedavgm")
class DFedAvgMHParams:
    """DFedAvgM hyperparameters.

    Attributes:
      momentum: heavy-ball momentum theta of the local steps, in [0, 1). Default 0.9.
    """

    momentum: float = checked(0.9, check_float, 0.0, 1.0, high_inclusive=False)


#: Bytes of fresh momentum a round makes at once: nodes train in chunks of
#: `momentum_chunk` (all at once where their models take less).
MOMENTUM_BYTES = 1 << 30


def momentum_chunk(param_bytes: int, slots: int) -> int:
    """Nodes whose fresh momentum (one model's worth each) fits `MOMENTUM_BYTES`."""
    return max(1, min(slots, MOMENTUM_BYTES // max(param_bytes, 1)))


def _train(ctx: RoundContext, params: Any, key: jax.Array, tx: Any) -> tuple[Any, jax.Array]:
    """Every node's local steps from a fresh momentum, chunk by chunk: `(params, loss [S])`."""
    chunk = momentum_chunk(slot_bytes(params), ctx.num_slots)
    ctx = ctx.replace(optimizer=tx)
    if chunk == ctx.num_slots:
        trained, metrics = local_update(ctx, ClientState(params, jax.vmap(tx.init)(params)), key)
        return trained.params, metrics["loss"]

    def part(rows: jax.Array, real: jax.Array, tree: tuple) -> tuple:
        fresh = ClientState(tree[0], jax.vmap(tx.init)(tree[0]))
        dc = ctx.data_client[rows]
        trained, m = local_update(ctx, fresh, key, data_client=dc, active=real, slot_ids=rows)
        return trained.params, m["loss"]

    loss = jnp.zeros(ctx.num_slots, jnp.float32)
    return rows_in_place(part, (params, loss), chunk)


def _round(
    state: BaselineState, key: jax.Array, ctx: RoundContext, hp: DFedAvgMHParams
) -> tuple[BaselineState, Any]:
    tx = ctx.optimizer if ctx.optimizer is not None else optax.sgd(ctx.lr, momentum=hp.momentum)
    trained, loss = _train(ctx, state.clients.params, key, tx)
    mixed = gossip(trained, ctx, mh_weights(ctx))
    clients = state.clients._replace(params=mixed)
    return BaselineState(clients, loss), trained


def memory_phases(sz: Sizes, hp: Any) -> list[Phase]:
    """The baseline's phases, training holding the fresh momentum of one chunk of nodes
    (`momentum_chunk`; one model's worth each, beside the state's optimizer state, which has
    none) and, where the nodes train in several chunks, the chunk's models taken out of the
    stack (measured at 10,000 MLP nodes: benchmarks/RESULTS.md)."""
    train, *rest = baseline(sz, hp)
    chunk = momentum_chunk(sz.param, sz.slots)
    held = chunk if chunk == sz.slots else 2 * chunk
    return [plus(train, held * sz.param), *rest]


DFEDAVGM = register(
    baseline_algorithm(
        name="dfedavgm",
        tune=("momentum", (0.5, 0.9)),
        hparams=DFedAvgMHParams,
        round=_round,
        mixing_weights=mh_mixing,
        memory_phases=memory_phases,
        description="DFedAvgM: local heavy-ball SGD, then a Metropolis-Hastings gossip average",
        family="decentralized",
        default=False,
    )
)
