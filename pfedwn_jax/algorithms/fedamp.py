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

Scale ``sigma`` (``sigma_mode``): ``"fixed"`` uses ``sigma`` as given (in units of squared
parameter distance); ``"auto"`` (ours, stated rule) sets it per slot and round relative to the
models' distances: ``sigma_i = sigma_scale * median_{j in N(i)} ||w_i - w_j||^2`` over the
slot's listed neighbors at the start of the round (the same distances the weights use; at
least ``SIGMA_FLOOR``), so ``d_ij / sigma_i`` is scale-free and a neighbor at the median
distance has ``A'(d) = exp(-1 / sigma_scale) / sigma_i``.

Attention gradient (``detach_attention``): by default (True; the paper's alternating
optimisation and common implementations such as PFLlib's) ``u_i`` is computed once at the
start of the round and is a constant of local training: no gradient flows through the
attention weights. ``False`` recomputes ``u_i(w) = (1 - sum_j xi_ij(w)) w + sum_j xi_ij(w)
w_j`` from the live model in every local step (the neighbors' ``w_j`` and ``sigma`` stay those
of the round start), and the proximal term is differentiated through it, the attention
weights ``xi_ij(w) = alpha_k A'(||w - w_j||^2)`` included (memory: every slot holds its ``K``
received models during training, ``[S, K, P]``).

With ``sigma -> 0`` every ``xi_ij`` with ``d_ij > 0`` vanishes, ``u_i = w_i`` and FedAMP is
local training with a proximal term to the slot's own round-start model ("behaves like
Local"; with ``lam = 0`` it is exactly Local).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from pfedwn_jax._checks import INT32_MAX, check_bool, check_choice, check_float, check_int
from pfedwn_jax.algorithms.base import RoundContext, checked, hparams, neighbor_lists, register
from pfedwn_jax.algorithms.common import (
    BaselineState,
    baseline_algorithm,
    check_shape,
    check_square,
    local_update,
    neighbor_distances,
    neighbor_models,
    proximal_loss,
    sq_norm_diff,
)
from pfedwn_jax.algorithms.phases import Phase, Sizes, baseline, plus
from pfedwn_jax.engine import default_loss, mix_sparse
from pfedwn_jax.engine.tree import block_size

SIGMA_MODES = ("fixed", "auto")
#: Smallest ``sigma`` of ``sigma_mode="auto"`` (all neighbors at distance 0, e.g. round 1).
SIGMA_FLOOR = 1e-12
#: Stands for log(0) inside the log-sum-exp: finite, so an empty row has a finite gradient.
_LOG_ZERO = -1e30


@hparams(name="fedamp")
class FedAMPHParams:
    """FedAMP hyperparameters (Huang et al. 2021 tune them per dataset; defaults are ours).

    Attributes:
      alpha_k: step size ``alpha_k`` of the message passing (> 0). Default 1.0.
      sigma: scale of the attention-inducing function (> 0), in units of squared parameter
        distance. Default 1.0 (ours: squared distances between our MNIST CNNs after 1-3 local
        rounds are 1-4, so each neighbor gets a weight of about 0.05-0.3).
      lam: proximal weight ``lambda`` (>= 0); the term is ``lam / (2 alpha_k) ||w - u||^2``.
        Default 1.0.
      sigma_mode: "fixed" (``sigma`` as given, default: today's behaviour) or "auto"
        (``sigma_i = sigma_scale * median_j ||w_i - w_j||^2`` over slot i's neighbors at the
        start of each round; ``sigma`` is then unused). A separate field, not ``sigma="auto"``,
        so ``sigma`` stays a float that a compiled round takes as an argument.
      sigma_scale: factor of the "auto" rule (> 0). Default 1.0 (ours).
      detach_attention: True (default; the paper's alternating steps, PFLlib): ``u_i`` is fixed
        at the round start, no gradient through the attention weights. False: ``u_i(w)``
        follows the live model and the proximal term is differentiated through it.
      chunk: targets whose distances ``d_ij`` are computed at once (each chunk gathers its
        targets' neighbor models one list column at a time, ``chunk x P`` floats); 0
        (default): about ``engine.tree.BLOCK_ELEMENTS`` parameters per chunk. Results do not
        depend on it (tested bit for bit on the CPU).
    """

    alpha_k: float = checked(1.0, check_float, 0.0, low_inclusive=False)
    sigma: float = checked(1.0, check_float, 0.0, low_inclusive=False)
    lam: float = checked(1.0, check_float, 0.0)
    sigma_mode: str = checked("fixed", check_choice, SIGMA_MODES, static=True)
    sigma_scale: float = checked(1.0, check_float, 0.0, low_inclusive=False)
    detach_attention: bool = checked(True, check_bool, static=True)
    chunk: int = checked(0, check_int, 0, INT32_MAX, static=True)


