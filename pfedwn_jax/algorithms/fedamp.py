"""FedAMP (Huang et al., AAAI 2021): attentive message passing between personalised models.

Each round, for every slot ``i`` and every ``j != i`` on its neighbor list, with squared
parameter distances ``d_ij = ||w_i - w_j||^2`` (computed only for the listed pairs,
``[S, K]``: O(S K P)):

- attention weights ``xi_ij = alpha_k * A'(d_ij)``, ``A'(d) = exp(-d / sigma) / sigma`` (the
  derivative of the attention-inducing function ``A(d) = 1 - exp(-d / sigma)``), computed in
  log space so a tiny ``sigma`` underflows to 0 instead of overflowing;
- personalised cloud model ``u_i = (1 - sum_j xi_ij) w_i + sum_j xi_ij w_j``;
- local training of ``f_i(w) + lambda / (2 alpha_k) * ||w - u_i||^2`` from ``w_i``, **with**
  the gradient of the proximal term (it is part of the objective differentiated by the
  engine), as in the paper. (A widely used library detaches this term so that it has no
  effect on training; we follow the paper instead.)

Guard (ours): if ``sum_j xi_ij > 1`` the off-diagonal weights of that row are rescaled to sum
to 1, so ``u_i`` stays a convex combination of models (the paper's analysis assumes
``alpha_k`` small enough for this; without the guard identical models at round 1, where
``A'(0) = 1/sigma``, would give huge cancelling weights).

With ``sigma -> 0`` every ``xi_ij`` with ``d_ij > 0`` vanishes, ``u_i = w_i`` and FedAMP is
local training with a proximal term to the slot's own round-start model ("behaves like
Local"; with ``lam = 0`` it is exactly Local).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax._checks import check_float, set_fields
from pfedwn_jax.algorithms.base import Algorithm, RoundContext, neighbor_lists, register
from pfedwn_jax.algorithms.common import (
    BaselineState,
    check_shape,
    check_square,
    eval_own,
    init_baseline,
    local_update,
    neighbor_distances,
    neighbor_models,
    proximal_loss,
    train_loss_record,
)
from pfedwn_jax.engine import default_loss, mix_sparse


@dataclasses.dataclass(frozen=True)
class FedAMPHParams:
    """FedAMP hyperparameters (Huang et al. 2021 tune them per dataset; defaults are ours).

    Attributes:
      alpha_k: step size ``alpha_k`` of the message passing (> 0). Default 1.0.
      sigma: scale of the attention-inducing function (> 0), in units of squared parameter
        distance. Default 1.0 (ours: squared distances between our MNIST CNNs after 1-3 local
        rounds are 1-4, so each neighbor gets a weight of about 0.05-0.3).
      lam: proximal weight ``lambda`` (>= 0); the term is ``lam / (2 alpha_k) ||w - u||^2``.
        Default 1.0.
    """

    alpha_k: float = 1.0
    sigma: float = 1.0
    lam: float = 1.0

    def __post_init__(self) -> None:
        set_fields(
            self,
            alpha_k=check_float("hparams.fedamp.alpha_k", self.alpha_k, 0.0, low_inclusive=False),
            sigma=check_float("hparams.fedamp.sigma", self.sigma, 0.0, low_inclusive=False),
            lam=check_float("hparams.fedamp.lam", self.lam, 0.0),
        )


def attention_weights(
    sq_dists: jax.Array, neighbor_mask: jax.Array, alpha_k: float, sigma: float
) -> jax.Array:
    """The row-stochastic ``[S, K]`` weights ``Xi`` with ``u = mix_sparse(w, neighbors, Xi)``.

    ``sq_dists [S, K]``: ``d[s, k]`` to the ``k``-th listed slot (column 0: the slot itself);
    ``neighbor_mask [S, K]`` bool. ``Xi[s, k] = alpha_k exp(-d[s, k] / sigma) / sigma`` on the
    real columns ``k >= 1``, ``Xi[s, 0] = 1 - sum_{k >= 1} Xi[s, k]``; rows whose neighbor sum
    exceeds 1 are rescaled to sum to 1 (self weight 0). See the module docstring.
    """
    check_shape("sq_dists", sq_dists, (None, None), "[S, K]")
    check_shape("neighbor_mask", neighbor_mask, np.shape(sq_dists), "[S, K]")
    k = np.shape(sq_dists)[1]
    edge = jnp.asarray(neighbor_mask, bool) & (jnp.arange(k) > 0)[None, :]
    d = sq_dists.astype(jnp.float32)
    log_xi = jnp.log(alpha_k) - jnp.log(sigma) - d / sigma
    log_xi = jnp.where(edge, log_xi, -jnp.inf)
    log_total = jax.nn.logsumexp(log_xi, axis=1, keepdims=True)  # -inf for an empty row
    over = log_total > 0.0
    xi = jnp.where(over, jnp.exp(log_xi - jnp.where(over, log_total, 0.0)), jnp.exp(log_xi))
    return xi.at[:, 0].set(1.0 - xi.sum(1))


def attention_matrix(
    sq_dists: jax.Array, adjacency: jax.Array, alpha_k: float, sigma: float
) -> jax.Array:
    """The dense ``[S, S]`` form of ``attention_weights`` (small networks and tests): ``Xi``
    with ``u = Xi @ w`` from ``sq_dists [S, S]`` and ``adjacency [S, S]`` bool."""
    s = check_square("sq_dists", sq_dists)
    check_shape("adjacency", adjacency, (s, s))
    neighbors, _ = neighbor_lists(np.ones((s, s), bool))  # every slot listed, column 0 = self
    rows = np.arange(s)[:, None]
    mask = jnp.asarray(adjacency, bool)[rows, neighbors].at[:, 0].set(True)
    xi = attention_weights(jnp.asarray(sq_dists)[rows, neighbors], mask, alpha_k, sigma)
    return jnp.zeros((s, s), xi.dtype).at[rows, neighbors].set(xi)


def cloud_models(params: Any, ctx: RoundContext, hp: FedAMPHParams) -> Any:
    """``u [S, ...]``: every slot's personalised cloud model (along its neighbor list)."""
    pool, index = neighbor_models(params, ctx)
    d = neighbor_distances(params, pool, index, shards=ctx.shards)  # [S, K]
    xi = attention_weights(d, ctx.neighbor_mask, hp.alpha_k, hp.sigma)
    return mix_sparse(pool, index, xi, shards=ctx.shards)


def _round(
    state: BaselineState, key: jax.Array, ctx: RoundContext, hp: FedAMPHParams
) -> BaselineState:
    u = cloud_models(state.clients.params, ctx, hp)
    loss_fn = proximal_loss(default_loss(ctx.model), hp.lam / hp.alpha_k)
    clients, metrics = local_update(ctx, state.clients, key, loss_fn=loss_fn, aux=u)
    return BaselineState(clients, metrics["loss"])


FEDAMP = register(
    Algorithm(
        name="fedamp",
        hparams=FedAMPHParams,
        init=init_baseline,
        round=_round,
        eval_params=eval_own,
        records=train_loss_record,
        description="attentive message passing with a proximal term to the cloud model",
    )
)
