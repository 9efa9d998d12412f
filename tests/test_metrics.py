"""Per-round metrics: one registry; the docs/engine.md example adds a metric that appears in
`Result`, `SweepResult`, `rows.csv` and the metric writers, with the right values."""

from __future__ import annotations

import csv
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from pfedwn_jax.results import metric_names, register_metric, unregister_metric
from pfedwn_jax.results.metrics import Rounds, compute

DOC = Path(__file__).resolve().parents[1] / "docs" / "engine.md"
MARKER = "<!-- example: metric -->"


def example_code() -> str:
    after = DOC.read_text().split(MARKER, 1)[-1]
    match = re.match(r"\s*```python\n(.*?)```", after, re.DOTALL)
    assert match, f"no ```python block after {MARKER!r} in {DOC}"
    return match.group(1)


@pytest.fixture
def clean_registry():
    before = metric_names()
    yield
    for name in metric_names():
        if name not in before:
            unregister_metric(name)
    assert metric_names() == before


def test_doc_example_metric_reaches_result_sweep_and_csv(clean_registry, tmp_path, monkeypatch):
    module = types.ModuleType("docs_metric_example")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(example_code(), str(DOC), "exec"), module.__dict__)
    result, table = module.result, module.table
    # Result: one number per round, the lowest target accuracy (recomputed from the rows)
    entry = result.methods["local"]
    acc = np.asarray(entry["client_accuracy"])  # [R, S]
    target = np.asarray(result.network["is_target"], bool)
    np.testing.assert_allclose(entry["worst_target_accuracy"], acc[:, target].min(axis=1))
    # SweepResult and its CSV
    col = table.rows["worst_target_accuracy"]
    assert col.shape == (len(table),) and np.all((col >= 0) & (col <= 1))
    first = (table.rows["run"] == 0) & (table.rows["method"] == "local")
    np.testing.assert_allclose(col[first], entry["worst_target_accuracy"], atol=1e-7)
    table.save(tmp_path)
    with open(tmp_path / "rows.csv") as f:
        header = next(csv.reader(f))
    assert "worst_target_accuracy" in header


def test_metrics_are_computed_per_round_and_checked():
    rounds = Rounds(
        accuracy=np.array([[0.5, 1.0, 0.0], [0.2, 0.4, 0.6]]),
        loss=np.ones((2, 3)),
        val_accuracy=None,
        is_target=np.array([True, True, False]),
        records={},
    )
    out = compute(rounds)
    np.testing.assert_allclose(out["target_accuracy"], [0.75, 0.3])
    np.testing.assert_allclose(out["mean_client_accuracy"], [0.5, 0.4])
    assert "target_val_accuracy" not in out  # no validation split: the metric does not apply
    with pytest.raises(ValueError, match="identifier"):
        register_metric("not a name", lambda r: r.loss[:, 0])
    with pytest.raises(ValueError, match="callable"):
        register_metric("fine", 3)
    with pytest.raises(ValueError, match="not registered"):
        unregister_metric("never_registered")


def test_a_metric_of_the_wrong_shape_is_named(clean_registry):
    register_metric("bad_shape", lambda r: r.accuracy)  # [n, S], not [n]
    rounds = Rounds(np.ones((2, 3)), np.ones((2, 3)), None, np.ones(3, bool), {})
    with pytest.raises(ValueError, match=r"bad_shape.*one number per round"):
        compute(rounds)
