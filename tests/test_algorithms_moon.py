"""MOON against a plain per-client reference (full-batch gradient descent on the
model-contrastive objective, a Python loop over clients), its limit (mu = 0 is FedAvg), and
its runs in run/sweep, network mode and stale lossy links."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY_RUN
from pfl_refs import LR, assert_close, client_data, group_mean, init_list, make_ctx, run

import pfedwn_jax
from pfedwn_jax import ExperimentConfig
from pfedwn_jax.algorithms import get_algorithm, make_hparams
from pfedwn_jax.engine import per_sample_ce

ALL = ("fc1", "fc2", "out")


def moon_reference(ctx, rounds, mu, tau):
    model = ctx.model
    models = init_list(ctx)
    prev = list(models)
    for _ in range(rounds):
        trained = []
        for c in range(4):
            x, y = client_data(ctx, c)
            z_g, z_p = model.features(models[c], x), model.features(prev[c], x)

            def objective(p, x=x, y=y, z_g=z_g, z_p=z_p):
                z = model.features(p, x)
                cos = lambda a, b: (
                    jnp.sum(a * b, -1) / (jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1))
                )
                eg, ep = jnp.exp(cos(z, z_g) / tau), jnp.exp(cos(z, z_p) / tau)
                con = jnp.mean(-jnp.log(eg / (eg + ep)))
                return jnp.mean(per_sample_ce(model.classify(p, z), y)) + mu * con

            g = jax.grad(objective)(models[c])
            trained.append(jax.tree.map(lambda p, d: p - LR * d, models[c], g))
        prev = trained
        models = [group_mean(ctx, trained, i, ALL) for i in range(4)]
    return models, prev


def test_two_rounds_equal_the_per_client_reference():
    ctx = make_ctx()
    state, params = run("moon", ctx, 3, {"mu": 2.0, "tau": 0.5})
    models, prev = moon_reference(ctx, 3, 2.0, 0.5)
    assert_close(params, models)
    assert_close(state.prev, prev)
    _, fedavg = run("fedavg", ctx, 3)  # the contrastive term really changed the models
    assert (
        max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(fedavg)))
        > 1e-5
    )


def test_mu_0_is_fedavg_and_hyperparameters_are_checked():
    ctx = make_ctx()
    _, got = run("moon", ctx, 2, {"mu": 0.0})
    _, want = run("fedavg", ctx, 2)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match=r"hparams\.moon\.tau"):
        make_hparams(get_algorithm("moon"), {"tau": 0.0})


def test_run_sweep_network_and_stale_lossy_links():
    smoke = {**TINY_RUN, "model": "mlp", "rounds": 2, "algorithms": ("moon",)}
    lossy = dict(link_model="bernoulli", link_failure=0.3, stale=True)
    result = pfedwn_jax.run(ExperimentConfig(**smoke, mode="network", **lossy), progress=False)
    assert np.all(np.isfinite(result.methods["moon"]["client_accuracy"]))
    swept = pfedwn_jax.sweep(ExperimentConfig(**smoke), seeds=[0, 1], progress=False)
    assert np.all(np.isfinite(swept.rows["target_accuracy"]))
