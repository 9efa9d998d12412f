"""`pfedwn_jax.reproduce` and `scripts/reproduce.py`: hyperparameters are chosen on
the validation split only, the tables' statistics match a hand computation, and the presets
write every artifact with the chosen values and seeds."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.reproduce import learning, presets, runs, tables
from pfedwn_jax.reproduce.cases import paper_cases
from pfedwn_jax.reproduce.paper_numbers import PAPER_MAX
from pfedwn_jax.results.sweep import SweepResult

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- choosing
def _table(val: dict, test: dict, rounds: int = 3) -> SweepResult:
    """A hand-made sweep: case "A", lr in {0.1, 0.2}, seeds {0, 1}, method fedavg; `val` and
    `test` map (lr, seed) to the per-round accuracy (constant over rounds)."""
    cols: dict[str, list] = {k: [] for k in ("run", "seed", "case", "lr", "method", "round")}
    for k in ("target_accuracy", "target_loss", "mean_client_accuracy", "diverged"):
        cols[k] = []
    cols["target_val_accuracy"] = []
    for run, (lr, seed) in enumerate(itertools.product((0.1, 0.2), (0, 1))):
        for r in range(1, rounds + 1):
            cols["run"].append(run)
            cols["seed"].append(seed)
            cols["case"].append("A")
            cols["lr"].append(lr)
            cols["method"].append("fedavg")
            cols["round"].append(r)
            cols["target_accuracy"].append(test[lr, seed] + 0.01 * r)
            cols["target_loss"].append(1.0)
            cols["mean_client_accuracy"].append(0.5)
            cols["diverged"].append(False)
            cols["target_val_accuracy"].append(val[lr, seed])
    arrays = {k: np.asarray(v) for k, v in cols.items()}
    arrays["diverged"] = arrays["diverged"].astype(bool)
    return SweepResult(arrays, ("case", "lr"), {})


def test_choose_uses_validation_not_test_and_matches_hand_statistics():
    # validation prefers lr 0.1, the test split would prefer lr 0.2: 0.1 must be chosen
    val = {(0.1, 0): 0.9, (0.1, 1): 0.8, (0.2, 0): 0.5, (0.2, 1): 0.6}
    test = {(0.1, 0): 0.40, (0.1, 1): 0.50, (0.2, 0): 0.95, (0.2, 1): 0.97}
    (row,) = runs.choose(_table(val, test), ["lr"], window=2, label={"dataset": "D"})
    assert row["chosen"] == {"lr": 0.1} and row["seeds"] == [0, 1] and row["n"] == 2
    assert row["dataset"] == "D" and row["case"] == "A" and row["method"] == "fedavg"
    assert row["val_last_mean"] == pytest.approx(85.0)
    finals = np.array([0.43, 0.53]) * 100  # round 3 of each seed
    lasts = np.array([0.425, 0.525]) * 100  # mean of rounds 2 and 3
    for key, x in (("final", finals), ("max", finals), ("last", lasts)):
        half = stats.t.ppf(0.975, 1) * x.std(ddof=1) / np.sqrt(2)
        assert row[f"{key}_mean"] == pytest.approx(x.mean(), rel=1e-5)
        assert row[f"{key}_ci_high"] - row[f"{key}_mean"] == pytest.approx(half, rel=1e-4)


def _acc_sweep(acc, variant=None):
    """Two rounds per seed; round 2's target accuracy is `acc[seed]` (round 1: 0)."""
    cols = {"seed": [], "case": [], "lr": [], "method": [], "round": [], "target_accuracy": []}
    for seed, a in enumerate(acc):
        for r in (1, 2):
            for k, v in zip(cols, (seed, "A", 0.1, "pfedwn", r, a if r == 2 else 0.0),
                            strict=True):  # fmt: skip
                cols[k].append(v)
    if variant is not None:
        cols["variant"] = [variant] * len(cols["seed"])
    n = len(cols["seed"])
    cols.update(run=cols["seed"], target_loss=[1.0] * n, mean_client_accuracy=[0.5] * n,
                diverged=[False] * n)  # fmt: skip
    swept = ("case", "lr") + (() if variant is None else ("variant",))
    return SweepResult({k: np.asarray(v) for k, v in cols.items()}, swept, {})


