"""Damaged files end in one named error (a `ValueError` naming the file; exit status 2 on the
command line), never a traceback from numpy, zipfile, orbax or tensorstore: a truncated
checkpoint block, saved models, a reproduction's cache, a results file."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from helpers import TINY_RUN

import pfedwn_jax
from pfedwn_jax import ExperimentConfig, run
from pfedwn_jax.io import atomic_write_json, read_npz
from pfedwn_jax.reproduce import runs as reproduce_runs
from pfedwn_jax.results.result import Result
from pfedwn_jax.results.sweep import SweepResult

CFG = ExperimentConfig(**{**TINY_RUN, "rounds": 2, "algorithms": ("local",)})


def _truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """A finished run with its checkpoint, saved models and results file."""
    out = tmp_path_factory.mktemp("run")
    result = run(CFG, progress=False, checkpoint=out / "checkpoint", save_models=out / "models")
    result.save(out / "results.json")
    return out


def test_a_truncated_npz_is_one_error_naming_it(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, x=np.arange(1000))
    assert read_npz(path)["x"].tolist() == list(range(1000))
    for keep in (0.5, 0.05, 0.0):
        np.savez(path, x=np.arange(1000))
        _truncate(path, keep)
        with pytest.raises(ValueError, match=rf"block file '{path}' is damaged"):
            read_npz(path, "block file")
    with pytest.raises(ValueError, match="is a directory"):
        read_npz(tmp_path, "block file")


def test_a_truncated_checkpoint_block_is_named_on_resume(done, tmp_path):
    ckpt = tmp_path / "checkpoint"
    shutil.copytree(done / "checkpoint", ckpt)
    block = sorted((ckpt / "blocks").iterdir())[0]
    _truncate(block)
    with pytest.raises(ValueError, match=rf"block {block.name} cannot be read"):
        run(CFG, progress=False, checkpoint=ckpt, resume=True)


def test_damaged_saved_models_are_one_error_without_stray_tracebacks(done, tmp_path, capfd):
    models = tmp_path / "models"
    shutil.copytree(done / "models", models)
    assert pfedwn_jax.load_models(done).methods == ("local",)  # the run's out dir is found
    for f in sorted(p for p in models.rglob("*") if p.is_file() and "ocdbt" in str(p)):
        _truncate(f, 0.3)
    capfd.readouterr()
    with pytest.raises(ValueError, match=r"saved models .*'local' models .*cannot be read"):
        pfedwn_jax.load_models(models).params("local")
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Event loop is closed" not in err, err


def test_a_results_file_with_a_damaged_method_entry_is_refused_when_read(done, tmp_path):
    doc = json.loads((done / "results.json").read_text())
    for damage in ("garbage", 3, {"target_accuracy": [0.5]}):
        doc["methods"]["local"] = damage
        path = atomic_write_json(tmp_path / "results.json", doc)
        with pytest.raises(ValueError, match=r"results\.json.*methods\['local'\] is damaged"):
            Result.load(path)
    assert Result.load(done / "results.json").summary()["local"]["final"] > 0


def test_a_damaged_reproduction_cache_is_named(tmp_path):
    runs = [{"label": "a"}]
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    (tmp_path / "sweep.json").write_text('{"schema": "pfedwn-sw')
    with pytest.raises(ValueError, match=r"sweep\.json' is not valid JSON.*remove"):
        reproduce_runs._cached(tmp_path, runs)
    rows = {"run": [0], "seed": [0], "method": ["local"], "round": [1], "diverged": [False]}
    rows |= {"target_accuracy": [0.5], "target_loss": [1.0], "mean_client_accuracy": [0.5]}
    SweepResult(rows, (), {}).to_json(tmp_path / "sweep.json")
    np.savez(tmp_path / "records.npz", pi=np.ones((3, 4)))
    _truncate(tmp_path / "records.npz")
    with pytest.raises(ValueError, match=r"records\.npz' is damaged.*remove"):
        reproduce_runs._cached(tmp_path, runs)
    with pytest.raises(ValueError, match=r"sweep JSON text is not valid JSON"):
        SweepResult.from_json("{not json")