def attention_weights(
    sq_dists: jax.Array, neighbor_mask: ArrayLike, alpha_k: float, sigma: float | jax.Array
) -> jax.Array:
    """The row-stochastic ``[S, K]`` weights ``Xi`` with ``u = mix_sparse(w, neighbors, Xi)``.

    ``sq_dists [S, K]``: ``d[s, k]`` to the ``k``-th listed slot (column 0: the slot itself);
    ``neighbor_mask [S, K]`` bool; ``sigma`` a scalar or ``[S]`` (one per row).
    ``Xi[s, k] = alpha_k exp(-d[s, k] / sigma) / sigma`` on the real columns ``k >= 1``,
    ``Xi[s, 0] = 1 - sum_{k >= 1} Xi[s, k]``; rows whose neighbor sum exceeds 1 are rescaled
    to sum to 1 (self weight 0). See the module docstring.
    """
    check_shape("sq_dists", sq_dists, (None, None), "[S, K]")
    check_shape("neighbor_mask", neighbor_mask, np.shape(sq_dists), "[S, K]")
    k = np.shape(sq_dists)[1]
    edge = jnp.asarray(neighbor_mask, bool) & (jnp.arange(k) > 0)[None, :]
    d = sq_dists.astype(jnp.float32)
    if jnp.ndim(sigma) == 1:
        sigma = jnp.reshape(sigma, (-1, 1))
    log_xi = jnp.log(alpha_k) - jnp.log(sigma) - d / sigma
    log_xi = jnp.where(edge, log_xi, -jnp.inf)
    # ~ -1e30 for an empty row (exactly the -inf version's value on any other row)
    log_total = jax.nn.logsumexp(jnp.where(edge, log_xi, _LOG_ZERO), axis=1, keepdims=True)
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


