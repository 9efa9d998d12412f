"""pFedWN's weights under lossy links, and with a barely trained neighbor, on real MNIST.

The case (`reproduce.lossy`): the target is 94% sevens and exactly one neighbor (1) holds
sevens in numbers; with ideal links the default EM gives it a weight above 0.8
(tests/test_pfedwn_similarity.py). The neighbor to watch is read off the data.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import VARIED_RUN, shared_data_file

import pfedwn_jax
from pfedwn_jax import ExperimentConfig
from pfedwn_jax.algorithms import get_algorithm, make_hparams
from pfedwn_jax.em import near_uniform
from pfedwn_jax.experiment.grid import expand, run_config
from pfedwn_jax.reproduce import lossy


def _data() -> str:
    return str(shared_data_file("mnist_10k_2k.npz"))


def test_the_case_has_exactly_one_similar_neighbor():
    main = max(lossy.CLIENTS[0], key=lossy.CLIENTS[0].get)
    holding = [k for k, spec in enumerate(lossy.CLIENTS[1:], 1) if spec.get(main, 0) >= 10]
    assert holding == [lossy.HOLDER]


@pytest.mark.parametrize("refresh", ["arrival", "schedule"])
def test_a_neighbor_missing_from_the_em_round_is_weighed_when_it_arrives(refresh):
    """Round 0 warms up, round 1 estimates pi without the similar neighbor (its packet
    lost), round 2 receives it: "arrival" re-estimates that row and weighs it; "schedule"
    (the estimate frozen as its round saw it) keeps it at 0."""
    ctx, _ = lossy.case_context(_data(), 0.5)
    alg = get_algorithm("pfedwn")
    hp = make_hparams(alg, {"refresh": refresh})
    step = jax.jit(lambda s, k, c: alg.round(s, k, c, hp)[0])
    full = np.asarray(ctx.neighbor_mask)
    lost = full.copy()
    lost[0, lossy.HOLDER] = False
    state = alg.init(jax.random.key(0), ctx, hp)
    for r, mask in enumerate((full, lost, full)):
        state = step(state, jax.random.key(r), ctx.replace(neighbor_mask=jnp.asarray(mask)))
        if r == 1:
            assert float(state.pi[0, lossy.HOLDER]) == 0.0
    pi = np.asarray(state.pi[0])
    assert pi.sum() == pytest.approx(1.0, abs=1e-5)
    if refresh == "arrival":
        assert pi[lossy.HOLDER] > 0.8, pi
        assert np.asarray(state.included[0, 1:]).all()
    else:
        assert pi[lossy.HOLDER] == 0.0, pi


@pytest.mark.slow
def test_bernoulli_half_the_similar_neighbor_keeps_its_weight_over_seeds():
    """Every link fails w.p. 0.5 each round; with the default (re-estimate on arrival) and
    stale links (EM over every listed neighbor, a failed link's last model), the similar
    neighbor ends every seed with most of the weight."""
    case = lossy.case_context(_data(), 0.5, stale=True)
    runs = lossy.run_case(case, {}, seeds=range(4), rounds=6)
    final = [float(r["pi"][-1, lossy.HOLDER]) for r in runs]
    assert min(final) > 0.5, final


def test_near_uniform_marks_a_barely_trained_model_only():
    c = 10
    log_c = np.log(c)
    losses = jnp.asarray(
        [
            [log_c + 0.05, log_c - 0.05, log_c],  # uniform-ish: off by 2% of log C
            [0.01, 0.02, 9.0],  # trained: right twice, confidently wrong once
            [8.0, 9.0, 7.0],  # confidently wrong everywhere
        ],
        jnp.float32,
    )
    mask = jnp.asarray([True, True, True])
    assert np.asarray(near_uniform(losses, mask, c, 0.1)).tolist() == [True, False, False]
    assert not np.asarray(near_uniform(losses, mask, c, 0.0)).any()  # the guard off


def test_a_tiny_barely_trained_neighbor_gets_no_weight_with_the_guard():
    """The small-neighbor case (`lossy.SMALL_CLIENTS`: no neighbor holds sevens; neighbor 2
    has 15 samples and stays near the initial model): without the guard it takes most of the
    weight, with the default guard none."""
    ctx, _ = lossy.case_context(_data(), None, clients=lossy.SMALL_CLIENTS)
    assert sum(lossy.SMALL_CLIENTS[lossy.TINY].values()) == 15
    alg = get_algorithm("pfedwn")
    assert make_hparams(alg, {}).uniform_guard == 0.0  # the default: off (docs/algorithms.md)
    got = {}
    for guard in (0.0, 0.1):
        hp = make_hparams(alg, {"uniform_guard": guard})
        state = alg.init(jax.random.key(0), ctx, hp)
        for r in range(2):
            state = alg.round(state, jax.random.key(r), ctx, hp)[0]
        got[guard] = np.asarray(state.pi[0])
    assert got[0.0][lossy.TINY] > 0.5, got
    assert got[0.1][lossy.TINY] == 0.0 and got[0.1].sum() == pytest.approx(1.0, abs=1e-5), got


@pytest.mark.slow
def test_network_mode_sweep_with_lossy_links_equals_its_runs():
    """Every node a target, links failing w.p. 0.5, with and without stale copies: the
    per-row re-estimates (state per slot) give a sweep exactly its runs."""
    config = ExperimentConfig(
        **{**VARIED_RUN, "rounds": 4},
        mode="network",
        algorithms=("pfedwn",),
        link_model="bernoulli",
        link_failure=0.5,
    )
    grid = {"stale": [False, True]}
    res = pfedwn_jax.sweep(config, seeds=[1], grid=grid, block=2, progress=False)
    for spec in expand(config, [1], grid):
        own = pfedwn_jax.run(run_config(config, spec), progress=False)
        got = res.rows["target_accuracy"][res.rows["run"] == spec.index]
        np.testing.assert_allclose(got, own.methods["pfedwn"]["target_accuracy"], atol=1e-6)