def test_paired_variants_difference_per_seed_by_hand():
    sweeps = {("D", "pfedwn"): (_acc_sweep([0.5, 0.6, 0.7]), []),
              ("D", "pfedwn variants"): (_acc_sweep([0.6, 0.6, 0.9], "v1"), [])}  # fmt: skip
    rows = [{"dataset": "D", "case": "A", "method": "pfedwn", "chosen": {"lr": 0.1}},
            {"dataset": "D", "case": "A", "method": "pfedwn (v1)", "variant": "v1",
             "chosen": {"lr": 0.1}}]  # fmt: skip
    (pair,) = tables.paired_variants(rows, sweeps, window=1)
    diffs = np.array([10.0, 0.0, 20.0])
    assert pair["diffs"] == pytest.approx(diffs, abs=1e-4) and pair["n"] == 3
    assert pair["diff_mean"] == pytest.approx(10.0, abs=1e-4)
    half = stats.t.ppf(0.975, 2) * diffs.std(ddof=1) / np.sqrt(3)
    assert pair["diff_half_width"] == pytest.approx(half, rel=1e-4)
    assert "| v1 | +10.0 ± 24.8 |" in tables.paired_table([pair])


def test_best_ranks_nan_lowest_and_keeps_the_first_of_ties():
    entries = [{"last_mean": np.nan}, {"last_mean": 0.5}, {"last_mean": 0.7}, {"last_mean": 0.7}]
    assert runs.best_entry(entries) is entries[2]
    assert runs.best_entry([{"last_mean": np.nan}, {"last_mean": -1.0}])["last_mean"] == -1.0


def test_markdown_table_bolds_the_best_mean_per_column():
    def row(method, m):
        return {"method": method, "case": "Case 1", "dataset": "MNIST",
                "max_mean": m, "max_ci_high": m + 1.0}  # fmt: skip

    text = tables.markdown_table([row("local", 90.0), row("pfedwn", 95.0)], "max")
    assert "| pfedwn | **95.0 ± 1.0** |" in text and "| local | 90.0 ± 1.0 |" in text
    side = tables.markdown_table([row("local", 90.0), row("pfedwn", 95.0)], "max", PAPER_MAX)
    assert "| local | 98.3 / 90.0 ± 1.0 |" in side  # Table II, Case 1 MNIST, Local
    assert "| pfedwn | 98.4 / **95.0 ± 1.0** |" in side


def test_paper_numbers_are_the_printed_tables():
    assert len(PAPER_MAX) == 9 + 3 and all(len(v) == 6 for v in PAPER_MAX.values())
    assert PAPER_MAX[("Case 1", "CIFAR-10")]["fedavg"] == 16.0  # the text's "falls to 16.0%"
    assert PAPER_MAX[("Case 2", "CIFAR-100")]["pfedwn"] == 58.8
    assert PAPER_MAX[("20 neighbors", "CIFAR-10")]["fedamp"] == 58.1


# ---------------------------------------------------------------------------- cases, input
def test_settings_are_the_paper_cases_the_20_neighbor_case_and_fig1s_full_network():
    base = ExperimentConfig(algorithms=("local",), num_neighbors=4)
    sts = {s.name: s.config for s in runs.settings(base, ("cases", "n20", "all"))}
    assert list(sts) == ["Case 1", "Case 2", "Case 3", "20 neighbors", "all clients"]
    for name, case in zip(("Case 1", "Case 2", "Case 3"), paper_cases(base), strict=True):
        cfg = sts[name]
        assert (cfg.gamma_th, cfg.target, cfg.topology_seed) == (
            case.gamma_th, case.target, case.topology_seed)  # fmt: skip
        assert cfg.num_neighbors == 10 and cfg.selection
    assert sts["20 neighbors"].num_neighbors == 20 and sts["20 neighbors"].gamma_th == 10.0
    full = sts["all clients"]
    assert not full.selection and full.topology_seed == sts["Case 1"].topology_seed


