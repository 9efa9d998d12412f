"""Compression of what a slot sends: the identity, b-bit stochastic quantization and top-k
sparsification with error feedback, each on a stacked pytree (every leaf `[S, ...]`).

One operator is a small ``flax.struct`` dataclass whose fields change shapes or bit counts, so
they are static (part of the compiled program). Every operator has the same three methods:

- ``init(tree) -> state``: its carried state (``()`` when it has none; top-k's error memory).
- ``apply(tree, state, key) -> Compressed(received, bits, state)``: what each slot's receivers
  get (a pytree like ``tree``), the bits each slot sends (`[S]` float32) and the new state.
- ``bits(tree) -> int``: the bits one slot sends for a tree of this shape (shapes only; the
  same number ``apply`` returns for every slot).

All are pure, jittable and vmappable (over runs: the operator carries no traced leaves).

- ``Identity``: sends every parameter at ``value_bits`` bits; exact.
- ``Quantize``: QSGD (Alistarh et al., 2017), one bucket per leaf and slot: with
  ``s = 2**(bits - 1) - 1`` levels, coordinate `v_i` is sent as
  ``||v|| sign(v_i) l_i / s`` with `l_i` the floor or ceiling of ``s |v_i| / ||v||``, rounded up
  with probability equal to the remainder. Unbiased, ``E Q(v) = v``, with variance
  ``E ||Q(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2`` for a bucket of `d` coordinates
  (QSGD Lemma 3.1). Cost: ``bits`` per coordinate (sign and level) plus ``norm_bits`` per bucket.
- ``TopK``: top-k with error feedback (Stich et al., 2018): the slot adds its error memory to
  the tree, sends the `k` entries of largest magnitude of that sum (over all leaves together)
  and keeps the rest as its new memory, so nothing is lost, only delayed
  (``error_feedback=False``: plain top-k of the input, no memory). Cost per slot:
  ``k (value_bits + ceil(log2 D))``, an index of ``ceil(log2 D)`` bits for each of the `k`
  values of a `D`-parameter model.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_int
from pfedwn_jax.engine.tree import flatten_slots

PyTree = Any


class Compressed(NamedTuple):
    """What one application of an operator gives: ``received`` (pytree like the input, leaves
    `[S, ...]`), ``bits`` (`[S]` float32: the bits each slot sends) and the operator's new
    ``state``."""

    received: PyTree
    bits: jax.Array
    state: Any


def _slot_sizes(tree: PyTree) -> tuple[int, list[int]]:
    """The slot count `S` and each leaf's per-slot size (elements after the leading axis)."""
    leaves = jax.tree.leaves(tree)
    if not leaves or any(jnp.ndim(x) < 1 for x in leaves):
        raise ValueError("tree must be a pytree of arrays with a leading slot axis [S, ...]")
    num_slots = int(jnp.shape(leaves[0])[0])
    if any(int(jnp.shape(x)[0]) != num_slots for x in leaves):
        raise ValueError(f"every leaf needs the same leading slot axis; got {_shapes(leaves)}")
    return num_slots, [math.prod(jnp.shape(x)[1:]) for x in leaves]


def _shapes(leaves: list[Any]) -> list[tuple[int, ...]]:
    return [tuple(jnp.shape(x)) for x in leaves]


def _per_slot(tree: PyTree, bits: int) -> jax.Array:
    """``bits`` as the `[S]` float32 vector ``apply`` returns."""
    return jnp.full((_slot_sizes(tree)[0],), float(bits), jnp.float32)


@flax.struct.dataclass
class Identity:
    """Sends the tree as it is, ``value_bits`` bits per parameter (32: float32)."""

    value_bits: int = flax.struct.field(pytree_node=False, default=32)

    def init(self, tree: PyTree) -> tuple[()]:
        del tree
        return ()

    def bits(self, tree: PyTree) -> int:
        return check_int("value_bits", self.value_bits, 1) * sum(_slot_sizes(tree)[1])

    def apply(self, tree: PyTree, state: Any, key: jax.Array) -> Compressed:
        del key
        return Compressed(tree, _per_slot(tree, self.bits(tree)), state)


def _quantize_leaf(x: jax.Array, u: jax.Array, levels: int) -> jax.Array:
    """QSGD on each slot's row of ``x`` (`[S, ...]`), with uniforms ``u`` of the same shape."""
    flat = x.reshape(x.shape[0], -1).astype(jnp.float32)
    norm = jnp.linalg.norm(flat, axis=1, keepdims=True)
    scaled = jnp.abs(flat) * levels / jnp.where(norm > 0, norm, 1.0)
    low = jnp.floor(scaled)
    level = low + (u.reshape(flat.shape) < scaled - low)
    out = norm * jnp.sign(flat) * level / levels
    return out.reshape(x.shape).astype(x.dtype)


