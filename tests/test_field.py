"""The comparison table of every method (`reproduce.field`): the same tuning budget for every
registered method, the tuning axes checked at registration, and a small table end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pfedwn_jax.algorithms import (
    available_algorithms,
    get_algorithm,
    make_hparams,
    register,
)
from pfedwn_jax.reproduce.field import (
    FIELD_POINTS,
    field_grid,
    field_methods,
    field_preset,
)
from pfedwn_jax.reproduce.learning import ALL_ITEMS, parse_items
from pfedwn_jax.reproduce.presets import get_preset


@pytest.mark.parametrize("name", available_algorithms())
def test_every_method_gets_the_same_budget_of_valid_points(name):
    """FIELD_POINTS grid points for every method; each point builds its hyperparameters
    (the values pass the method's own checks) and its own axis is one it can sweep in one
    program (a dynamic field)."""
    alg = get_algorithm(name)
    grid = field_grid(alg)
    assert math.prod(len(v) for v in grid.values()) == FIELD_POINTS
    own = {k.split(".", 1)[1]: v for k, v in grid.items() if k != "lr"}
    assert set(own) <= set(alg.hparams.dynamic_fields)
    for key, values in own.items():
        assert len(set(values)) == 2
        for v in values:
            assert getattr(make_hparams(alg, {key: v}), key) == pytest.approx(v)


def test_a_bad_tuning_axis_is_refused_at_registration():
    local = get_algorithm("local")
    fedprox = get_algorithm("fedprox")
    bad = [
        local._replace(name="bad_tune_a", tune=("mu", (0.1, 1.0))),  # local has no mu
        fedprox._replace(name="bad_tune_b", tune=("mu", (0.1,))),  # one value
        fedprox._replace(name="bad_tune_c", tune=("mu", [0.1, 1.0])),  # not a tuple
        get_algorithm("fedem")._replace(name="bad_tune_d", tune=("components", (2, 3))),
    ]
    for alg in bad:
        with pytest.raises(ValueError, match=f"{alg.name}: tune must be"):
            register(alg)
        assert alg.name not in available_algorithms()


def test_methods_local_first_then_by_family():
    assert field_methods(["ditto", "fedavg"]) == ("local", "fedavg", "ditto")
    every = field_methods()
    assert every[0] == "local" and sorted(every) == sorted(available_algorithms())
    with pytest.raises(ValueError, match="'nope'"):
        field_methods(["nope"])


def test_a_preset_keeps_the_datasets_named():
    from pfedwn_jax.reproduce.presets import with_datasets

    quick = get_preset("quick")
    assert [d.label for d in with_datasets(quick, "CIFAR-100, MNIST").datasets] == [
        "MNIST",
        "CIFAR-100",
    ]
    with pytest.raises(ValueError, match=r"datasets: unknown \['SVHN'\]; preset 'quick' has"):
        with_datasets(quick, ["SVHN"])


def test_the_table_is_an_extra_item_and_counts_the_cost():
    assert "field" not in parse_items("all") and parse_items("field") == ("field",)
    assert "field" not in ALL_ITEMS
    p = field_preset(get_preset("tiny"), ["fedprox"])
    assert p.methods == ("local", "fedprox") and p.base["cost"] is True and not p.variants
    assert p.grids["fedprox"] == {"lr": (0.03, 0.1), "fedprox.mu": (0.01, 0.1)}


@pytest.mark.slow
def test_a_small_table_end_to_end(tmp_path):
    """Local and FedAvg on `tiny`: one row per case and method at a grid point, FedAvg minus
    Local per case, and FedAvg's bits a round equal to every directed link of the group
    carrying the whole model once (32-bit values; the ideal links lose nothing)."""
    from pfedwn_jax.reproduce.learning import reproduce
    from pfedwn_jax.reproduce.runs import dataset_base, table_cases

    preset = get_preset("tiny")
    out = reproduce("field", preset, tmp_path, log=lambda s: None, methods=["fedavg"])
    rows = out["field"]
    assert [(r["case"], r["method"]) for r in rows] == [
        (c, m) for m in ("local", "fedavg") for c in ("Case 1", "Case 2", "Case 3")
    ]
    doc = json.loads((tmp_path / "field_pairs.json").read_text())
    assert [p["variant"] for p in doc["pairs"]] == ["fedavg"] * 3
    assert all(p["holm_family"] == 1 for p in doc["pairs"])
    params = 28 * 28 * 10 + 10  # the logistic regression on MNIST
    cases = {c.name: c for c in table_cases(dataset_base(preset, preset.datasets[0], "local"))}
    for r in rows:
        slots = 1 + cases[r["case"]].num_selected
        want = 0.0 if r["method"] == "local" else slots * (slots - 1) * params * 32 / 1e6
        assert r["cost"]["bits_sent"] == pytest.approx(want, rel=1e-6)
        assert np.isfinite(r["cost"]["airtime_s"]) and r["cost"]["energy_j"] > 0
        assert r["chosen"]["lr"] in (0.01, 0.03, 0.1, 0.3)
    text = (tmp_path / "FIELD.md").read_text()
    assert "| fedavg | traditional |" in text and "1 comparison per target" in text
    assert "Every method, tuned with the same budget" in (tmp_path / "REPORT.md").read_text()
    # The table's sweep time is its sweeps' own, also when a later command reads them back.
    saved = (tmp_path / "field" / "sweeps").glob("*/sweep.json")
    own = sum(json.loads(f.read_text())["meta"]["wall_s"] for f in saved)
    assert own > 0 and doc["wall_s"] == pytest.approx(own)
    assert f"Sweeps: {own:.0f} s, each its own wall time" in text
    reproduce("field", preset, tmp_path, log=lambda s: None, methods=["fedavg"])
    again = json.loads((tmp_path / "field_pairs.json").read_text())
    assert again["wall_s"] == pytest.approx(own) and again["command_s"] < doc["command_s"]


def test_docs_list_every_methods_grid():
    """docs/algorithms.md's table of the comparison table's grids is the registry's."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "algorithms.md").read_text()
    section = doc.split("## Tuning in the comparison table", 1)[1].split("\n## ", 1)[0]
    listed = [line for line in section.splitlines() if line.startswith("| `")]
    want = []
    for m in field_methods():
        alg = get_algorithm(m)
        grid = field_grid(alg)
        own = [f"`{k.split('.', 1)[1]}` {', '.join(map(str, v))}" for k, v in grid.items()
               if k != "lr"]  # fmt: skip
        lrs = ", ".join(map(str, grid["lr"]))
        want.append(f"| `{m}` | {alg.family} | {lrs} | {own[0] if own else 'none'} |")
    assert listed == want
