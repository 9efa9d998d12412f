"""D-PSGD (Lian et al. 2017, NeurIPS): decentralized parallel SGD, gossip after local steps.

Round ``t``, every node ``i`` at once::

    x_i^{t+1/2} = local training of x_i^t          (the context's local steps / epochs)
    x_i^{t+1}   = sum_{j in N_i} W_ij x_j^{t+1/2}   (N_i: i and the listed j that delivered)

``W`` is the Metropolis-Hastings matrix (Xiao and Boyd 2004) of the *symmetrized* selected
graph, ``W_ij = 1 / (1 + max(d_i, d_j))``, ``W_ii = 1 - sum_j W_ij`` (``engine.gossip``),
computed from the listed neighbor lists, which the nodes know before the round.

**Lost packets.** Row ``i`` keeps only the links that delivered this round (and the one-way
links where ``i`` hears ``j``; a neighbor that does not reach ``i`` is a lost link too) and is
renormalised over them: ``W_ij / sum_{k delivered} W_ik``. A node that receives nothing keeps
its model; with ``stale`` links a failed link's last copy counts as delivered.

**Departures.** Lian et al.'s Algorithm 1 applies one stochastic gradient, computed at
``x_i^t``, to the gossip average (``x^{t+1} = W x^t - gamma g(x^t)``); here the trained models
are averaged (``x^{t+1} = W (x^t - gamma g(x^t))``, local SGD then gossip as in Koloskova et
al. 2020's unified analysis), so the round's local steps follow the context's schedule like
every other method here and D-PSGD on a complete graph with uniform weights is FedAvg with
equal weights. On a directed selected graph the renormalised rows are row-stochastic only
(the paper assumes a symmetric doubly stochastic ``W``). The optimizer state stays local.

Records: ``train_loss [S]``. Its mixing weights ``W`` over the delivered links are declared
(``mixing_weights``): the engine reports their ``spectral_gap`` per round.
"""

from __future__ import annotations

from typing import Any

import jax

from pfedwn_jax.algorithms.base import NoHParams, RoundContext, register
from pfedwn_jax.algorithms.common import BaselineState, baseline_algorithm, local_update
from pfedwn_jax.algorithms.mixing import gossip, mh_weights


def gossip_after_training(
    state: BaselineState, key: jax.Array, ctx: RoundContext, **train_kwargs: Any
) -> tuple[BaselineState, Any]:
    """``local_update`` then the MH gossip average; ``(state, sent)``, sent: the trained
    models."""
    clients, metrics = local_update(ctx, state.clients, key, **train_kwargs)
    mixed = gossip(clients.params, ctx, mh_weights(ctx))
    return BaselineState(clients._replace(params=mixed), metrics["loss"]), clients.params


def _round(
    state: BaselineState, key: jax.Array, ctx: RoundContext, hp: Any
) -> tuple[BaselineState, Any]:
    return gossip_after_training(state, key, ctx)


def mh_mixing(state: Any, ctx: RoundContext, hp: Any) -> jax.Array:
    """``[S, K]`` the round's Metropolis-Hastings weights (``Algorithm.mixing_weights``)."""
    return mh_weights(ctx)


DPSGD = register(
    baseline_algorithm(
        name="dpsgd",
        hparams=NoHParams,
        round=_round,
        mixing_weights=mh_mixing,
        description="D-PSGD: local SGD, then a Metropolis-Hastings gossip average",
        family="decentralized",
        default=False,
    )
)
