"""Stale links (`stale=True`): a failed link hands over the last model received over it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY_RUN, link_round_context

import pfedwn_jax
from pfedwn_jax import ExperimentConfig
from pfedwn_jax.algorithms import RoundContext, neighbor_lists
from pfedwn_jax.algorithms.common import (
    group_average_weights,
    neighbor_distances,
    neighbor_models,
)
from pfedwn_jax.engine import mix_sparse
from pfedwn_jax.experiment.link_setup import Links
from pfedwn_jax.runner.links import begin_round, end_round, init_track
from pfedwn_jax.wireless import ChannelParams

BASE = {**TINY_RUN, "rounds": 2}


def _run(**kw):
    return pfedwn_jax.run(ExperimentConfig(**{**BASE, **kw}), progress=False)


@pytest.mark.parametrize(
    "methods", [("fedavg",), pytest.param(("fedamp", "pfedwn"), marks=pytest.mark.slow)]
)
def test_with_every_link_delivering_stale_equals_not_stale(methods):
    fresh = _run(algorithms=methods, link_model="bernoulli", link_failure=0.0)
    stale = _run(algorithms=methods, link_model="bernoulli", link_failure=0.0, stale=True)
    for m in methods:
        assert stale.methods[m]["client_accuracy"] == fresh.methods[m]["client_accuracy"], m
        assert stale.methods[m]["client_loss"] == fresh.methods[m]["client_loss"], m
    ages = np.asarray(stale.methods[methods[0]]["records"]["link_age"])
    assert ages.shape[0] == 2 and (ages == 0).all()


def test_neighbor_distances_over_a_stale_pool():
    rng = np.random.default_rng(0)
    params = {"a": jnp.asarray(rng.normal(size=(3, 2, 2))), "b": jnp.asarray(rng.normal(size=(3,)))}
    pool = {k: jnp.concatenate([v, v[::-1] + 1.0]) for k, v in params.items()}
    index = jnp.asarray([[0, 4, 2], [1, 0, 5], [2, 3, 1]], jnp.int32)
    flat = lambda t, i: np.concatenate([np.ravel(t["a"][i]), np.ravel(t["b"][i])])
    want = [
        [np.sum((flat(params, s) - flat(pool, int(j))) ** 2) for j in row]
        for s, row in enumerate(index)
    ]
    got = neighbor_distances(params, pool, index)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)


@pytest.mark.slow
def test_a_link_that_never_delivered_stays_dropped():
    """Every link fails from round 0: no copy exists, so pFedWN and FedAvg are Local."""
    methods = ("local", "fedavg", "pfedwn")
    dead = _run(algorithms=methods, link_model="bernoulli", link_failure=1.0, stale=True)
    local = dead.methods["local"]["client_accuracy"]
    assert dead.methods["pfedwn"]["client_accuracy"] == local
    assert dead.methods["fedavg"]["client_accuracy"] == local
    ages = np.asarray(dead.methods["fedavg"]["records"]["link_age"])  # [rounds, S, K]
    assert (ages[:, :, 0] == 0).all() and (ages[0, :, 1:] == 1).all()
    assert (ages[1, :, 1:] == 2).all()


# ------------------------------------------------------------------ the runner's halves, by hand
S, ROUNDS = 3, 5


def _context(perr: np.ndarray) -> RoundContext:
    """Three slots, fully connected; links fail with probability `perr [S, K]` (0 or 1)."""
    links = Links(
        perr=jnp.asarray(perr, jnp.float32),
        positions=jnp.zeros((S, 2), jnp.float32),
        active=jnp.ones((S,), bool),
        gamma_th=jnp.float32(1.0),
        failure=None,
        params=ChannelParams(),
        model="bernoulli",
        stale=True,
    )
    return link_round_context(links, num_samples=[1.0, 2.0, 3.0])


def _toy_round(params, ctx, r):
    """FedAvg's averaging of what arrived, then a deterministic 'training' step."""
    weights = group_average_weights(ctx.neighbors, ctx.neighbor_mask, ctx.num_samples)
    pool, index = neighbor_models(params, ctx)
    mixed = mix_sparse(pool, index, weights)
    return {"w": mixed["w"] * 0.5 + (jnp.arange(S)[:, None] + 1.0) * (r + 1)}


def test_a_link_failing_after_round_0_mixes_the_round_0_model_and_ages_count():
    """Link 1 -> 0 delivers in round 0 and fails ever after: slot 0 keeps mixing slot 1's
    round-0 model; checked against a plain NumPy loop (cache per link, ages)."""
    nbr, _ = neighbor_lists(np.ones((S, S), bool))
    ok = np.zeros((S, S))
    bad = ok.copy()
    bad[0, 1] = 1.0  # row 0, column 1: slot 1 -> slot 0
    params = {"w": jnp.asarray(np.arange(S * 2, dtype=np.float32).reshape(S, 2))}
    ctx0 = _context(ok)
    track = init_track(jax.random.PRNGKey(0), ctx0, params)
    # NumPy reference
    w = np.asarray(params["w"], np.float64)
    cache = np.zeros((S, S, 2))
    seen = np.zeros((S, S), bool)
    age = np.zeros((S, S), int)
    counts = np.array([1.0, 2.0, 3.0])
    for r in range(ROUNDS):
        ctx = _context(ok if r == 0 else bad)
        key = jax.random.PRNGKey(r)
        rctx, _, drawn = begin_round(ctx, track, key)
        sent = params
        params = _toy_round(params, rctx, r)
        track, rec = end_round(rctx, track, drawn, sent, key)
        got = np.ones((S, S), bool)
        if r > 0:
            got[0, 1] = False
        new = np.zeros_like(w)
        for s in range(S):
            models = [w[nbr[s, k]] if got[s, k] else cache[s, k] for k in range(S)]
            use = [got[s, k] or seen[s, k] for k in range(S)]
            wts = np.array([counts[nbr[s, k]] * use[k] for k in range(S)])
            new[s] = sum(wts[k] / wts.sum() * models[k] for k in range(S))
        for s in range(S):
            for k in range(S):
                if got[s, k]:
                    cache[s, k], seen[s, k], age[s, k] = w[nbr[s, k]], True, 0
                else:
                    age[s, k] += 1
        w = new * 0.5 + (np.arange(S)[:, None] + 1.0) * (r + 1)
        np.testing.assert_allclose(np.asarray(params["w"]), w, rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(rec["link_age"]), age)
    np.testing.assert_array_equal(np.asarray(drawn.received), ~(bad > 0))
    # the cached copy of link 1 -> 0 is slot 1's model as sent in round 0 (the initial one)
    np.testing.assert_array_equal(np.asarray(track.cache["w"][0, 1]), [2.0, 3.0])
    assert age[0, 1] == ROUNDS - 1


def test_stale_needs_a_lossy_link_model_and_the_runner():
    with pytest.raises(ValueError, match="stale"):
        ExperimentConfig(stale=True)
    with pytest.raises(ValueError, match="stale"):
        ExperimentConfig(link_model="bernoulli", stale="yes")


@pytest.mark.parametrize(
    "kw", [dict(link_model="bernoulli", stale=True), dict(mobility="gaussian")]
)
def test_sweeps_take_stale_links_and_mobility(kw):
    config = ExperimentConfig(**{**BASE, "rounds": 1}, algorithms=("fedavg",), **kw)
    result = pfedwn_jax.sweep(config, seeds=[0, 1], progress=False)
    assert result.num_runs == 2 and np.all(np.isfinite(result.rows["target_accuracy"]))
