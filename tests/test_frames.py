"""`Result.to_pandas()` and the tidy columns behind it (`pfedwn_jax.results.frames`)."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd  # the test extra installs pandas: these tests are never skipped
import pytest
from helpers import table_entry

from pfedwn_jax import Result
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.results.frames import RESULT_COLUMNS, result_columns


def _entry(config: ExperimentConfig, name: str, rounds: int, records) -> dict:
    """A method entry built through the driver's table from known rows."""
    r = np.arange(1, rounds + 1)
    acc = np.stack([np.array([0.1 * i, 0.2, 0.3, 0.4]) for i in r])
    loss = np.repeat((1.0 / r)[:, None], 4, axis=1)
    recs = [records(i) for i in r]
    stacked = {k: np.stack([np.asarray(x[k]) for x in recs]) for k in recs[0]}
    return table_entry(config.hparams_for(name), acc, loss, [True, False, False, False], stacked)


def fake_result() -> Result:
    """Two methods: `fedavg` 3 rounds with a per-round and a per-slot record, `local` 2."""
    config = ExperimentConfig(rounds=3, algorithms=("fedavg", "local"))
    fedavg = _entry(
        config, "fedavg", 3, lambda r: {"rate": np.float32(r / 10), "per_slot": np.ones(4)}
    )
    local = _entry(config, "local", 2, lambda r: {})  # stopped early (diverged, say)
    return Result(config, {"mode": "single"}, {"name": "x"}, {"fedavg": fedavg, "local": local})


def test_result_columns_one_row_per_method_and_round():
    columns = result_columns(fake_result())
    assert list(columns) == ["method", "round", *RESULT_COLUMNS, "rate"]  # no per-slot record
    assert columns["method"].tolist() == ["fedavg"] * 3 + ["local"] * 2
    assert columns["round"].tolist() == [1, 2, 3, 1, 2]
    np.testing.assert_allclose(columns["target_accuracy"], [0.1, 0.2, 0.3, 0.1, 0.2])
    np.testing.assert_allclose(columns["target_loss"], [1, 1 / 2, 1 / 3, 1, 1 / 2])
    np.testing.assert_allclose(columns["mean_client_accuracy"][0], np.mean([0.1, 0.2, 0.3, 0.4]))
    np.testing.assert_allclose(columns["client_accuracy_q50"][0], 0.25)
    np.testing.assert_allclose(columns["rate"][:3], [0.1, 0.2, 0.3], rtol=1e-6)
    assert np.isnan(columns["rate"][3:]).all()  # a method without the record


def test_result_to_pandas_is_the_tidy_frame(tmp_path):
    result = fake_result()
    frame = result.to_pandas()
    assert isinstance(frame, pd.DataFrame) and frame.shape == (5, 2 + len(RESULT_COLUMNS) + 1)
    final = frame.groupby("method")["target_accuracy"].last()
    assert final.to_dict() == pytest.approx({"fedavg": 0.3, "local": 0.2})
    back = Result.load(result.save(tmp_path / "results.json")).to_pandas()
    pd.testing.assert_frame_equal(back, frame)  # the same frame from the saved file


def test_result_to_pandas_without_pandas_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` raises ImportError
    with pytest.raises(ImportError, match=r"Result.to_pandas\(\) needs pandas.*\[analysis\]"):
        fake_result().to_pandas()
