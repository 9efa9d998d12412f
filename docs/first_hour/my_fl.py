"""A new user's own code: a model, an FL algorithm and a dataset in memory, in one module.

`pfedwn --import docs/first_hour/my_fl.py run ...` imports it before the flags are checked, so
`--model link_mlp`, `--algorithms uniform_mix` and `--dataset links` name what it registers;
a Python script imports it for the same names (`docs/first_hour.py` does both).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import pfedwn_jax
import pfedwn_jax.algorithms as fl
from pfedwn_jax.data import registered_datasets
from pfedwn_jax.engine import mix_sparse
from pfedwn_jax.models import available_models


# --------------------------------------------------------------------------- the model
class LinkMLP(nnx.Module):
    """Features -> 32 ReLU units -> logits: a flax NNX module of parameters only (no
    BatchNorm: its statistics would be averaged as if they were weights; use LayerNorm)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(math.prod(input_shape), 32, rngs=rngs)
        self.out = nnx.Linear(32, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        z = x.reshape(x.shape[0], -1).astype(jnp.float32)
        return self.out(jax.nn.relu(self.hidden(z)))


# --------------------------------------------------------------------------- the algorithm
@fl.hparams
class UniformMixHParams:
    """self_weight: share of a slot's own model after mixing, in [0, 1]."""

    self_weight: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.self_weight <= 1.0:
            raise ValueError(f"uniform_mix.self_weight must be in [0, 1]; got {self.self_weight}")


def uniform_mix_round(state, key, ctx, hp):
    """Train locally, then keep `self_weight` of the own model and spread the rest uniformly
    over the models received from the selected neighbors."""
    clients, metrics = fl.local_update(ctx, state.clients, key)
    own = jnp.zeros(ctx.neighbors.shape).at[:, 0].set(1.0)  # column 0: the slot itself
    others = ctx.neighbor_mask.at[:, 0].set(False)
    uniform = fl.group_average_weights(ctx.neighbors, others, jnp.ones(ctx.num_slots))
    weights = hp.self_weight * own + (1.0 - hp.self_weight) * uniform
    pool, index = fl.neighbor_models(clients.params, ctx)
    sent = clients.params
    clients = clients._replace(params=mix_sparse(pool, index, weights))
    return fl.BaselineState(clients, metrics["loss"]), sent


UNIFORM_MIX = fl.Algorithm(
    name="uniform_mix",
    hparams=UniformMixHParams,
    init=fl.init_baseline,
    round=uniform_mix_round,
    eval_params=fl.eval_own,
    records=fl.train_loss_record,
    description="local training, then a uniform mix over the received models",
)


# --------------------------------------------------------------------------- the data
def link_features(n: int = 600, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Channel-state features of `n` links (real and imaginary gains of 4 subchannels, float
    `[n, 8]`) and the strongest subchannel as the label (4 classes). Seeded: every process
    that imports this module holds the same arrays (what `load_models` checks)."""
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(n, 4)) + 1j * rng.normal(size=(n, 4))
    return np.concatenate([h.real, h.imag], axis=1), np.argmax(np.abs(h), axis=1)


# registered once per process, however often the module is imported
if "link_mlp" not in available_models():
    pfedwn_jax.register_model("link_mlp", LinkMLP)
if "uniform_mix" not in fl.available_algorithms():
    pfedwn_jax.register_algorithm(UNIFORM_MIX)
if "links" not in registered_datasets():
    X, Y = link_features()
    pfedwn_jax.register_dataset("links", X[:450], Y[:450], X[450:], Y[450:])
