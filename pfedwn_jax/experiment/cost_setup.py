"""A run's cost set-up on the host: the model's training FLOPs and payload, each slot's
device, into the `wireless.cost.CostSetup` the round's link draw uses (`Links.cost`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pfedwn_jax.engine.compression import Identity
from pfedwn_jax.models import Model
from pfedwn_jax.wireless.compute import Devices, train_flops_per_sample
from pfedwn_jax.wireless.cost import CostParams, CostSetup, make_cost_setup

#: The batch whose gradient XLA counts (per-sample FLOPs = its count / this).
FLOPS_BATCH = 8


def model_costs(model: Model, compressor: Any = None) -> tuple[float, int]:
    """`(training FLOPs a sample, bits of one model sent)` of ``model``: XLA's count of its
    gradient (`wireless.compute.train_flops_per_sample`, shapes only, nothing initialised)
    and ``compressor.bits`` (``engine.compression``; default ``Identity()``: 32 bits a
    parameter)."""
    params = jax.eval_shape(model.init, jax.random.key(0))
    x = jax.ShapeDtypeStruct((FLOPS_BATCH, *model.input_shape), jnp.dtype(model.input_dtype))
    y = jax.ShapeDtypeStruct((FLOPS_BATCH,), jnp.int32)
    flops = train_flops_per_sample(model.apply, params, x, y)
    one_slot = jax.tree.map(lambda p: jax.ShapeDtypeStruct((1, *p.shape), p.dtype), params)
    return flops, int((compressor or Identity()).bits(one_slot))


def build_cost_setup(
    model: Model,
    params: CostParams,
    devices: Devices,
    samples: Any,
    epochs: int,
    compressor: Any = None,
) -> CostSetup:
    """The `CostSetup` of a run: ``model``'s FLOPs and payload (`model_costs`), each slot's
    ``devices`` and the ``samples [S]`` it trains on for ``epochs`` epochs a round."""
    flops, bits = model_costs(model, compressor)
    return make_cost_setup(params, bits, devices, flops, samples, epochs)
