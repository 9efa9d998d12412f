"""Saved models: every slot's final personalised parameters written by `run`, `sweep` and the
CLI, read back by `load_models`, evaluated on the run's test split to the recorded accuracy;
kept across a resume and after the CLI removes its checkpoint; clear errors."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from helpers import TINY_RUN

import pfedwn_jax
from pfedwn_jax import state_store
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.runner import saved_models

METHODS = ("local", "perfedavg")  # own models; adapted at evaluation (reads ctx.train)
CFG = ExperimentConfig(**{**TINY_RUN, "algorithms": METHODS})


class Stop(Exception):
    pass


def final_accuracy(result, method: str) -> np.ndarray:
    return np.asarray(result.methods[method]["client_accuracy"][-1])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A run whose slots are split over two devices, models saved."""
    path = tmp_path_factory.mktemp("run") / "models"
    return pfedwn_jax.run(CFG, progress=False, shards=2, save_models=path), path


def test_loaded_models_evaluate_to_the_recorded_final_accuracy(saved):
    result, path = saved
    models = pfedwn_jax.load_models(path)
    assert models.methods == METHODS and models.num_runs == 1
    assert models.config() == CFG and models.labels() == {"seed": 0}
    np.testing.assert_array_equal(models.slot_client(), result.network["slot_client"])
    assert models.is_target().tolist() == [True, False, False, False]
    for method in METHODS:
        params = models.params(method)
        assert {a.shape[0] for a in jax.tree.leaves(params)} == {4}  # [S, ...]
        ev = models.evaluate(method)
        np.testing.assert_allclose(ev["accuracy"], final_accuracy(result, method), atol=1e-6)
        assert ev["accuracy"][0] == pytest.approx(result.methods[method]["target_accuracy"][-1])


def test_the_model_applies_one_slots_parameters(saved):
    _, path = saved
    models = pfedwn_jax.load_models(path)
    model = models.model()
    assert (model.name, model.num_classes) == ("logreg", 10)
    one = jax.tree.map(lambda a: a[0], models.params("local"))
    x = np.zeros((2, *model.input_shape), np.uint8)
    assert model.apply(one, x).shape == (2, 10)


def test_a_sweep_saves_every_run(tmp_path):
    cfg = CFG.replace(algorithms=("fedavg",), rounds=2)
    table = pfedwn_jax.sweep(
        cfg, seeds=[0, 1], grid={"lr": [0.05, 0.2]}, progress=False, save_models=tmp_path
    )
    models = pfedwn_jax.load_models(tmp_path)
    assert models.num_runs == 4
    rows = {k: np.asarray(v) for k, v in table.rows.items()}
    for run in range(4):
        assert models.config(run).lr == models.labels(run)["lr"]
        pick = (rows["run"] == run) & (rows["method"] == "fedavg") & (rows["round"] == 2)
        acc = models.evaluate("fedavg", run)["accuracy"]
        assert acc[models.is_target(run)].mean() == pytest.approx(
            rows["target_accuracy"][pick].item(), abs=1e-6
        )


@pytest.mark.slow
def test_a_resumed_job_keeps_the_models_saved_before_the_interruption(tmp_path):
    cfg = CFG.replace(algorithms=("local", "fedavg"), rounds=2)
    ckpt, path = tmp_path / "ckpt", tmp_path / "models"

    def stop(name, rounds_done, metrics):
        if name == "fedavg" and rounds_done == 1:
            raise Stop

    with pytest.raises(Stop):
        pfedwn_jax.run(
            cfg, progress=False, checkpoint=ckpt, block=1, callback=stop, save_models=path
        )
    assert json.loads((path / "models.json").read_text())["saved"] == [[0, "local"]]
    assert pfedwn_jax.load_models(path).methods == ("local",)  # fedavg is not saved yet
    result = pfedwn_jax.run(cfg, progress=False, checkpoint=ckpt, resume=True, save_models=path)
    models = pfedwn_jax.load_models(path)
    assert models.methods == ("local", "fedavg")
    for method in models.methods:
        np.testing.assert_allclose(
            models.evaluate(method)["accuracy"], final_accuracy(result, method), atol=1e-6
        )
    pfedwn_jax.run(cfg.replace(algorithms=("local",)), progress=False, save_models=path)
    assert sorted(p.name for p in path.iterdir()) == ["models.json", "p0_m0"]  # a new job


def test_bad_paths_methods_and_runs_are_named(saved, tmp_path):
    _, path = saved
    with pytest.raises(ValueError, match=r"holds no saved models: no models\.json"):
        pfedwn_jax.load_models(tmp_path)
    (tmp_path / "models.json").write_text('{"format": "other/1"}')
    with pytest.raises(ValueError, match="format must be 'pfedwn-models/1'; got 'other/1'"):
        pfedwn_jax.load_models(tmp_path)
    models = pfedwn_jax.load_models(path)
    with pytest.raises(ValueError, match=r"method 'nope' has no saved models .* saved: \['local'"):
        models.params("nope")
    with pytest.raises(ValueError, match=r"run must be an integer in \[0, 1\); got 3"):
        models.params("local", run=3)
    with pytest.raises(ValueError, match="split must be 'test' or 'val'"):
        models.evaluate("local", split="train")
    with pytest.raises(ValueError, match=r"save_models .* is a file"):
        pfedwn_jax.run(CFG, progress=False, save_models=path / "models.json")


def test_index_names_the_model_and_layout(saved):
    _, path = saved
    index = json.loads((path / saved_models.INDEX).read_text())
    run = index["runs"][0]
    assert run["model"] == {
        "name": "logreg", "num_classes": 10, "input_shape": [28, 28, 1], "input_dtype": "uint8"
    }  # fmt: skip
    assert (run["program"], run["index"]) == (0, 0) and len(run["data"]) == 64
    with state_store._manager(path / "p0_m1", create=False) as manager:  # perfedavg's models
        saved = jax.tree.leaves(state_store._tree(manager.item_metadata(0)[state_store.STATE]))
    assert all("'slots'" in str(leaf.sharding) for leaf in saved)  # split like the state
