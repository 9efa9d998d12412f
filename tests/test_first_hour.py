"""`docs/first_hour.py`, a new user's first hour, runs as written: a model, an algorithm and an
in-memory float dataset registered in the user's module, run from the command line with
`--import`, logged to TensorBoard, the saved models loaded back and evaluated to the
recorded accuracy."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from helpers import scalar_series

from pfedwn_jax.algorithms import unregister
from pfedwn_jax.data import unregister_dataset
from pfedwn_jax.models.registry import unregister_model

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "first_hour.py"


@pytest.fixture
def first_hour():
    """The script as a module; afterwards, what its user module registered is removed."""
    spec = importlib.util.spec_from_file_location("first_hour", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    unregister("uniform_mix")
    unregister_dataset("links")
    unregister_model("link_mlp")
    for name in [m for m in sys.modules if m == "my_fl" or m.endswith("my_fl")]:
        del sys.modules[name]
    if str(SCRIPT.parent / "first_hour") in sys.path:
        sys.path.remove(str(SCRIPT.parent / "first_hour"))


def test_first_hour_runs_as_written(first_hour, tmp_path, capsys):
    pytest.importorskip("tensorboardX")
    accuracy = first_hour.main(["--out", str(tmp_path)])
    assert set(accuracy) == {"local", "uniform_mix"}
    assert all(0.0 <= a <= 1.0 for a in accuracy.values())
    text = capsys.readouterr().out
    assert "uniform_mix  target accuracy" in text and "link_mlp on inputs (8,)" in text
    assert not (tmp_path / "checkpoint").exists()  # removed by pfedwn run; the models stay
    series = scalar_series(tmp_path / "logs" / "tensorboard" / "seed=0" / "uniform_mix")
    assert [step for step, _ in series["target_accuracy"]] == [1, 2, 3]
    assert series["target_accuracy"][-1][1] == pytest.approx(accuracy["uniform_mix"], abs=1e-6)
