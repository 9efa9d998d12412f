"""The cost model inside the round's link draw: a straggler is dropped as a failed link (its
stale copy used with `stale`), retries recover failed first attempts, and the round's cost
comes out as records."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import link_round_context

from pfedwn_jax.engine.compression import TopK
from pfedwn_jax.experiment.cost_setup import build_cost_setup, model_costs
from pfedwn_jax.experiment.link_setup import Links
from pfedwn_jax.models import get_model
from pfedwn_jax.runner.links import begin_round, end_round, init_track
from pfedwn_jax.wireless import ChannelParams
from pfedwn_jax.wireless.compute import Devices
from pfedwn_jax.wireless.cost import CostParams, CostSetup

S = 3
# slot 2 trains for 100 ms, the others for 1 ms; a model is 1000 bits
SETUP = CostSetup(
    CostParams(), jnp.float32(1000.0), jnp.array([0.001, 0.001, 0.1]), jnp.full((S,), 2.0)
)


def _context(deadline: float, stale: bool, failure: float = 0.0, retries: int = 0):
    setup = SETUP.replace(params=CostParams(deadline_s=deadline, retries=retries))
    links = Links(
        perr=jnp.zeros((S, S), jnp.float32),
        positions=jnp.zeros((S, 2), jnp.float32),
        active=jnp.ones((S,), bool),
        gamma_th=jnp.float32(1.0),
        failure=jnp.float32(failure),
        params=ChannelParams(),
        model="bernoulli",
        stale=stale,
        cost=setup,
    )
    return link_round_context(links)


def test_the_rounds_cost_comes_out_as_records():
    ctx, records, drawn = begin_round(_context(math.inf, False), None, jax.random.key(0))
    rate = 100e6 / 14 * math.log2(1 + 1.0)  # the threshold rate on a sub-channel
    np.testing.assert_allclose(records["bits_sent"], [2000.0] * S)  # to two others, once
    np.testing.assert_allclose(records["airtime_s"], [2000.0 / rate] * S, rtol=1e-5)
    np.testing.assert_allclose(records["round_s"], 0.1 + 1000.0 / rate, rtol=1e-5)
    assert bool(ctx.neighbor_mask.all()) and bool(drawn.received.all())


@pytest.mark.parametrize("stale", [False, True])
def test_a_straggler_is_dropped_as_a_failed_link(stale):
    """Round 0 without a deadline (everything arrives), then a 50 ms deadline: slot 2's
    model (ready at 100 ms) is dropped; with `stale` its round-0 copy is used instead."""
    params = {"w": jnp.arange(S * 2, dtype=jnp.float32).reshape(S, 2)}
    ctx0 = _context(math.inf, stale)
    track = init_track(jax.random.key(0), ctx0, params) if stale else None
    for r, deadline in enumerate([math.inf, 0.05]):
        ctx, records, drawn = begin_round(_context(deadline, stale), track, jax.random.key(r))
        if stale:
            track, _ = end_round(ctx, track, drawn, params, jax.random.key(r))
    late = np.zeros((S, S), bool)
    late[0, 2] = late[1, 2] = True  # column 2 of rows 0, 1 lists slot 2 (neighbor_lists)
    assert np.asarray(ctx.neighbors)[0, 2] == 2 and np.asarray(ctx.neighbors)[1, 2] == 2
    np.testing.assert_array_equal(records["link_straggler"], late)
    np.testing.assert_array_equal(drawn.received, ~late)
    np.testing.assert_allclose(records["round_s"], 0.1, rtol=1e-6)  # slot 2's own training
    if stale:  # kept, its model taken from the cache (row S + s K + k of concat(params, cache))
        np.testing.assert_array_equal(ctx.neighbor_mask, np.ones((S, S), bool))
        assert int(ctx.links.source[0, 2]) == S + 0 * S + 2
    else:
        np.testing.assert_array_equal(ctx.neighbor_mask, ~late)


def test_retries_recover_failing_first_attempts():
    # every attempt fails with probability 0.5: one attempt delivers about half the links,
    # four attempts about 1 - 0.5^4 of them
    keys = jax.random.split(jax.random.key(1), 400)
    draw = lambda ctx, k: begin_round(ctx, None, k)[0].neighbor_mask[:, 1:]
    run = jax.jit(jax.vmap(draw, in_axes=(None, 0)))  # retries a leaf: one program

    def delivered(retries):
        ctx = _context(math.inf, False, failure=0.5, retries=retries)
        return float(np.asarray(run(ctx, keys)).mean())

    assert abs(delivered(0) - 0.5) < 0.05
    assert abs(delivered(3) - (1 - 0.5**4)) < 0.03


def test_a_runs_cost_setup_from_its_model_and_devices():
    model = get_model("logreg", 10, (28, 28, 1))  # 784 x 10 weights + 10 biases
    flops, bits = model_costs(model)
    assert 4 * 7840 <= flops <= 4 * 7840 * 1.1  # forward and weight gradient: 4 d c a sample
    assert bits == 7850 * 32
    assert model_costs(model, TopK(k=100))[1] == 100 * (32 + 13)  # ceil(log2 7850) = 13
    devices = Devices(jnp.array([1e9, 2e9]), jnp.array([3.0, 5.0]))
    setup = build_cost_setup(model, CostParams(), devices, jnp.array([100, 300]), 2)
    np.testing.assert_allclose(setup.compute_s, [flops * 200 / 1e9, flops * 600 / 2e9], rtol=1e-5)
    np.testing.assert_allclose(setup.payload_bits, bits)
    np.testing.assert_allclose(setup.compute_w, [3.0, 5.0])