@flax.struct.dataclass
class Quantize:
    """QSGD b-bit stochastic quantization (``bits >= 2``: one sign bit, ``bits - 1`` bits of
    level, ``s = 2**(bits - 1) - 1`` levels), one bucket and one ``norm_bits`` norm per leaf."""

    bits_per_value: int = flax.struct.field(pytree_node=False, default=8)
    norm_bits: int = flax.struct.field(pytree_node=False, default=32)

    @property
    def levels(self) -> int:
        return 2 ** (check_int("bits_per_value", self.bits_per_value, 2, 32) - 1) - 1

    def init(self, tree: PyTree) -> tuple[()]:
        del tree
        return ()

    def bits(self, tree: PyTree) -> int:
        sizes = _slot_sizes(tree)[1]
        _ = self.levels  # validates bits_per_value
        norm_bits = check_int("norm_bits", self.norm_bits, 0)
        return self.bits_per_value * sum(sizes) + norm_bits * len(sizes)

    def apply(self, tree: PyTree, state: Any, key: jax.Array) -> Compressed:
        leaves, treedef = jax.tree.flatten(tree)
        keys = jax.random.split(key, len(leaves))
        out = [
            _quantize_leaf(x, jax.random.uniform(k, x.shape), self.levels)
            for x, k in zip(leaves, keys, strict=True)
        ]
        return Compressed(jax.tree.unflatten(treedef, out), _per_slot(tree, self.bits(tree)), state)


def _unflatten_slots(flat: jax.Array, like: PyTree) -> PyTree:
    """The inverse of ``flatten_slots``: `[S, D]` back to the leaves and dtypes of ``like``."""
    leaves, treedef = jax.tree.flatten(like)
    splits, offset = [], 0
    for x in leaves:
        size = math.prod(x.shape[1:])
        splits.append(flat[:, offset : offset + size].reshape(x.shape).astype(x.dtype))
        offset += size
    return jax.tree.unflatten(treedef, splits)


@flax.struct.dataclass
class TopK:
    """Top-k with error feedback: sends ``k`` values per slot (over all its parameters),
    ``value_bits`` bits each plus a ``ceil(log2 D)``-bit index; state: the error memory.
    ``error_feedback=False``: plain top-k of the input, no memory (state ``()``), for a
    method that keeps its own (CHOCO-SGD's public copies)."""

    k: int = flax.struct.field(pytree_node=False, default=1)
    value_bits: int = flax.struct.field(pytree_node=False, default=32)
    error_feedback: bool = flax.struct.field(pytree_node=False, default=True)

    def _k(self, tree: PyTree) -> int:
        total = sum(_slot_sizes(tree)[1])
        return check_int("k", self.k, 1, total)

    def init(self, tree: PyTree) -> PyTree:
        return jax.tree.map(jnp.zeros_like, tree) if self.error_feedback else ()

    def bits(self, tree: PyTree) -> int:
        total = sum(_slot_sizes(tree)[1])
        index_bits = math.ceil(math.log2(total))
        return self._k(tree) * (check_int("value_bits", self.value_bits, 1) + index_bits)

    def apply(self, tree: PyTree, state: PyTree, key: jax.Array) -> Compressed:
        del key
        carried = jax.tree.map(jnp.add, tree, state) if self.error_feedback else tree
        flat = flatten_slots(carried).astype(jnp.float32)
        _, idx = jax.lax.top_k(jnp.abs(flat), self._k(tree))
        rows = jnp.arange(flat.shape[0])[:, None]
        sent = jnp.zeros_like(flat).at[rows, idx].set(flat[rows, idx])
        received = _unflatten_slots(sent, tree)
        error = _unflatten_slots(flat - sent, state) if self.error_feedback else state
        return Compressed(received, _per_slot(tree, self.bits(tree)), error)


Compressor = Identity | Quantize | TopK

#: The operators by name (what a config names).
COMPRESSORS: dict[str, type] = {"none": Identity, "qsgd": Quantize, "topk": TopK}


def make_compressor(name: str, **fields: Any) -> Compressor:
    """The operator called ``name`` (``"none"``, ``"qsgd"`` or ``"topk"``) with ``fields``."""
    if name not in COMPRESSORS:
        raise ValueError(f"compression must be one of {sorted(COMPRESSORS)}; got {name!r}")
    return COMPRESSORS[name](**fields)