def test_bad_items_and_presets_name_the_allowed_values():
    assert learning.parse_items("table2, fig8") == ("fig8", "table2")
    assert learning.parse_items(None) == learning.ALL_ITEMS
    with pytest.raises(ValueError, match=r"table9.*allowed"):
        learning.parse_items("table2,table9")
    with pytest.raises(ValueError, match="preset must be one of"):
        presets.get_preset("huge")


def test_quick_preset_reads_only_local_files_and_tunes_every_method():
    q = presets.PRESETS["quick"]
    assert {s.dataset.split(":", 1)[0] for s in q.datasets} == {"npz"}
    assert set(q.grids) == set(presets.METHODS) and all("lr" in g for g in q.grids.values())
    assert q.base["val_fraction"] > 0


# ---------------------------------------------------------------------------- end to end
def _csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _check_table(path: Path, preset: presets.Preset) -> None:
    rows = _csv_rows(path)
    assert rows
    for r in rows:
        chosen = json.loads(r["chosen"])
        grid = preset.grids["pfedwn" if r["method"].startswith("pfedwn") else r["method"]]
        assert set(chosen) == set(grid) and all(chosen[k] in grid[k] for k in chosen)
        assert [int(s) for s in r["seeds"].split()] == list(preset.seeds)
        cfg = json.loads(r["config"])
        assert cfg["seed"] == preset.seeds[0] and cfg["lr"] == chosen["lr"]
        assert float(r["max_ci_low"]) <= float(r["max_mean"]) <= float(r["max_ci_high"])


def test_small_preset_writes_tables_and_fig8(tmp_path, monkeypatch):
    """A cut-down tiny preset (pFedWN only, no variants) through `reproduce`; Fig. 8 reads
    the Table II sweep's records (no run of its own)."""
    import pfedwn_jax.api as api

    monkeypatch.setattr(api, "run", lambda *a, **k: pytest.fail("Fig. 8 ran a run()"))
    p = dataclasses.replace(presets.PRESETS["tiny"], methods=("pfedwn",), variants=())
    out = learning.reproduce("table2,fig8", p, tmp_path, log=lambda s: None)
    for name in ("table2.csv", "table2.json", "fig8_pi.json", "REPORT.md"):
        assert (tmp_path / name).is_file(), name
    assert set(out["items"]) == {"table2", "fig8"}
    _check_table(tmp_path / "table2.csv", p)
    assert len(_csv_rows(tmp_path / "table2.csv")) == 3  # three cases x one method
    fig8 = json.loads((tmp_path / "fig8_pi.json").read_text())
    pi, trace = np.asarray(fig8["pi"]), np.asarray(fig8["trace"])
    assert np.allclose(pi[-1].sum(), 1.0, atol=1e-5)  # estimated weights sum to one
    assert pi.shape[1] == trace.shape[1] == len(fig8["neighbors"])
    np.testing.assert_allclose(trace[-1], pi[fig8["estimated_round"] - 1])  # final = pi
    assert (tmp_path / "sweeps" / "mnist_pfedwn" / "rows.csv").is_file()
    assert "Table II" in (tmp_path / "REPORT.md").read_text()


def test_fig7_shows_the_capped_partition_the_runs_train_on(tmp_path):
    tiny = presets.PRESETS["tiny"]  # embedded MNIST, at most 40 samples per client
    rec = learning.wireless_item("fig7", tmp_path, tiny)
    assert rec["config"]["max_samples_per_client"] == 40 and rec["config"]["dataset"] is None
    counts = np.loadtxt(tmp_path / "fig7_counts.csv", delimiter=",", skiprows=1, dtype=int)
    assert counts[:, -1].max() == 40 and (counts[:, 1:-1].sum(1) == counts[:, -1]).all()