def neighbor_median(sq_dists: jax.Array, neighbor_mask: ArrayLike) -> jax.Array:
    """``[S]`` median of ``sq_dists [S, K]`` over each row's real neighbors (columns ``k >= 1``
    where ``neighbor_mask [S, K]``); 1.0 for a row without neighbors (its weights are 0)."""
    k = np.shape(sq_dists)[1]
    edge = jnp.asarray(neighbor_mask, bool) & (jnp.arange(k) > 0)[None, :]
    count = edge.sum(1)
    ordered = jnp.sort(jnp.where(edge, sq_dists, jnp.inf), axis=1)
    lo = jnp.maximum((count - 1) // 2, 0)[:, None]
    hi = jnp.maximum(count // 2, 0)[:, None]
    pick = lambda i: jnp.take_along_axis(ordered, i, axis=1)[:, 0]
    return jnp.where(count > 0, 0.5 * (pick(lo) + pick(hi)), 1.0)


def round_sigma(sq_dists: jax.Array, neighbor_mask: ArrayLike, hp: FedAMPHParams) -> Any:
    """This round's ``sigma``: ``hp.sigma`` ("fixed") or ``[S]`` ``sigma_scale`` times each
    row's median neighbor distance, at least ``SIGMA_FLOOR`` ("auto")."""
    if hp.sigma_mode == "fixed":
        return hp.sigma
    return jnp.maximum(hp.sigma_scale * neighbor_median(sq_dists, neighbor_mask), SIGMA_FLOOR)


def cloud_models(params: Any, ctx: RoundContext, hp: FedAMPHParams) -> Any:
    """``u [S, ...]``: every slot's personalised cloud model (along its neighbor list): the
    distances over chunks of targets, the weights ``[S, K]``, the mix a block of parameters
    at a time (``mix_sparse``): ``u`` and the models are the only ``[S, P]`` arrays."""
    pool, index = neighbor_models(params, ctx)
    d = neighbor_distances(params, pool, index, shards=ctx.shards, chunk=hp.chunk or None)
    xi = attention_weights(d, ctx.neighbor_mask, hp.alpha_k, round_sigma(d, ctx.neighbor_mask, hp))
    return mix_sparse(pool, index, xi, shards=ctx.shards)


def attentive_loss(base_loss: Any, hp: FedAMPHParams) -> Any:
    """``loss_fn(params, x, y, w, (received, mask, sigma))`` of ``detach_attention=False``:
    ``base_loss + lam / (2 alpha_k) ||params - u(params)||^2`` with ``u`` rebuilt from the live
    ``params`` and the slot's ``received [K, ...]`` models (column 0 itself), ``mask [K]``,
    ``sigma []``; ``params - u = sum_{k >= 1} xi_k (params - received_k)``."""
    scale = hp.lam / hp.alpha_k

    def loss_fn(params, x, y, w, aux):
        received, mask, sigma = aux
        diff = jax.tree.map(lambda p, r: p[None] - r, params, received)  # leaves [K, ...]
        flat = [jnp.square(a).reshape(a.shape[0], -1).sum(1) for a in jax.tree.leaves(diff)]
        d = sum(flat, jnp.zeros(np.shape(mask), jnp.float32))  # [K]
        xi = attention_weights(d[None], mask[None], hp.alpha_k, sigma)[0].at[0].set(0.0)
        gap = jax.tree.map(lambda a: jnp.tensordot(xi, a, axes=1), diff)  # params - u
        zero = jax.tree.map(jnp.zeros_like, gap)
        return base_loss(params, x, y, w, None) + 0.5 * scale * sq_norm_diff(gap, zero)

    return loss_fn


def _round(
    state: BaselineState, key: jax.Array, ctx: RoundContext, hp: FedAMPHParams
) -> tuple[BaselineState, Any]:
    params, base = state.clients.params, default_loss(ctx.model)
    if hp.detach_attention:
        aux = cloud_models(params, ctx, hp)
        loss_fn = proximal_loss(base, hp.lam / hp.alpha_k)
    else:
        pool, index = neighbor_models(params, ctx)
        d = neighbor_distances(params, pool, index, shards=ctx.shards, chunk=hp.chunk or None)
        sigma = jnp.broadcast_to(round_sigma(d, ctx.neighbor_mask, hp), (ctx.num_slots,))
        received = jax.tree.map(lambda a: a[index], pool)  # [S, K, ...]
        aux, loss_fn = (received, ctx.neighbor_mask, sigma), attentive_loss(base, hp)
    clients, metrics = local_update(ctx, state.clients, key, loss_fn=loss_fn, aux=aux)
    return BaselineState(clients, metrics["loss"]), params


def memory_phases(sz: Sizes, hp: Any) -> list[Phase]:
    """FedAMP: the cloud models `u` live through training, and XLA:CPU trains a copy of the
    models in the driver's block program (measured: two copies besides the state); the
    distances over chunks of targets (`neighbor_sq_dist`: a chunk's own and gathered
    models). Without `detach_attention` every slot's `K` received models `[S, K, ...]`."""
    train, mixing, evaluation = baseline(sz, hp)
    width = sz.pairs // sz.slots + 1
    chunk = getattr(hp, "chunk", 0) or block_size(sz.slots, sz.param // 4)
    distances = Phase("FedAMP distances", 0, 2 * max(chunk, 2) * sz.param)
    held = 2 * sz.slots * sz.param
    if not getattr(hp, "detach_attention", True):
        held += sz.slots * width * sz.param
    return [plus(train, held), mixing, distances, evaluation]


FEDAMP = register(
    baseline_algorithm(
        name="fedamp",
        tune=("sigma_scale", (0.5, 2.0)),
        hparams=FedAMPHParams,
        round=_round,
        description="attentive message passing with a proximal term to the cloud model",
        memory_phases=memory_phases,
        family="personalized-aggregation",
    )
)
