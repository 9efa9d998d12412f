"""The default accelerator gives the CPU's numbers: local training, evaluation, P_err, and a
whole sweep of every method.

Marked `gpu`: run by `make test-gpu`; skipped (with the reason) where JAX's default backend is
the CPU (`tests/conftest.py`). Float32 matmuls run at full precision on both sides (no TF32),
so only summation order and transcendental functions differ between the two.
"""

from __future__ import annotations

import chex
import jax
import numpy as np
import optax
import pytest
from helpers import VARIED_RUN, B, make_data
from jax.sharding import Mesh

import pfedwn_jax
from pfedwn_jax.algorithms import available_algorithms
from pfedwn_jax.engine import evaluate, init_client_state, local_train
from pfedwn_jax.wireless import MOMENT_MODES, ChannelParams, error_probability
from pfedwn_jax.wireless.fading import Fading

pytestmark = pytest.mark.gpu


def on_device(device, fn, *args):
    """`fn(*args)` with every array argument committed to `device`, on one shard, in float32
    at full matmul precision; the result as host NumPy arrays."""
    args = jax.device_put(args, device)
    with jax.default_device(device), jax.default_matmul_precision("highest"):
        out = fn(*args)
    return jax.tree.map(np.asarray, out)


def accelerator_and_cpu():
    return jax.devices()[0], jax.devices("cpu")[0]


def test_local_train_and_evaluate_on_the_accelerator_equal_the_cpu(toy_model):
    opt = optax.sgd(0.1, momentum=0.9)
    data = make_data(pad_seed=7)
    dc = np.array([0, 1, 2, 3, 4, 0])
    state = init_client_state(toy_model, opt, jax.random.key(0), len(dc), same_init=False)

    def train_and_eval(state, data, key):
        new, metrics = local_train(
            toy_model, opt, state, data, dc, key, batch_size=B, epochs=3, shards=1
        )
        return new, metrics, evaluate(toy_model, new.params, data, dc)

    accel, cpu = accelerator_and_cpu()
    got = on_device(accel, train_and_eval, state, data, jax.random.key(1))
    want = on_device(cpu, train_and_eval, state, data, jax.random.key(1))
    chex.assert_trees_all_equal(got[1]["steps"], want[1]["steps"])
    chex.assert_trees_all_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "moments, fading",
    [(m, Fading.of()) for m in MOMENT_MODES]
    + [("paper", Fading.of("nakagami", 2.0)), ("paper", Fading.of("rician", 4.0))],
)
def test_error_probability_on_the_accelerator_equals_the_cpu(moments, fading):
    rng = np.random.default_rng(0)
    targets = rng.uniform(0, 50, (8, 2)).astype(np.float32)
    neighbors = rng.uniform(0, 50, (8, 30, 2)).astype(np.float32)
    gamma_th = np.float32(5.0)
    params = ChannelParams(num_subchannels=10, fading=fading)

    def perr(t, nb, g):
        return jax.vmap(lambda ti, nbi: error_probability(ti, nbi, g, params, moments))(t, nb)

    accel, cpu = accelerator_and_cpu()
    got = on_device(accel, perr, targets, neighbors, gamma_th)
    want = on_device(cpu, perr, targets, neighbors, gamma_th)
    assert np.ptp(want) > 0.05  # a spread of values, not all 0 or 1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6)


def test_a_sweep_of_every_method_on_the_accelerator_equals_the_cpu():
    """The runner's whole program (set-up, blocks of rounds, records) on one accelerator
    device and on one CPU device: the same table up to float32 rounding."""
    config = pfedwn_jax.ExperimentConfig(
        **{**VARIED_RUN, "rounds": 3},
        algorithms=available_algorithms(),
    )

    def on(device):
        mesh = Mesh(np.array([device]).reshape(1, 1), ("runs", "slots"))
        with jax.default_matmul_precision("highest"):
            out = pfedwn_jax.sweep(config, seeds=[0, 3], mesh=mesh, progress=False)
        return out.rows

    accel, cpu = accelerator_and_cpu()
    got, want = on(accel), on(cpu)
    np.testing.assert_array_equal(got["method"], want["method"])
    np.testing.assert_allclose(got["target_loss"], want["target_loss"], rtol=1e-3, atol=1e-5)
    # accuracy moves in steps of one test sample; allow one sample's flip in the target's set
    np.testing.assert_allclose(got["target_accuracy"], want["target_accuracy"], atol=0.05)
