"""A run's cost set-up on the host: the model's training FLOPs and payload, each slot's
device, into the `wireless.cost.CostSetup` the round's link draw uses (`Links.cost`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax.engine.compression import Identity
from pfedwn_jax.experiment.cost_config import cost_params
from pfedwn_jax.models import Model
from pfedwn_jax.wireless.compute import Devices, draw_devices, train_flops_per_sample
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
    value_bits: int = 32,
) -> CostSetup:
    """The `CostSetup` of a run: ``model``'s FLOPs and payload (`model_costs`), each slot's
    ``devices`` and the ``samples [S]`` it trains on for ``epochs`` epochs a round; a method
    sends its parameters at ``value_bits`` bits (the runner sizes its payload from them)."""
    flops, bits = model_costs(model, compressor)
    return make_cost_setup(params, bits, devices, flops, samples, epochs, value_bits)


def config_cost_setup(config: Any, model: Model, samples: Any, batch_size: int) -> CostSetup:
    """The `CostSetup` of config ``config`` (`ExperimentConfig` with ``cost`` on): its
    `CostParams`, ``bits_per_param`` bits a parameter, each of the ``samples [S]`` slots'
    device drawn from the topology seed, trained for ``local_epochs`` epochs (or
    ``local_steps`` steps of ``batch_size``: that many samples, once)."""
    samples = np.asarray(samples, np.float64)
    devices = draw_devices(
        config.topology_seed,
        len(samples),
        config.device_distribution,
        config.device_profiles,
    )
    epochs = config.local_epochs
    if config.local_steps is not None:
        samples, epochs = np.full_like(samples, config.local_steps * batch_size), 1
    bits = config.bits_per_param
    return build_cost_setup(
        model, cost_params(config), devices, samples, epochs, Identity(value_bits=bits), bits
    )
