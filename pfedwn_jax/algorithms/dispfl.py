"""DisPFL (Dai, Shen, Tian, Hu, Jiao, Li and Tao 2022, ICML, "DisPFL: towards
communication-efficient personalized federated learning via decentralized sparse training"):
personalized sparse masks over a decentralized graph.

Every node ``k`` has a sparse mask ``m_k`` (same shapes as the model, 0/1) and a model
``w_k = w_k * m_k``. Round ``t``::

    wbar_k = (sum_{j in N_k} m_j * w_j) / (sum_{j in N_k} m_j)      (elementwise, N_k: k and
             the neighbors whose sparse model arrived; 0 / 0 keeps k's own entry)
    w_k    = local training of wbar_k * m_k, the gradient masked by m_k

so each coordinate is averaged over the nodes whose masks keep it. The masks are drawn once
at ``init``, per node and leaf: each weight matrix keeps a fraction ``density`` of its
entries (uniform at random); biases and other leaves of rank < 2 are dense.

**Lost packets.** A model that did not arrive is left out of both sums (its coordinates are
averaged over the rest); with ``stale`` links a failed link's last copy is used (the masks do
not change, so the copy's mask is known). A node with nothing delivered trains its own.

**Departures.** The masks are fixed: the paper's prune-and-regrow mask update (cosine
annealed, magnitude pruning, gradient regrowth) is not built, and the masks are drawn
uniformly per leaf instead of with the paper's ERK layer densities. Its random neighbor
sampling per round is the selected graph's links here.

Hyperparameters: ``density`` in (0, 1], the kept share of each weight matrix (default 0.5,
the paper's sparsity 0.5). Static (it draws the masks at ``init``). With ``density = 1``
every coordinate is averaged over the whole neighborhood, then trained (CFA's rule with
unweighted averaging).

Records: ``train_loss [S]`` (the consensus distance is a metric of every method).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_float
from pfedwn_jax.algorithms.base import RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import (
    baseline_algorithm,
    init_clients,
    local_update,
    neighbor_models,
)
from pfedwn_jax.engine import ClientState, default_loss
from pfedwn_jax.engine.tree import mix_sparse_masked, rows_in_place

#: Salt of the mask draw, folded into the init key.
MASK_SALT = 0xD15


@hparams(name="dispfl")
class DisPFLHParams:
    """DisPFL hyperparameters.

    Attributes:
      density: kept share of each weight matrix's entries, in (0, 1]. Default 0.5. Static.
    """

    density: float = checked(0.5, check_float, 0.0, 1.0, low_inclusive=False, static=True)


class DisPFLState(NamedTuple):
    """Attributes: ``clients`` (sparse models ``[S, ...]``), ``masks`` bool like the models
    (a quarter of a float32 copy), ``train_loss [S]``."""

    clients: ClientState
    masks: Any
    train_loss: jax.Array


#: Slots whose masks are drawn at once (the random bits of a draw are several times the
#: mask's bytes; drawn for every slot at once they outgrew the machine at 10,000 MLP nodes).
DRAW_CHUNK = 256


def draw_masks(key: jax.Array, params: Any, density: float) -> Any:
    """Bool masks like ``params [S, ...]``: each slot keeps a uniform random ``density``
    share of every leaf of rank >= 2 (`_draw_leaf`); other leaves dense."""
    leaves, treedef = jax.tree.flatten(params)
    out = [
        _draw_leaf(jax.random.fold_in(key, i), a.shape, density)
        if a.ndim >= 3
        else jnp.ones(a.shape, bool)  # [S] or [S, n]: a bias
        for i, a in enumerate(leaves)
    ]
    return jax.tree.unflatten(treedef, out)


def _draw_leaf(key: jax.Array, shape: tuple[int, ...], density: float) -> jax.Array:
    """``[S, ...]`` bool: slot ``s``'s mask drawn from ``fold_in(key, s)`` (independent of
    how many slots there are), ``DRAW_CHUNK`` slots at a time."""
    one = lambda s: jax.random.uniform(jax.random.fold_in(key, s), shape[1:]) < density
    draw = lambda rows, real, part: jax.vmap(one)(rows)
    return rows_in_place(draw, jnp.zeros(shape, bool), DRAW_CHUNK)


def _init(key: jax.Array, ctx: RoundContext, hp: DisPFLHParams) -> DisPFLState:
    clients = init_clients(key, ctx)
    masks = draw_masks(jax.random.fold_in(key, MASK_SALT), clients.params, hp.density)
    params = jax.tree.map(lambda p, m: p * m.astype(p.dtype), clients.params, masks)
    zeros = jnp.zeros((ctx.num_slots,), jnp.float32)
    return DisPFLState(clients._replace(params=params), masks, zeros)


def sparse_average(params: Any, masks: Any, ctx: RoundContext) -> Any:
    """Each coordinate of slot ``k``'s model averaged over the delivered neighbors (and
    ``k``) whose masks keep it, then masked by ``k``'s mask (the models are masked already,
    so the sum over the models is ``sum_j m_j w_j``; a stale copy carries its sender's
    mask, which does not change)."""
    pool, index = neighbor_models(params, ctx)
    ones = jnp.asarray(ctx.neighbor_mask, jnp.float32)
    return mix_sparse_masked(pool, index, masks, ctx.neighbors, ones, shards=ctx.shards)


def _round(
    state: DisPFLState, key: jax.Array, ctx: RoundContext, hp: DisPFLHParams
) -> tuple[DisPFLState, Any]:
    sent = state.clients.params
    mixed = sparse_average(sent, state.masks, ctx)
    base = default_loss(ctx.model)

    def loss_fn(params, x, y, w, mask):
        return base(jax.tree.map(lambda p, m: p * m.astype(p.dtype), params, mask), x, y, w, None)

    clients, metrics = local_update(
        ctx, state.clients._replace(params=mixed), key, loss_fn=loss_fn, aux=state.masks
    )
    return DisPFLState(clients, state.masks, metrics["loss"]), sent


def payload_bits(state: DisPFLState, ctx: RoundContext, hp: Any, value_bits: Any) -> Any:
    """``[S]``: a slot sends the entries its mask keeps, at ``value_bits`` each, and its mask
    of every sparse leaf, a bit an entry (the dense leaves need none)."""
    kept = sum(m.reshape(m.shape[0], -1).sum(axis=1) for m in jax.tree.leaves(state.masks))
    bitmap = sum(math.prod(m.shape[1:]) for m in jax.tree.leaves(state.masks) if m.ndim >= 3)
    return value_bits * kept + bitmap


DISPFL = register(
    baseline_algorithm(
        name="dispfl",
        hparams=DisPFLHParams,
        init=_init,
        round=_round,
        payload_bits=payload_bits,
        description="DisPFL: personalized sparse masks, coordinates averaged where masks overlap",
        family="decentralized",
        default=False,
    )
)
