"""CFA, consensus-based federated averaging (Savazzi, Nicoli and Rampa 2020, IEEE Internet of
Things Journal, "Federated learning with cooperating devices: a consensus approach for
massive IoT networks"): the D2D consensus rule of the wireless-FL literature.

Round ``t``, every device ``k`` at once: a consensus step on the models its neighbors sent,
then local training from its result::

    psi_k     = w_k + eps sum_{i in N_k} alpha_ki (w_i - w_k),
                alpha_ki = n_i / sum_{j in N_k} n_j              (N_k: neighbors, not k)
    w_k^{t+1} = local training of psi_k

``n_i`` are the sample counts. The models sent are the ones the devices hold at the start of
the round (trained in the previous round).

**Lost packets.** ``N_k`` is the set of neighbors whose model arrived this round (with
``stale`` links, also a failed link's last copy): ``alpha`` is renormalised over them, and a
device that received nothing keeps its model (``psi_k = w_k``) and trains on.

**Departures.** The paper's CFA-GE variant (gradient exchange) is not built; its
time-varying ``eps_t`` is one value here.

Hyperparameters: ``eps`` the consensus step in [0, 1] (default 0.5: our choice; the paper
treats it as a design parameter). ``eps = 0`` is Local.

Records: ``train_loss [S]``; its ``mixing_weights`` are the round's consensus matrix
``(1 - eps) I + eps A`` over the delivered links (the engine's ``spectral_gap`` metric).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_float
from pfedwn_jax.algorithms.base import RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import (
    BaselineState,
    baseline_algorithm,
    group_average_weights,
    local_update,
)
from pfedwn_jax.algorithms.mixing import gossip


@hparams(name="cfa")
class CFAHParams:
    """CFA hyperparameters.

    Attributes:
      eps: consensus step size in [0, 1]. Default 0.5 (our choice).
    """

    eps: float = checked(0.5, check_float, 0.0, 1.0)


def consensus_weights(ctx: RoundContext, eps: Any) -> jax.Array:
    """``[S, K]`` row ``k``: ``1 - eps`` on itself, ``eps alpha_ki`` on the delivered
    neighbors (sample-count weights); 1 on itself when nothing was delivered."""
    others = jnp.asarray(ctx.neighbor_mask, bool).at[:, 0].set(False)
    alpha = group_average_weights(ctx.neighbors, others, ctx.num_samples)  # own=1 if none
    own = (jnp.arange(alpha.shape[1]) == 0).astype(jnp.float32)[None, :]
    return (1.0 - eps) * own + eps * alpha


def _round(
    state: BaselineState, key: jax.Array, ctx: RoundContext, hp: CFAHParams
) -> tuple[BaselineState, Any]:
    sent = state.clients.params
    psi = gossip(sent, ctx, consensus_weights(ctx, hp.eps))
    clients, metrics = local_update(ctx, state.clients._replace(params=psi), key)
    return BaselineState(clients, metrics["loss"]), sent


def _mixing(state: BaselineState, ctx: RoundContext, hp: CFAHParams) -> jax.Array:
    return consensus_weights(ctx, hp.eps)


CFA = register(
    baseline_algorithm(
        name="cfa",
        tune=("eps", (0.25, 0.5)),
        hparams=CFAHParams,
        round=_round,
        mixing_weights=_mixing,
        description="CFA: consensus step on the neighbors' models, then local training",
        family="decentralized",
        default=False,
    )
)
