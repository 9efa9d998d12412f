"""What a slot sends each listed neighbor in a round, in bits: the payload a round's cost
charges (`wireless.cost.round_cost`), declared by the method.

An `Algorithm` declares it as ``payload_bits(state, ctx, hp, value_bits) -> [] or [S]``
(``value_bits``: the config's ``bits_per_param``, a traced scalar). Without a declaration a
method sends every parameter of what its round sends (``sent_params``, else
``eval_params``) at ``value_bits`` bits each: one model for most methods, FedEM's ``M``
components. The declarations of the package's other methods are built from the helpers
here: Local sends nothing (`nothing_sent`), SCAFFOLD a model and a control variate, a
splitting method the part it shares (`part_bits`), CHOCO its compressed difference.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp


def params_per_slot(tree: Any) -> int:
    """The number of entries of one slot of ``tree [S, ...]`` (arrays or shape structs)."""
    return sum(math.prod(a.shape[1:]) for a in jax.tree.leaves(tree))


def sent_shapes(alg: Any, state: Any, ctx: Any, hp: Any) -> Any:
    """Shape structs `[S, ...]` of what a round of ``alg`` sends (``sent_params`` where the
    method declares it, else ``eval_params``): no computation, traceable."""
    sent = alg.eval_params if alg.sent_params is None else alg.sent_params
    return jax.eval_shape(lambda s: sent(s, ctx, hp), state)


def payload_of(alg: Any, state: Any, ctx: Any, hp: Any, value_bits: Any) -> jax.Array:
    """Bits ``[]`` or ``[S]`` each slot of ``alg`` sends a neighbor in a round (header
    excluded): its ``payload_bits`` declaration, or every parameter of what it sends at
    ``value_bits``."""
    if alg.payload_bits is not None:
        bits = alg.payload_bits(state, ctx, hp, value_bits)
    else:
        bits = value_bits * params_per_slot(sent_shapes(alg, state, ctx, hp))
    return jnp.asarray(bits, jnp.float32)


def nothing_sent(state: Any, ctx: Any, hp: Any, value_bits: Any) -> float:
    """The declaration of a method that sends nothing (its links carry no traffic)."""
    return 0.0


def part_bits(params: Any, keys: tuple[str, ...], value_bits: Any) -> Any:
    """Bits of the top-level subtrees ``keys`` of one slot of ``params [S, ...]``."""
    return value_bits * params_per_slot({k: params[k] for k in keys})
