"""The decentralized study (`reproduce.decentralized`): its summary from cells (quick) and a
small study end to end, resumed (slow)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pfedwn_jax.reproduce import decentralized as dz
from pfedwn_jax.results.paired import holm, paired_t


def fake_cells(accuracy: dict[str, list[float]], nodes: int = 100) -> dict:
    """Cells of 3 seeds at `nodes` nodes, ideal links, with the given accuracies."""
    out = {}
    for seed in range(3):
        methods = {
            m: {"accuracy": accuracy[m][seed], "consensus": [2.0, 1.0 + seed]} for m in dz.METHODS
        }
        row = {"nodes": nodes, "failure": 0.0, "seed": seed, "rounds": 2, "methods": methods}
        out[f"{nodes}/0/{seed}"] = {**row, "n_test": 1000, "wall_s": 1.0}
    return out


def test_the_summary_pairs_each_method_with_local_by_seed_under_holm():
    acc = {"dpsgd": [0.70, 0.72, 0.71], "pushsum": [0.60, 0.61, 0.65],
           "pfedwn": [0.80, 0.50, 0.66], "local": [0.60, 0.62, 0.61]}  # fmt: skip
    cells = {**fake_cells(acc), **fake_cells(acc, nodes=1000)}
    summary = dz.summarize(cells)
    assert summary["comparisons"] == 6  # 3 methods x 2 cells
    row = summary["cells"][0]
    assert row["nodes"] == 100 and row["seeds"] == [0, 1, 2]
    assert row["consensus"]["local"] == pytest.approx(2.0)  # mean of the seeds' last rounds
    want = paired_t(acc["dpsgd"], acc["local"], 1000)
    got = row["vs_local"]["dpsgd"]
    assert got["diff"] == pytest.approx(0.1) and got["low"] == pytest.approx(want["low"])
    ps = [c["vs_local"][m]["p"] for c in summary["cells"] for m in dz.METHODS[:-1]]
    adjusted = [c["vs_local"][m]["p_holm"] for c in summary["cells"] for m in dz.METHODS[:-1]]
    np.testing.assert_allclose(adjusted, holm(ps))
    assert got["separated"] and not row["vs_local"]["pfedwn"]["separated"]


def test_the_cells_are_the_nodes_axis_then_the_failure_axis():
    assert dz.cells((10, 20), (0.0, 0.5), 20) == [(10, 0.0), (20, 0.0), (20, 0.5)]


@pytest.mark.slow
def test_a_small_study_runs_writes_its_files_and_resumes(tmp_path, monkeypatch):
    argv = [str(tmp_path), "--nodes", "12", "--failures", "0.5", "--failure-nodes", "12"]
    argv += ["--seeds", "0", "1", "--rounds", "2"]
    dz.main(argv)
    cells = json.loads((tmp_path / "cells.json").read_text())
    assert sorted(cells) == ["12/0.5/0", "12/0.5/1", "12/0/0", "12/0/1"]
    for cell in cells.values():
        for m in dz.METHODS:
            assert 0.0 <= cell["methods"][m]["accuracy"] <= 1.0
            assert len(cell["methods"][m]["consensus"]) == 2
        assert cell["methods"]["local"]["consensus"][0] > 0  # local models drift apart
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["comparisons"] == 6 and (tmp_path / "decentralized.png").exists()
    monkeypatch.setattr(dz, "run_cell", lambda *a: pytest.fail("a finished cell ran again"))
    dz.main(argv)
