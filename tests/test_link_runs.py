"""Links that fail round by round inside training (`link_model`, `runner.links`)."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from helpers import TINY_RUN, VARIED_RUN

import pfedwn_jax
from pfedwn_jax import ExperimentConfig
from pfedwn_jax.algorithms import neighbor_lists
from pfedwn_jax.experiment.federation import build_federation
from pfedwn_jax.experiment.grid import expand, run_config
from pfedwn_jax.experiment.link_setup import build_links
from pfedwn_jax.runner.links import sample_received
from pfedwn_jax.wireless import simulate_links

BASE = {**TINY_RUN, "rounds": 2}
Z = 5.0  # two-sided normal tail ~5.7e-7 per comparison: the false-alarm rate of each check


def _run(**kw):
    return pfedwn_jax.run(ExperimentConfig(**{**BASE, **kw}), progress=False)


@pytest.mark.slow  # the quick tier keeps a cheaper check of the same property
def test_all_links_failing_makes_pfedwn_local_and_none_failing_changes_nothing():
    methods = ("local", "fedavg", "pfedwn")
    ideal = _run(algorithms=methods)
    dead = _run(algorithms=methods, link_model="bernoulli", link_failure=1.0)
    alive = _run(algorithms=methods, link_model="bernoulli", link_failure=0.0)
    local = ideal.methods["local"]["client_accuracy"]
    assert dead.methods["pfedwn"]["client_accuracy"] == local  # exactly
    assert dead.methods["fedavg"]["client_accuracy"] == local  # each averages only itself
    assert alive.methods["fedavg"]["client_accuracy"] == ideal.methods["fedavg"]["client_accuracy"]
    np.testing.assert_allclose(
        alive.methods["pfedwn"]["client_accuracy"],
        ideal.methods["pfedwn"]["client_accuracy"],
        atol=1e-6,
    )
    assert dead.methods["pfedwn"]["records"]["link_failure_rate"] == [1.0, 1.0]
    assert "link_received" not in ideal.methods["pfedwn"]["records"]


def _draws(config, n):
    fed = build_federation(config)
    links = build_links(fed, config)
    lists, mask = neighbor_lists(fed.adjacency)  # the runner's lists
    keys = jax.random.split(jax.random.PRNGKey(7), n)
    got = np.asarray(jax.vmap(lambda k: sample_received(k, links, lists, mask))(keys))
    return links, mask, got


def test_bernoulli_failure_frequency_matches_its_probability():
    for kw, p_of in [
        (dict(link_failure=0.3), lambda links: np.full(links.perr.shape, 0.3)),
        (dict(gamma_th=20.0, eps=0.9), lambda links: np.asarray(links.perr)),
    ]:
        config = ExperimentConfig(**{**BASE, **kw, "link_model": "bernoulli"})
        links, mask, got = _draws(config, 4000)
        mask = np.asarray(mask).copy()
        assert got[:, :, 0].all()  # a slot always has its own model
        mask[:, 0] = False
        p = p_of(links)[mask]
        failures = (~got[:, mask]).sum(0)
        n = got.shape[0]
        sd = np.sqrt(n * p * (1 - p))
        assert (np.abs(failures - n * p) <= Z * np.maximum(sd, 1.0)).all(), (failures, n * p)


def test_physical_failure_rate_matches_the_monte_carlo_of_the_same_topology():
    """Every node selected (eps near 1), network mode: node 0's incoming links under the
    physical model equal `simulate_links` of node 0 against all the others."""
    config = ExperimentConfig(
        **{**BASE, "num_neighbors": 6, "eps": 0.999, "gamma_th": 5.0},
        mode="network",
        link_model="physical",
    )
    fed = build_federation(config)
    assert fed.adjacency.all()
    _, _, got = _draws(config, 3000)
    rate = 1.0 - got[:, 0, 1:].mean(0)  # links j -> 0, j = lists[0, 1:] = 1..6
    xy = fed.positions
    mc = simulate_links(jax.random.PRNGKey(3), xy[0], xy[1:], 5.0, 20000)
    mc_rate = 1.0 - np.asarray(mc).mean(0)
    sd = np.sqrt(mc_rate * (1 - mc_rate) * (1 / 3000 + 1 / 20000))
    np.testing.assert_array_less(np.abs(rate - mc_rate), Z * sd + 1e-9)


@pytest.mark.slow
def test_a_sweep_with_failing_links_equals_its_runs():
    config = ExperimentConfig(
        **VARIED_RUN,
        algorithms=("pfedwn",),
        link_model="bernoulli",
        link_failure=0.5,
    )
    grid = {"topology_seed": [0, 3]}  # 3 and 4 slots: links padded too
    res = pfedwn_jax.sweep(config, seeds=[1], grid=grid, block=1, progress=False)
    for spec in expand(config, [1], grid):
        own = pfedwn_jax.run(run_config(config, spec), progress=False)
        got = res.rows["target_accuracy"][res.rows["run"] == spec.index]
        np.testing.assert_allclose(got, own.methods["pfedwn"]["target_accuracy"], atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(link_model="lossy"), "link_model"),
        (dict(link_model="bernoulli", link_failure=1.5), "link_failure"),
        (dict(link_model="bernoulli", link_failure=math.nan), "link_failure"),
        (dict(link_failure=0.2), "link_failure applies"),
    ],
)
def test_bad_link_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ExperimentConfig(**kwargs)


def test_without_selection_every_neighbor_in_range_trains():
    kw = dict(VARIED_RUN)
    chosen = build_federation(ExperimentConfig(**kw))
    everyone = build_federation(ExperimentConfig(**kw, selection=False))
    assert chosen.num_slots < everyone.num_slots == 6
    net = {**kw, "mode": "network"}
    assert build_federation(ExperimentConfig(**net, selection=False)).adjacency.all()
    sparse = build_federation(ExperimentConfig(**net, candidates=3, selection=False))
    assert sparse.neighbor_mask.all() and sparse.neighbor_lists.shape == (6, 4)
    with pytest.raises(ValueError, match="selection"):
        ExperimentConfig(selection="no")