@pytest.mark.slow
def test_tiny_preset_end_to_end_through_the_script(tmp_path):
    """`scripts/reproduce.py --preset tiny` with every learning item (about 2.5 minutes)."""
    items = "table2,em,table3,fig1,fig8,fig9"
    cmd = [sys.executable, str(ROOT / "scripts" / "reproduce.py"), "--only", items,
           "--preset", "tiny", "--out", str(tmp_path)]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=600)
    names = ("table2.csv", "table2.json", "table3.csv", "table3.json", "fig1.csv", "fig9.csv",
             "fig8_pi.json", "REPORT.md")  # fmt: skip
    for name in names:
        assert (tmp_path / name).is_file(), name
    for png in ("fig1_target_vs_global.png", "fig8_em_weights.png", "fig9_10_vs_20_neighbors.png"):
        assert (tmp_path / png).stat().st_size > 1000, png
    tiny = presets.PRESETS["tiny"]
    _check_table(tmp_path / "table2.csv", tiny)
    _check_table(tmp_path / "table3.csv", tiny)
    methods = [r["method"] for r in _csv_rows(tmp_path / "table2.csv")]
    assert sorted(methods) == sorted(presets.METHODS * 3)  # three cases x six methods
    _check_table(tmp_path / "em_variants.csv", tiny)
    variants = [r["method"] for r in _csv_rows(tmp_path / "em_variants.csv")]
    assert len(variants) == 3 * 3 and all(m.startswith("pfedwn (") for m in variants)
    pairs = json.loads((tmp_path / "em_pairs.json").read_text())["pairs"]
    assert len(pairs) == 3 * 3 and all(p["n"] == len(tiny.seeds) for p in pairs)
    local = json.loads((tmp_path / "paired_to_local.json").read_text())["pairs"]
    assert len(local) == 5 * 4  # five methods x (three cases + the 20-neighbor network)
    report = (tmp_path / "REPORT.md").read_text()
    assert "Table III" in report and "Chosen hyperparameters" in report


def test_a_saved_sweep_with_the_same_runs_is_read_back_not_rerun(tmp_path, monkeypatch):
    base = ExperimentConfig(model="logreg", rounds=1, algorithms=("local",), num_neighbors=2,
                            max_samples_per_client=30, val_fraction=0.2, data_seed=0)  # fmt: skip
    sts = [runs.Setting("A", base)]
    first, _ = runs.run_settings(sts, {"lr": (0.1,)}, (0,), cache=tmp_path)
    import pfedwn_jax.api as api

    def boom(*a, **k):
        raise AssertionError("ran again")

    monkeypatch.setattr(api, "sweep", boom)
    again, _ = runs.run_settings(sts, {"lr": (0.1,)}, (0,), cache=tmp_path)
    assert np.array_equal(again.rows["target_accuracy"], first.rows["target_accuracy"])
    with pytest.raises(AssertionError, match="ran again"):  # other runs: not the saved sweep
        runs.run_settings(sts, {"lr": (0.2,)}, (0,), cache=tmp_path)


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_every_preset_grid_point_is_a_valid_config(name):
    """Each preset's per-method base config and grid points pass `ExperimentConfig`'s checks
    (no data is loaded): a typo in the never-run `paper` preset fails here, not on a GPU."""
    from pfedwn_jax.experiment.grid import expand, run_config

    p = presets.PRESETS[name]
    for spec in p.datasets:
        for m in p.methods:
            base = runs.dataset_base(p, spec, m)
            for point in expand(base, [0], p.grids[m]):  # validates every point
                cfg = run_config(base, point)
                assert cfg.algorithms == (m,) and cfg.val_fraction > 0
