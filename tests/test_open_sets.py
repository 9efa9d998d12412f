"""Open sets stay open: an algorithm declares its own memory phases, and no module of the
runner or the engine names a built-in algorithm."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import TINY_RUN

from pfedwn_jax.algorithms import get_algorithm, register, unregister
from pfedwn_jax.algorithms.phases import Phase, baseline
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.setup import setup
from pfedwn_jax.runner import memory

PACKAGE = Path(__file__).resolve().parents[1] / "pfedwn_jax"
BUILT_IN = ("local", "fedavg", "fedprox", "perfedavg", "fedamp", "pfedwn")


@pytest.fixture
def own_phases():
    seen = []

    def phases(sz, hp):
        seen.append(sz.slots)
        return [*baseline(sz, hp), Phase("my big phase", 3 * sz.slots * sz.param, 10**9)]

    alg = register(get_algorithm("fedavg")._replace(name="test_own_phases", memory_phases=phases))
    yield alg, seen
    unregister(alg.name)


def test_an_algorithm_is_planned_with_its_own_memory_phases(own_phases):
    alg, seen = own_phases
    exp = setup(ExperimentConfig(**TINY_RUN, algorithms=("fedavg",)))
    names = [p.name for p in memory.phases(exp.ctx, exp.test, alg.name)]
    assert names == ["local training", "mixing", "evaluation", "my big phase"]
    est = memory.estimate(exp.ctx, exp.test, alg.name)
    plain = memory.estimate(exp.ctx, exp.test, "fedavg")
    assert seen and est.phase == "my big phase" and plain.phase != "my big phase"
    assert est.activations == 10**9 and est.total() > max(plain.total(), 10**9)


def _named_algorithms(path: Path) -> list[str]:
    """Built-in algorithm names a module uses: string constants (argument defaults aside:
    the W&B project is called "pfedwn") and imports of an algorithm's module."""
    tree = ast.parse(path.read_text())
    defaults = {
        id(d)
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
        for d in [*f.args.defaults, *f.args.kw_defaults]
        if d is not None
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in BUILT_IN and id(node) not in defaults:
            found.append(f"{path.name}:{node.lineno} {node.value!r}")
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            found += [
                f"{path.name}:{node.lineno} import {n}"
                for n in names
                if n.split(".")[-1] in BUILT_IN and ".algorithms" in n
            ]
    return found


def test_no_runner_or_engine_module_names_a_built_in_algorithm():
    files = [*(PACKAGE / "runner").rglob("*.py"), *(PACKAGE / "engine").rglob("*.py")]
    assert len(files) > 10
    assert [hit for f in files for hit in _named_algorithms(f)] == []
    # the check itself sees a name and an import
    assert _named_algorithms(PACKAGE / "algorithms" / "__init__.py")


def test_a_per_slot_device_metric_declared_once_reaches_result_sweep_and_csv(tmp_path, monkeypatch):
    """One entry of `SLOT_METRICS` (its function, its row, its target mean): computed inside
    the compiled round, kept per slot in `Result`, its target mean in `Result`,
    `SweepResult` and the CSV writer."""
    import csv

    import numpy as np

    import pfedwn_jax
    from pfedwn_jax.results import metrics
    from pfedwn_jax.runner.writers import CSVWriter

    monkeypatch.setitem(
        metrics.SLOT_METRICS,
        "double_loss",
        metrics.SlotMetric(lambda v: 2 * v.test["loss"], "client_double_loss", "target_double"),
    )
    alg = register(get_algorithm("fedavg")._replace(name="test_slot_metric"))  # fresh programs
    try:
        cfg = ExperimentConfig(**{**TINY_RUN, "rounds": 2}, algorithms=(alg.name,))
        path = tmp_path / "metrics.csv"
        res = pfedwn_jax.run(cfg, progress=False, writers=[CSVWriter(path)])
        entry = res.methods[alg.name]
        np.testing.assert_allclose(
            entry["client_double_loss"], 2 * np.asarray(entry["client_loss"])
        )
        np.testing.assert_allclose(entry["target_double"], 2 * np.asarray(entry["target_loss"]))
        sw = pfedwn_jax.sweep(cfg, progress=False)
        np.testing.assert_allclose(sw.rows["target_double"], entry["target_double"], rtol=1e-6)
        with path.open() as f:
            rows = [r for r in csv.DictReader(f) if r["name"] == "target_double"]
        assert [float(r["value"]) for r in rows] == pytest.approx(entry["target_double"])
    finally:
        unregister(alg.name)
