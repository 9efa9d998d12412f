"""A user's own module, as `pfedwn --import user_plugin` imports it (tests/test_cli_import.py).

It registers one of each kind at import time: a model, an algorithm and a dataset in memory.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import pfedwn_jax
from pfedwn_jax.algorithms import available_algorithms, get_algorithm
from pfedwn_jax.data import registered_datasets
from pfedwn_jax.models import available_models


class TinyNet(nnx.Module):
    """Flattened input -> 16 ReLU units -> logits (uint8 pixels scaled, features as given)."""

    def __init__(self, input_shape, num_classes, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(math.prod(input_shape), 16, rngs=rngs)
        self.out = nnx.Linear(16, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        z = x.astype(jnp.float32).reshape(x.shape[0], -1)
        z = z / 255.0 if x.dtype == jnp.uint8 else z
        return self.out(jax.nn.relu(self.hidden(z)))


def _features(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Channel-state-like features [n, 6] and the index of the strongest of 3 gains."""
    x = np.random.default_rng(seed).normal(size=(n, 6))
    return x, np.argmax(x[:, 0::2] ** 2 + x[:, 1::2] ** 2, axis=1)


# registered once per process, however often the module is imported or reloaded
if "user_tiny" not in available_models():
    pfedwn_jax.register_model("user_tiny", TinyNet)
if "user_fedavg" not in available_algorithms():
    pfedwn_jax.register_algorithm(
        get_algorithm("fedavg")._replace(name="user_fedavg", description="FedAvg, renamed")
    )
if "user_csi" not in registered_datasets():
    X, Y = _features()
    pfedwn_jax.register_dataset("user_csi", X[:300], Y[:300], X[300:], Y[300:])
