"""One topology per seed: `pfedwn neighbors --seed S` shows the network `run()` places for
`topology_seed=S` (`wireless.place_network`)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from pfedwn_jax import run
from pfedwn_jax.cli import main
from pfedwn_jax.experiment import ExperimentConfig, build_federation
from pfedwn_jax.wireless import ChannelParams, place_network, place_uniform, topology_keys


def _neighbors_json(tmp_path, seed: int, *flags: str) -> dict:
    path = tmp_path / f"n{seed}.json"
    assert main(["neighbors", "--seed", str(seed), "--json", str(path), *flags]) == 0
    return json.loads(path.read_text())


def _selected_ids(table: dict) -> list[int]:
    return [r["id"] for r in table["neighbors"] if r["selected"]]


def test_neighbors_cli_and_run_select_the_same_neighbors(tmp_path, capsys):
    seed = 0  # the demo network: neighbors 3, 4 and 8
    table = _neighbors_json(tmp_path, seed)
    cfg = ExperimentConfig(model="logreg", rounds=1, algorithms=("local",), topology_seed=seed)
    net = run(cfg, progress=False).network
    # target = data client 0, so neighbor k of the placement (id k) is data client k
    assert _selected_ids(table) == net["selected_neighbors"] == [3, 4, 8]
    np.testing.assert_allclose([r["perr"] for r in table["neighbors"]], net["perr"], rtol=1e-6)
    np.testing.assert_allclose(table["target"], net["positions"][0], rtol=1e-6)


@pytest.mark.parametrize(("seed", "gamma_th"), [(1, 5.0), (7, 10.0)])
def test_same_network_for_other_seeds_and_thresholds(tmp_path, capsys, seed, gamma_th):
    table = _neighbors_json(tmp_path, seed, "--gamma-th", str(gamma_th))
    fed = build_federation(ExperimentConfig(topology_seed=seed, gamma_th=gamma_th))
    assert _selected_ids(table) == fed.neighbors[fed.selected].tolist()
    np.testing.assert_allclose([r["perr"] for r in table["neighbors"]], fed.perr, rtol=1e-6)
    xy = [[r["x"], r["y"]] for r in table["neighbors"]]
    np.testing.assert_allclose(xy, fed.positions[fed.neighbors], rtol=1e-6)


def test_place_network_is_the_split_placement_key():
    params = ChannelParams()
    t, nb = place_network(3, 5, params)
    k_place, _ = topology_keys(3)
    want = jax.random.split(jax.random.PRNGKey(3))[0]  # the raw key of the same seed
    np.testing.assert_array_equal(jax.random.key_data(k_place), want)
    t2, nb2 = place_uniform(k_place, 5, params)
    np.testing.assert_array_equal(t, t2)
    np.testing.assert_array_equal(nb, nb2)


def test_negative_seed_is_a_clean_error(capsys):
    assert main(["neighbors", "--seed", "-1"]) == 2
    err = capsys.readouterr().err
    assert "seed" in err and "Traceback" not in err
    with pytest.raises(ValueError, match="seed"):
        place_network(-1, 3)
