"""Device profiles, local training time against FLOPs counted by hand, and the summaries
time-to-accuracy / energy-to-accuracy over curves."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pfedwn_jax.results.cost_curves import cumulative, first_reaching
from pfedwn_jax.wireless.compute import (
    DEVICE_PROFILES,
    compute_seconds,
    draw_devices,
    train_flops_per_sample,
)


def test_linear_model_training_flops_by_hand():
    # logits = x W + b, d = 300 inputs, c = 20 classes: the forward matmul is 2 d c FLOPs a
    # sample and the gradient of W another 2 d c (no gradient of the input): ~4 d c, plus
    # softmax and bias terms of order c
    d, c, batch = 300, 20, 8
    params = {"w": jnp.zeros((d, c)), "b": jnp.zeros((c,))}
    x, y = jnp.ones((batch, d)), jnp.zeros((batch,), jnp.int32)
    flops = train_flops_per_sample(lambda p, x: x @ p["w"] + p["b"], params, x, y)
    assert 4 * d * c <= flops <= 4 * d * c * 1.1


def test_compute_seconds_by_hand():
    t = compute_seconds(1e6, jnp.array([100, 50]), 2, jnp.array([1e9, 2e8]))
    np.testing.assert_allclose(t, [1e6 * 100 * 2 / 1e9, 1e6 * 50 * 2 / 2e8], rtol=1e-6)


def test_device_distributions():
    fixed = draw_devices(0, 4, "fixed", ["raspberry-pi-4"])
    np.testing.assert_allclose(fixed.flops_per_s, [DEVICE_PROFILES["raspberry-pi-4"][0]] * 4)
    np.testing.assert_allclose(fixed.power_w, [6.0] * 4)
    mix = draw_devices(1, 2000, "mix", ["smartphone", (1e9, 1.0)], weights=[3, 1])
    share = float(np.mean(np.asarray(mix.flops_per_s) == np.float32(1e9)))
    assert abs(share - 0.25) < 0.05
    assert set(np.asarray(mix.power_w).tolist()) == {3.0, 1.0}
    spread = draw_devices(2, 4000, "lognormal", [(1e9, 2.0)], sigma=0.5)
    logs = np.log(np.asarray(spread.flops_per_s) / 1e9)
    assert abs(logs.mean()) < 0.05 and abs(logs.std() - 0.5) < 0.05
    np.testing.assert_array_equal(spread.power_w, 2.0)
    again = draw_devices(2, 4000, "lognormal", [(1e9, 2.0)], sigma=0.5)
    np.testing.assert_array_equal(again.flops_per_s, spread.flops_per_s)  # seeded


def test_device_errors_name_the_value():
    with pytest.raises(ValueError, match="device distribution must be one of"):
        draw_devices(0, 3, "zipf")
    with pytest.raises(ValueError, match="device profile must be one of"):
        draw_devices(0, 3, "fixed", ["toaster"])
    with pytest.raises(ValueError, match="flops_per_s"):
        draw_devices(0, 3, "fixed", [(0.0, 1.0)])
    with pytest.raises(ValueError, match="weights must be 2"):
        draw_devices(0, 3, "mix", ["smartphone", "laptop"], weights=[1.0])


def test_first_reaching_by_hand():
    acc = np.array([[0.1, 0.5, 0.4, 0.8, 0.9], [0.2, 0.3, 0.3, 0.3, 0.3]])
    round_s = np.array([[1.0, 2.0, 1.0, 1.0, 1.0], [0.5] * 5])
    clock = cumulative(round_s)
    np.testing.assert_allclose(clock[0], [1, 3, 4, 5, 6])
    # absolute target 0.5: run 0 at its 2nd round (3 s); run 1 never
    np.testing.assert_allclose(first_reaching(acc, clock, 0.5), [3.0, np.nan])
    # 90% of the final value: 0.81 -> 0.9 at 6 s; 0.27 -> 0.3 at 1.0 s
    np.testing.assert_allclose(first_reaching(acc, clock, 0.9, relative=True), [6.0, 1.0])
    energy = cumulative(np.ones((2, 5)) * 2.0)  # joules
    np.testing.assert_allclose(first_reaching(acc, energy, 0.45), [4.0, np.nan])
    with pytest.raises(ValueError, match="one shape"):
        first_reaching(acc, clock[:, :3], 0.5)
    with pytest.raises(ValueError, match=r"relative target must be in \(0, 1\]"):
        first_reaching(acc, clock, 1.5, relative=True)
