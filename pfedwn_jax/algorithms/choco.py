"""CHOCO-SGD (Koloskova, Stich and Jaggi 2019, ICML): gossip of compressed differences with
public copies (error feedback).

Every node ``i`` keeps its model ``x_i`` and a public copy ``xhat_i`` that its neighbors hold
too. Round ``t``::

    x_i^{t+1/2} = local training of x_i^t
    q_i         = Q(x_i^{t+1/2} - xhat_i)                      (what i sends: compressed)
    xhat_j     += q_j   for j = i and every neighbor j
    x_i^{t+1}   = x_i^{t+1/2} + gamma sum_{j in N_i} W_ij (xhat_j - xhat_i)

``Q`` is an operator of ``engine.compression`` (``compression``: ``"none"`` the identity,
``"qsgd"`` ``bits``-bit QSGD, ``"topk"`` the ``fraction`` of largest entries), applied
without its own memory: the public copy is CHOCO's error feedback (what ``Q`` drops stays in
``x - xhat`` and is sent later). ``W``: Metropolis-Hastings weights of the symmetrized listed
graph, renormalised over the links that delivered (as D-PSGD). With the identity and
``gamma = 1``, ``xhat = x^{t+1/2}`` and the round is D-PSGD's.

**Lost packets.** A link that did not deliver this round leaves the consensus step (its weight
renormalised away); the copies ``xhat_j`` every neighbor holds are kept equal to the sender's.
**Departure:** this assumes the small difference packets ``q`` reach every listed neighbor
eventually (e.g. retransmitted); the paper assumes reliable links, and a receiver that missed
a ``q`` for good would hold a copy that never catches up. With ``stale`` links a failed
link's last delivered copy of ``xhat_j`` is used.

Records: ``train_loss [S]``, ``bits [S]`` (what each node sent this round, from the operator),
and its ``W`` as ``mixing_weights`` (the engine's ``spectral_gap`` metric).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_choice, check_float, check_int
from pfedwn_jax.algorithms.base import RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import (
    baseline_algorithm,
    init_clients,
    local_update,
    state_records,
)
from pfedwn_jax.algorithms.mixing import gossip, mh_weights
from pfedwn_jax.algorithms.payload import params_per_slot
from pfedwn_jax.algorithms.phases import Phase, Sizes, baseline
from pfedwn_jax.engine import ClientState
from pfedwn_jax.engine.compression import Compressor, Identity, Quantize, TopK

#: Salt of the compression's randomness (QSGD), folded into the round key.
COMPRESS_SALT = 0xC0C0


@hparams(name="choco")
class ChocoHParams:
    """CHOCO-SGD hyperparameters.

    Attributes:
      gamma: consensus step size in (0, 1]. Default 0.8 (our choice for 8-bit QSGD, nearly
        exact; the paper tunes gamma per compressor and graph).
      compression: ``"qsgd"`` (default), ``"topk"`` or ``"none"``. Static.
      bits: bits per value of QSGD (>= 2). Default 8. Static.
      fraction: share of the entries top-k sends, in (0, 1] (at least one). Default 0.01, the
        paper's top-1%. Static.
    """

    gamma: float = checked(0.8, check_float, 0.0, 1.0, low_inclusive=False)
    compression: str = checked("qsgd", check_choice, ("qsgd", "topk", "none"), static=True)
    bits: int = checked(8, check_int, 2, 32, static=True)
    fraction: float = checked(0.01, check_float, 0.0, 1.0, low_inclusive=False, static=True)


class ChocoState(NamedTuple):
    """Attributes: ``clients`` (models ``x [S, ...]``, optimizer state), ``public`` the copies
    ``xhat [S, ...]``, ``train_loss [S]``, ``bits [S]`` sent in the last round."""

    clients: ClientState
    public: Any
    train_loss: jax.Array
    bits: jax.Array


def compressor(hp: ChocoHParams, params: Any) -> Compressor:
    """The operator of ``hp`` for models ``params [S, ...]``."""
    if hp.compression == "qsgd":
        return Quantize(bits_per_value=hp.bits)
    if hp.compression == "topk":
        size = sum(math.prod(a.shape[1:]) for a in jax.tree.leaves(params))
        return TopK(k=max(1, round(hp.fraction * size)))
    return Identity()


def _init(key: jax.Array, ctx: RoundContext, hp: ChocoHParams) -> ChocoState:
    clients = init_clients(key, ctx)
    public = jax.tree.map(jnp.zeros_like, clients.params)  # xhat^0 = 0, as the paper
    zeros = jnp.zeros((ctx.num_slots,), jnp.float32)
    return ChocoState(clients, public, zeros, zeros)


def _round(
    state: ChocoState, key: jax.Array, ctx: RoundContext, hp: ChocoHParams
) -> tuple[ChocoState, Any]:
    clients, metrics = local_update(ctx, state.clients, key)
    diff = jax.tree.map(jnp.subtract, clients.params, state.public)
    op = compressor(hp, diff)
    sent = op.apply(diff, op.init(diff), jax.random.fold_in(key, COMPRESS_SALT))
    public = jax.tree.map(jnp.add, state.public, sent.received)
    towards = gossip(public, ctx, mh_weights(ctx))  # sum_j W_ij xhat_j
    params = jax.tree.map(lambda x, m, h: x + hp.gamma * (m - h), clients.params, towards, public)
    new = ChocoState(clients._replace(params=params), public, metrics["loss"], sent.bits)
    return new, public


def memory_phases(sz: Sizes, hp: Any) -> list[Phase]:
    """The baseline's phases and the compressed gossip: the difference to the public copies,
    the operator's draws and output, the mixed public copies and the new models, ``[S, ...]``
    each (measured: a run at 10,000 logistic-regression nodes held about 4.7 models' worth
    of every slot beyond its state)."""
    return [*baseline(sz, hp), Phase("CHOCO gossip", 4 * sz.slots * sz.param, 0)]


def payload_bits(state: ChocoState, ctx: RoundContext, hp: ChocoHParams, value_bits: Any) -> Any:
    """A slot sends its compressed difference: the operator's bits (``Identity``: every
    parameter at ``value_bits``)."""
    if hp.compression == "none":
        return value_bits * params_per_slot(state.public)
    return float(compressor(hp, state.public).bits(state.public))


CHOCO = register(
    baseline_algorithm(
        name="choco",
        tune=("gamma", (0.2, 0.8)),
        hparams=ChocoHParams,
        init=_init,
        round=_round,
        records=state_records(bits="bits"),
        mixing_weights=lambda state, ctx, hp: mh_weights(ctx),
        memory_phases=memory_phases,
        payload_bits=payload_bits,
        description="CHOCO-SGD: gossip of compressed differences with public copies",
        family="decentralized",
        default=False,
    )
)
