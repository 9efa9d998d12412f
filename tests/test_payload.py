"""What each method sends a listed neighbor in a round (`algorithms.payload`), the bits a
round's cost charges, counted by hand on the tiny run's MLP (body ``fc1``, ``fc2``, head
``out``) at a bits-per-parameter other than 32."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY_RUN, registry_params

from pfedwn_jax import ExperimentConfig
from pfedwn_jax.algorithms import get_algorithm, make_hparams
from pfedwn_jax.algorithms.payload import payload_of
from pfedwn_jax.experiment.setup import setup

VB = 16  # bits a parameter


@functools.cache
def _ctx():
    return jax.device_put(setup(ExperimentConfig(**{**TINY_RUN, "model": "mlp"})).ctx)


def _sizes() -> dict[str, int]:
    params = _ctx().model.init(jax.random.key(0))
    return {k: sum(a.size for a in jax.tree.leaves(v)) for k, v in params.items()}


def _payload(name: str, **overrides):
    """`(state, hp, bits)`: ``name`` initialised on the tiny context and its payload."""
    ctx, alg = _ctx(), get_algorithm(name)
    hp = make_hparams(alg, overrides)
    state = alg.init(jax.random.key(0), ctx, hp)
    return state, hp, np.asarray(payload_of(alg, state, ctx, hp, jnp.float32(VB)))


def test_the_sizes_are_what_the_checks_below_assume():
    sizes = _sizes()
    assert set(sizes) == {"fc1", "fc2", "out"} and min(sizes.values()) > 0


@pytest.mark.parametrize(
    ("name", "models"), [("pfedwn", 1), ("fedavg", 1), ("scaffold", 2), ("local", 0)]
)
def test_a_method_sends_its_models_at_the_bits_per_parameter(name, models):
    """One model (the default), SCAFFOLD's model and control variate, Local nothing."""
    assert _payload(name)[2] == models * VB * sum(_sizes().values())


def test_fedem_sends_every_component():
    _, hp, bits = _payload("fedem")
    assert bits == hp.components * VB * sum(_sizes().values())


def test_push_sum_sends_a_model_and_its_weight():
    assert _payload("pushsum")[2] == VB * (sum(_sizes().values()) + 1)


@pytest.mark.parametrize(
    ("name", "part"), [("fedper", "body"), ("fedrep", "body"), ("lgfedavg", "head")]
)
def test_a_splitting_method_sends_the_part_it_shares(name, part):
    sizes = _sizes()
    want = sizes["out"] if part == "head" else sizes["fc1"] + sizes["fc2"]
    assert _payload(name)[2] == VB * want


def test_choco_sends_what_its_operator_counts():
    sizes, leaves = sum(_sizes().values()), 6  # three dense layers: kernel and bias each
    assert _payload("choco", compression="qsgd", bits=4)[2] == 4 * sizes + 32 * leaves
    k = round(0.1 * sizes)  # top-k: k values at 32 bits and a ceil(log2 D)-bit index each
    want = k * (32 + math.ceil(math.log2(sizes)))
    assert _payload("choco", compression="topk", fraction=0.1)[2] == want
    assert _payload("choco", compression="none")[2] == VB * sizes


def test_dispfl_sends_the_kept_entries_and_its_masks():
    state, _, bits = _payload("dispfl", density=0.5)
    masks = [np.asarray(m) for m in jax.tree.leaves(state.masks)]
    slots = masks[0].shape[0]
    kept = sum(m.reshape(slots, -1).sum(axis=1) for m in masks)
    bitmap = sum(m[0].size for m in masks if m.ndim >= 3)  # the kernels' masks
    np.testing.assert_array_equal(bits, VB * kept + bitmap)
    assert bits.shape == (slots,) and np.all(bits < VB * sum(_sizes().values()))


@pytest.mark.parametrize("name", registry_params())
def test_every_method_sends_something_but_local(name):
    bits = _payload(name)[2]
    assert np.all(np.isfinite(bits))
    assert np.all(bits == 0) if name == "local" else np.all(bits > 0)
