"""The experiment runner: validation, federations, determinism, resume, results JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import TINY_RUN

import pfedwn_jax
from pfedwn_jax import Result, api, run
from pfedwn_jax.experiment import ExperimentConfig, build_federation
from pfedwn_jax.experiment.federation import network_perr
from pfedwn_jax.io import atomic_open, atomic_write_text
from pfedwn_jax.runner import job as runner_job

# tiny and fast: logistic regression, 4 clients, 3 rounds
TINY = {**TINY_RUN, "algorithms": ("local", "fedavg", "fedprox")}


@pytest.fixture(scope="module")
def tiny_result() -> Result:
    return run(ExperimentConfig(**TINY), progress=False)


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"algorithms": ("fedavg", "fedsgd")}, "algorithms"),
        ({"model": "vgg"}, "model"),
        ({"lr": 0.0}, "lr"),
        ({"lr": -1.0}, "lr"),
        ({"rounds": 0}, "rounds"),
        ({"target": 4}, "target"),  # 3 neighbors: data clients 0..3
        ({"target": -1}, "target"),
        ({"target": "first"}, "target"),
        ({"batch_size": 0}, "batch_size"),
        ({"eps": 1.5}, "eps"),
        ({"mode": "mesh"}, "mode"),
        ({"hparams": {"fedprox": {"mu": -1.0}}}, "fedprox.mu"),
        ({"hparams": {"fedprox": {"nu": 1.0}}}, "fedprox"),
    ],
)
def test_bad_config_names_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        ExperimentConfig(**{**TINY, **changes})


def test_unknown_config_key_is_rejected():
    with pytest.raises(ValueError, match="roundz"):
        ExperimentConfig.from_dict({"roundz": 3})


def test_model_that_does_not_fit_fails_before_compiling(tmp_path, monkeypatch):
    # 8x8 images are too small for the CNN's two 5x5 convolutions and pools
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny.npz"
    np.savez(
        path,
        x_train=rng.integers(0, 255, (200, 8, 8, 1), dtype=np.uint8),
        y_train=rng.integers(0, 10, 200),
        x_test=rng.integers(0, 255, (40, 8, 8, 1), dtype=np.uint8),
        y_test=rng.integers(0, 10, 40),
    )

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled a round for a bad config")

    monkeypatch.setattr(runner_job, "execute", no_compile)
    cfg = ExperimentConfig(**{**TINY, "model": "cnn", "dataset": f"npz:{path}", "partition": "iid"})
    with pytest.raises(ValueError, match="model"):
        run(cfg, progress=False)


# --------------------------------------------------------------------------- federations
def test_single_target_federation_follows_the_selection():
    from pfedwn_jax.wireless import ChannelParams, error_probability, place_uniform

    cfg = ExperimentConfig(
        **{**TINY, "num_neighbors": 10, "gamma_th": 5.0, "eps": 0.05, "target": 3}
    )
    fed = build_federation(cfg)
    # independent recomputation from the wireless API
    k_place = jax.random.split(jax.random.PRNGKey(cfg.topology_seed))[0]
    centre, others = place_uniform(k_place, 10, ChannelParams())
    perr = np.asarray(error_probability(centre, others, 5.0, ChannelParams()))
    np.testing.assert_allclose(fed.perr, perr, rtol=1e-6)
    others_ids = [c for c in range(11) if c != 3]
    expected = [3] + [others_ids[k] for k in range(10) if perr[k] < 0.05]
    assert fed.data_client.tolist() == expected
    assert fed.adjacency.all() and fed.is_target.tolist() == [True] + [False] * (len(expected) - 1)
    assert fed.positions.shape == (11, 2)


def test_network_federation_rows_match_one_target_at_a_time():
    from pfedwn_jax.wireless import ChannelParams, error_probability

    cfg = ExperimentConfig(
        **{**TINY, "mode": "network", "num_neighbors": 6, "gamma_th": 2.0, "eps": 0.3}
    )
    fed = build_federation(cfg)
    n = 7
    assert fed.data_client.tolist() == list(range(n)) and fed.is_target.all()
    for i in range(n):
        others = [j for j in range(n) if j != i]
        row = np.asarray(
            error_probability(fed.positions[i], fed.positions[others], 2.0, ChannelParams())
        )
        np.testing.assert_allclose(fed.perr[i, others], row, rtol=1e-5, atol=1e-9)
        np.testing.assert_array_equal(fed.adjacency[i, others], row < 0.3)
        assert fed.adjacency[i, i]
    # computed in chunks of targets (bounded memory) it is the same matrix
    chunked = network_perr(fed.positions, 2.0, ChannelParams(), "paper", max_elements=80)
    np.testing.assert_allclose(chunked, fed.perr, rtol=1e-5, atol=1e-9)


# --------------------------------------------------------------------------- the runner
def test_result_layout_and_json_roundtrip(tiny_result, tmp_path):
    res = tiny_result
    s = len(res.network["slot_client"])
    for name in ("local", "fedavg", "fedprox"):
        m = res.methods[name]
        assert len(m["target_accuracy"]) == 3
        assert np.asarray(m["client_accuracy"]).shape == (3, s)
        assert np.asarray(m["records"]["train_loss"]).shape == (3, s)
        acc = np.asarray(m["client_accuracy"])
        assert ((acc >= 0) & (acc <= 1)).all()
        assert m["final_target_accuracy"] == m["target_accuracy"][-1]
        assert m["max_target_accuracy"] == max(m["target_accuracy"])
    # target metric = slot 0's (single-target mode)
    acc0 = np.asarray(res.methods["local"]["client_accuracy"])[:, 0]
    np.testing.assert_array_equal(res.target_accuracy("local"), acc0)
    path = res.save(tmp_path / "r.json")
    raw = json.loads(path.read_text())
    assert {"config", "methods", "network", "schema"} <= set(raw)
    back = Result.load(path)
    assert back.config == res.config
    assert back.methods == json.loads(json.dumps(res.to_dict()["methods"]))


def test_same_seed_gives_identical_results(tiny_result):
    again = run(ExperimentConfig(**TINY), progress=False)
    for name in tiny_result.methods:
        a, b = tiny_result.methods[name], again.methods[name]
        for key in ("target_accuracy", "target_loss", "client_accuracy", "client_loss", "records"):
            assert a[key] == b[key], (name, key)


def test_interrupt_and_resume_gives_the_same_numbers(tiny_result, tmp_path):
    ckpt = tmp_path / "ckpt.npz"
    cfg = ExperimentConfig(**TINY)

    class Stop(Exception):
        pass

    def stop_after(method, rounds_done, metrics):
        if method == "fedavg" and rounds_done == 2:
            raise Stop

    with pytest.raises(Stop):
        run(cfg, progress=False, checkpoint=ckpt, callback=stop_after)
    assert ckpt.exists()
    resumed = run(cfg, progress=False, checkpoint=ckpt, resume=True)
    for name in tiny_result.methods:
        a, b = tiny_result.methods[name], resumed.methods[name]
        for key in ("target_accuracy", "client_accuracy", "client_loss", "records"):
            assert a[key] == b[key], (name, key)
    # a different config cannot resume from that checkpoint
    with pytest.raises(ValueError, match=r"another job: lr \S+ then, 0\.1 now"):
        run(cfg.replace(lr=0.1), progress=False, checkpoint=ckpt, resume=True)


def test_mlp_learns_well_above_chance_on_real_mnist():
    # embedded real MNIST subset, paper partition, 11 clients, 3 rounds
    cfg = ExperimentConfig(model="mlp", rounds=3, algorithms=("local", "fedavg"), lr=0.05)
    res = run(cfg, progress=False)
    for name in ("local", "fedavg"):
        acc = res.client_accuracy(name)[-1]
        assert acc.mean() > 0.6, (name, acc)  # chance is 0.1


def test_random_target_is_reproducible_and_in_range():
    cfg = ExperimentConfig(**{**TINY, "num_neighbors": 6, "target": "random", "topology_seed": 5})
    a, b = build_federation(cfg), build_federation(cfg)
    assert a.target == b.target and 0 <= a.target <= 6
    assert a.data_client[0] == a.target and a.target not in a.neighbors.tolist()
    assert sorted([a.target, *a.neighbors.tolist()]) == list(range(7))


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    path = tmp_path / "results.json"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError), atomic_open(path) as f:
        f.write("half-writ")
        raise RuntimeError("crash mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_no_selected_neighbor_leaves_the_target_alone():
    cfg = ExperimentConfig(**{**TINY, "gamma_th": 50.0, "eps": 1e-9, "target": 2})
    fed = build_federation(cfg)
    assert not fed.selected.any()
    assert fed.data_client.tolist() == [2]
    assert fed.adjacency.tolist() == [[True]] and fed.is_target.tolist() == [True]


def test_package_root_exports_the_api_lazily():
    assert pfedwn_jax.run is api.run and pfedwn_jax.Options is api.Options
    assert pfedwn_jax.ExperimentConfig is ExperimentConfig and pfedwn_jax.Result is Result
    assert {"run", "ExperimentConfig", "Result", "use_cpu_devices"} <= set(pfedwn_jax.__all__)
    with pytest.raises(AttributeError, match="no_such_name"):
        pfedwn_jax.no_such_name
    code = "import sys, pfedwn_jax; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # `import pfedwn_jax` alone stays cheap
