"""The `mnist-full` preset, the pairing of every method with Local, pFedWN's EM readings at
fixed points, the crossover study and `--data-dir`: statistics against hand computations
(hand-made sweeps, or the saved rows of a real tiny run), the preset against the issue's
protocol."""

from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from pfedwn_jax.reproduce import crossover, learning, presets, runs, tables
from pfedwn_jax.reproduce.presets import DataSpec
from pfedwn_jax.results.sweep import SweepResult

ROOT = Path(__file__).resolve().parents[1]


def _sweep(per_seed: dict, swept: tuple[str, ...], val: dict | None = None) -> SweepResult:
    """A hand-made sweep of two rounds per run: `per_seed[(labels..., seed)] = (method,
    round-2 test accuracy)`, round 1 at 0; validation accuracy `val[labels...]` (constant)."""
    cols: dict[str, list] = {k: [] for k in ("run", "seed", *swept, "method", "round")}
    for k in ("target_accuracy", "target_val_accuracy", "target_loss", "mean_client_accuracy"):
        cols[k] = []
    cols["diverged"] = []
    for run, (key, (method, acc)) in enumerate(per_seed.items()):
        *labels, seed = key
        for r in (1, 2):
            for k, v in zip(swept, labels, strict=True):
                cols[k].append(v)
            cols["run"].append(run)
            cols["seed"].append(seed)
            cols["method"].append(method)
            cols["round"].append(r)
            cols["target_accuracy"].append(acc if r == 2 else 0.0)
            cols["target_val_accuracy"].append((val or {}).get(tuple(labels), 0.5))
            cols["target_loss"].append(1.0)
            cols["mean_client_accuracy"].append(0.5)
            cols["diverged"].append(False)
    arrays = {k: np.asarray(v) for k, v in cols.items()}
    arrays["diverged"] = arrays["diverged"].astype(bool)
    return SweepResult(arrays, swept, {})


def _half(d: np.ndarray) -> float:
    return float(stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size))


# ---------------------------------------------------------------------------- pairing
def test_every_method_minus_local_is_paired_by_seed():
    local = _sweep({("A", 0.1, s): ("local", a) for s, a in enumerate([0.50, 0.70, 0.60])},
                   ("case", "lr"))  # fmt: skip
    mine = _sweep({("A", 0.2, s): ("fedavg", a) for s, a in enumerate([0.55, 0.72, 0.70])},
                  ("case", "lr"))  # fmt: skip
    rows = [{"dataset": "D", "case": "A", "method": "local", "chosen": {"lr": 0.1}},
            {"dataset": "D", "case": "A", "method": "fedavg", "chosen": {"lr": 0.2}},
            {"dataset": "D", "case": "all clients", "method": "fedavg",
             "chosen": {"lr": 0.2}}]  # fmt: skip
    sweeps = {("D", "local"): (local, []), ("D", "fedavg"): (mine, [])}
    (pair,) = tables.paired_to_local(rows, sweeps, window=1)  # no Local row: not paired
    diffs = np.array([5.0, 2.0, 10.0])
    assert pair["variant"] == "fedavg" and pair["case"] == "A" and pair["n"] == 3
    assert pair["diffs"] == pytest.approx(diffs, abs=1e-4)
    assert pair["diff_mean"] == pytest.approx(diffs.mean(), abs=1e-4)
    assert pair["diff_half_width"] == pytest.approx(_half(diffs), rel=1e-4)
    assert pair["mean"] == pytest.approx(65.66667, abs=1e-3)
    assert pair["base_mean"] == pytest.approx(60.0, abs=1e-4)
    # the pairing is narrower than the unpaired intervals: the seeds' spread cancels
    assert pair["diff_half_width"] < _half(np.array([55.0, 72.0, 70.0]))


def test_paired_ignores_unmatched_seeds():
    got = tables.paired({0: 1.0, 1: 2.0, 2: 4.0}, {1: 1.0, 2: 1.0, 3: 9.0})
    assert got["n"] == 2 and got["diffs"] == [1.0, 3.0] and got["diff_mean"] == 2.0
    assert np.isnan(tables.paired({0: 1.0}, {0: 0.5})["diff_half_width"])


def test_fixed_points_are_the_fixed_a_and_the_chosen_a():
    assert presets.FIXED_A == 0.9
    assert runs.fixed_points(0.9) == [("a=0.9 (chosen)", 0.9)]
    assert runs.fixed_points(0.95) == [("a=0.9", 0.9), ("chosen a=0.95", 0.95)]
    assert runs.fixed_points(1.0) == [("a=0.9", 0.9)]  # a = 1: Local, whatever pi


# ---------------------------------------------------------------------------- the preset
def test_mnist_full_preset_follows_the_protocol(monkeypatch):
    p = presets.PRESETS["mnist-full"]
    (spec,) = p.datasets
    assert spec.label == "MNIST" and spec.max_samples is None
    assert spec.dataset.endswith("mnist.npz") or spec.dataset == "mnist"
    assert p.base["rounds"] >= 30 and p.base["local_epochs"] == 1 and p.base["val_fraction"] > 0
    assert len(p.seeds) == 5 and set(p.grids) == set(presets.METHODS) == set(p.methods)
    assert all("lr" in g for g in p.grids.values())
    # the same tuning budget for every method, each over its own hyperparameters
    points = {m: int(np.prod([len(v) for v in g.values()])) for m, g in p.grids.items()}
    assert set(points.values()) == {presets.FULL_POINTS}, points
    own = {"fedprox": "fedprox.mu", "perfedavg": "perfedavg.alpha", "pfedwn": "pfedwn.a"}
    assert all(key in p.grids[m] for m, key in own.items())
    assert "fedamp.sigma_scale" in p.grids["fedamp"]
    assert {0.9, 1.0} <= set(p.grids["pfedwn"]["pfedwn.a"])  # a = 1 is Local: a < 1 reported
    assert p.criterion == "similarity" and p.variant_points == "fixed"
    assert {"pi_from": "components"} in p.em_variants
    base = runs.dataset_base(p, spec, "local")
    assert base.model == "mlp"  # this machine: a CPU
    import jax

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert runs.dataset_base(p, spec, "local").model == "cnn"


def test_the_preset_caps_the_runs_per_program(monkeypatch):
    """`Preset.max_runs` reaches `sweep` for every sweep (mnist-full's 150 pFedWN runs
    in one plan once outgrew a shared machine's memory)."""
    import pfedwn_jax.api as api

    seen = []

    def fake(configs, **kw):
        seen.append(kw["max_runs"])
        raise RuntimeError("stop")

    monkeypatch.setattr(api, "sweep", fake)
    p = dataclasses.replace(presets.PRESETS["tiny"], max_runs=3, methods=("local",))
    with pytest.raises(RuntimeError, match="stop"):
        runs.run_tables(p, ("table2",), Path("/nonexistent-out"), log=lambda s: None)
    assert seen == [3] and presets.PRESETS["mnist-full"].max_runs == 10
    assert presets.PRESETS["quick"].max_runs is None


def test_fixed_variants_need_the_fixed_a_in_the_grid():
    p = presets.PRESETS["mnist-full"]
    grids = {**p.grids, "pfedwn": {"lr": (0.1,), "pfedwn.a": (0.5,)}}
    with pytest.raises(ValueError, match=r"a = 0\.9"):
        dataclasses.replace(p, grids=grids)
    with pytest.raises(ValueError, match="criterion"):
        dataclasses.replace(p, criterion="labels")


# ---------------------------------------------------------------------------- --data-dir
def test_with_data_dir_finds_npz_files_and_tfds_folders(tmp_path):
    paper = presets.PRESETS["paper"]
    (tmp_path / "mnist.npz").write_bytes(b"")
    (tmp_path / "cifar10").mkdir()
    with pytest.raises(ValueError, match=r"cifar100\.npz.*CIFAR-100"):
        presets.with_data_dir(paper, tmp_path)
    (tmp_path / "cifar100.npz").write_bytes(b"")
    got = presets.with_data_dir(paper, tmp_path)
    names = [s.dataset for s in got.datasets]
    assert names == [f"npz:{tmp_path / 'mnist.npz'}", "cifar10", f"npz:{tmp_path / 'cifar100.npz'}"]
    assert got.base["data_dir"] == str(tmp_path) and got.grids == paper.grids
    with pytest.raises(ValueError, match="not a folder"):
        presets.with_data_dir(paper, tmp_path / "nowhere")


def _data_dir(tmp_path: Path) -> Path:
    """A folder holding `mnist.npz` (a copy of the embedded MNIST subset)."""
    from pfedwn_jax.data.datasets import EMBEDDED_DIR

    data = tmp_path / "data"
    data.mkdir()
    (data / "mnist.npz").write_bytes((EMBEDDED_DIR / "mnist_embedded.npz").read_bytes())
    return data


def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "reproduce_script", ROOT / "scripts" / "reproduce.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_tiny_preset_reads_its_data_from_data_dir(tmp_path, capsys):
    """Fig. 7 reads the partition the runs train on: with `with_data_dir` its config names
    the file given, not the embedded data; the script refuses a missing folder at once."""
    data = _data_dir(tmp_path)
    p = presets.with_data_dir(presets.PRESETS["tiny"], data)
    rec = learning.wireless_item("fig7", tmp_path, p)
    assert rec["config"]["dataset"] == f"npz:{data.resolve() / 'mnist.npz'}"
    bad = ["--preset", "tiny", "--data-dir", str(tmp_path / "none"), "--out", str(tmp_path)]
    assert _script().main(bad) == 2  # one line, before any work
    assert "not a folder" in capsys.readouterr().err


@pytest.mark.slow
def test_script_runs_table2_from_data_dir(tmp_path):
    """`scripts/reproduce.py --preset tiny --data-dir DIR --only table2` (about a minute):
    every row's config reads DIR's file."""
    data, out = _data_dir(tmp_path), tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "scripts" / "reproduce.py"), "--only", "table2",
           "--preset", "tiny", "--data-dir", str(data), "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=600)
    rows = _csv(out / "table2.csv")
    assert len(rows) == 3 * len(presets.METHODS)
    for r in rows:
        assert json.loads(r["config"])["dataset"] == f"npz:{data.resolve() / 'mnist.npz'}"


# ---------------------------------------------------------------------------- crossover
def test_class_share_by_hand():
    counts = np.array([[50, 30, 20, 0], [0, 100, 0, 0], [1, 0, 0, 99], [0, 0, 3, 97]])
    # neighbor 1 holds class 1; neighbor 2 holds class 3 and (1%) class 0: below 5%
    assert crossover.class_share(counts, 0, [1, 2]) == pytest.approx(0.3)
    assert crossover.class_share(counts, 0, [1, 2], hold=0.01) == pytest.approx(0.8)
    assert crossover.class_share(counts, 0, [3]) == pytest.approx(0.0)  # 3% of class 2


def test_crossover_rows_pair_with_local_and_choose_a_on_validation():
    seeds = (0, 1, 2)
    local_acc = {0: 0.60, 1: 0.70, 2: 0.65}
    pf = {0.5: {0: 0.70, 1: 0.72, 2: 0.80}, 0.9: {0: 0.62, 1: 0.71, 2: 0.66}}
    case = dataclasses.make_dataclass("C", ["name", "target"])("T", 0)
    label = crossover._label("counts", case)
    local = _sweep({(label, 50, s): ("local", local_acc[s]) for s in seeds}, ("case", "cap"),
                   {(label, 50): 0.6})  # fmt: skip
    val = {(label, 50, 0.5): 0.7, (label, 50, 0.9): 0.65}
    pfedwn = _sweep({(label, 50, a, s): ("pfedwn", pf[a][s]) for a in pf for s in seeds},
                    ("case", "cap", "pfedwn.a"), val)  # fmt: skip
    cross = presets.Crossover(caps=(50,), seeds=seeds, rounds=2, lr=0.1, a=(0.5, 0.9),
                              methods=("local",))  # fmt: skip
    sizes = {(label, 50): {"criterion": "counts", "target": 0, "train_samples": 30,
                           "class_share": 0.5, "best_overlap": 0.4}}  # fmt: skip
    rows = crossover.crossover_rows({"local": local, "pfedwn": pfedwn}, [("counts", case)],
                                    sizes, cross, window=1)  # fmt: skip
    by = {r["method"]: r for r in rows}
    assert set(by) == {"local", "pfedwn (a=0.5)", "pfedwn (a=0.9)", crossover.CHOSEN}
    d = 100 * (np.array([pf[0.5][s] for s in seeds]) - np.array([local_acc[s] for s in seeds]))
    assert by["pfedwn (a=0.5)"]["diff_mean"] == pytest.approx(d.mean(), abs=1e-4)
    assert by["pfedwn (a=0.5)"]["diff_half_width"] == pytest.approx(_half(d), rel=1e-4)
    assert by[crossover.CHOSEN]["chosen_a"] == 0.5  # best validation: 0.7 > 0.65 > Local 0.6
    assert by[crossover.CHOSEN]["diff_mean"] == by["pfedwn (a=0.5)"]["diff_mean"]
    x = 100 * np.array([local_acc[s] for s in seeds])
    assert by["local"]["mean"] == pytest.approx(x.mean(), abs=1e-4)
    assert by["local"]["ci_high"] - by["local"]["mean"] == pytest.approx(_half(x), rel=1e-4)
    assert by["local"]["diff_mean"] == 0.0 and by["local"]["train_samples"] == 30


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _last(rows_csv: Path, window: int, **cond) -> dict[int, float]:
    """Per seed, the mean target test accuracy (%) of the last `window` rounds of the saved
    rows matching `cond`."""
    rows = [r for r in _csv(rows_csv) if all(str(r[k]) == str(v) for k, v in cond.items())]
    last = max(int(r["round"]) for r in rows) - window
    out: dict[int, list[float]] = {}
    for r in (r for r in rows if int(r["round"]) > last):
        out.setdefault(int(r["seed"]), []).append(100 * float(r["target_accuracy"]))
    return {s: float(np.mean(v)) for s, v in out.items()}


@pytest.mark.slow
def test_crossover_and_fixed_em_readings_end_to_end(tmp_path):
    """The tiny preset's crossover and pFedWN with the EM readings at fixed points (about
    two minutes): every pair recomputed by hand from the saved per-round rows."""
    tiny = presets.PRESETS["tiny"]
    p = dataclasses.replace(tiny, methods=("pfedwn",), grids={"pfedwn": {"lr": (0.1,),
                            "pfedwn.a": (0.5, 0.9)}}, em_variants=presets.EM_READINGS,
                            variant_points="fixed")  # fmt: skip
    out = learning.reproduce("table2,em,crossover", p, tmp_path, log=lambda s: None)
    pairs = json.loads((tmp_path / "em_pairs.json").read_text())["pairs"]
    chosen = {r["case"]: r["chosen"]["pfedwn.a"] for r in out["tables"] if r["method"] == "pfedwn"}
    assert len(pairs) == sum(len(runs.fixed_points(a)) for a in chosen.values()) * 2
    main = tmp_path / "sweeps" / "mnist_pfedwn" / "rows.csv"
    var = tmp_path / "sweeps" / "mnist_pfedwn_variants" / "rows.csv"
    for pair in pairs:
        name, point = pair["variant"].split("; ")
        a = dict(runs.fixed_points(chosen[pair["case"]]))[point]
        mine = _last(var, p.window, case=pair["case"], variant=name, point=point)
        base = _last(main, p.window, case=pair["case"], lr=0.1, **{"pfedwn.a": a})
        want = [mine[s] - base[s] for s in sorted(mine)]
        assert pair["diffs"] == pytest.approx(want, abs=1e-3)
    cross = _csv(tmp_path / "crossover.csv")
    assert len(cross) == 3 * 2 * (1 + 1 + 1)  # cases x caps x (local, pfedwn a=0.5, chosen)
    local = tmp_path / "sweeps" / "crossover_local" / "rows.csv"
    pfw = tmp_path / "sweeps" / "crossover_pfedwn" / "rows.csv"
    for r in (r for r in cross if r["method"] == "pfedwn (a=0.5)"):
        cap = 0 if r["cap"] == "none" else int(r["cap"])
        mine = _last(pfw, p.window, case=r["case"], cap=cap)
        base = _last(local, p.window, case=r["case"], cap=cap)
        d = np.array([mine[s] - base[s] for s in sorted(mine)])
        assert float(r["diff_mean"]) == pytest.approx(d.mean(), abs=1e-3)
    assert (tmp_path / "crossover.png").stat().st_size > 1000
    report = (tmp_path / "REPORT.md").read_text()
    assert "Where collaboration pays" in report and "## Cases" in report


def test_crossover_cases_take_each_target_once(monkeypatch):
    case = dataclasses.make_dataclass("C", ["name", "target"])
    by = {"counts": [case("Case 1", 0), case("Case 2", 1)],
          "similarity": [case("Case 1", 5), case("Case 2", 1)]}  # fmt: skip
    monkeypatch.setattr(crossover, "table_cases", lambda base, crit: by[crit])
    p = presets.PRESETS["tiny"]
    p = dataclasses.replace(p, crossover=p.crossover._replace(criteria=("counts", "similarity")))
    base, cases = crossover.crossover_cases(p)
    assert [(crit, c.target) for crit, c in cases] == [("counts", 0), ("counts", 1),
                                                        ("similarity", 5)]  # fmt: skip
    assert base.rounds == p.crossover.rounds and base.lr == p.crossover.lr


def test_crossover_needs_a_preset_with_one(tmp_path):
    quick = dataclasses.replace(presets.PRESETS["tiny"], crossover=None)
    said = []
    out = learning.reproduce("crossover", quick, tmp_path, log=said.append)
    assert out["crossover"] is None and "has none" in said[0]


def test_data_spec_defaults_to_one_model():
    spec = DataSpec("MNIST", None, "logreg", 40)
    assert runs.spec_model(spec) == "logreg"


def test_merge_sweeps_shifts_runs_and_records():
    a = _sweep({("A", s): ("pfedwn", 0.5) for s in (0, 1)}, ("case",))
    b = _sweep({("B", s): ("pfedwn", 0.7) for s in (0, 1)}, ("case",))
    a = SweepResult(a.rows, a.swept, {"wall_s": 2.0}, {"1/pfedwn/pi": np.ones(2)})
    b = SweepResult(b.rows, b.swept, {"wall_s": 3.0}, {"0/pfedwn/pi": np.zeros(2)})
    m = runs.merge_sweeps([a, b])
    assert m.num_runs == 4 and m.meta["wall_s"] == 5.0
    assert sorted(m.records) == ["1/pfedwn/pi", "2/pfedwn/pi"]
    np.testing.assert_array_equal(m.record("pi", 2, "pfedwn"), np.zeros(2))
    sel = m.select(case=["B"]).rows
    assert sorted(set(sel["run"].tolist())) == [2, 3] and np.all(
        sel["target_accuracy"][1::2] == 0.7
    )
    assert runs.merge_sweeps([a]) is a


def test_every_preset_has_its_wireless_figures():
    from pfedwn_jax.reproduce import wireless_figs

    assert set(presets.PRESETS) <= set(wireless_figs.PRESETS)


def test_pfedwn_below_one_is_chosen_on_validation_among_a_below_one():
    """Validation prefers a = 1 (Local): the tuned row takes it, the `a < 1` row takes the
    best of the others, and pairs with Local through pFedWN's own sweep."""
    from pfedwn_jax.results.sweep import SweepResult

    val = {0.5: 0.7, 0.9: 0.8, 1.0: 0.9}
    cols: dict[str, list] = {k: [] for k in ("run", "seed", "case", "pfedwn.a", "method",
                                             "round", "target_accuracy", "target_val_accuracy",
                                             "target_loss", "mean_client_accuracy",
                                             "diverged")}  # fmt: skip
    runs_json = []
    for run, (a, seed) in enumerate((a, s) for a in val for s in (0, 1)):
        runs_json.append({"seed": seed, "case": "A", "pfedwn.a": a, "method": "pfedwn",
                          "config": {"a": a, "seed": seed}})  # fmt: skip
        for r in (1, 2):
            for k, v in (("run", run), ("seed", seed), ("case", "A"), ("pfedwn.a", a),
                         ("method", "pfedwn"), ("round", r), ("target_accuracy", 0.5 + a / 10),
                         ("target_val_accuracy", val[a]), ("target_loss", 1.0),
                         ("mean_client_accuracy", 0.5), ("diverged", False)):  # fmt: skip
                cols[k].append(v)
    res = SweepResult({k: np.asarray(v) for k, v in cols.items()}, ("case", "pfedwn.a"), {})
    p = dataclasses.replace(
        presets.PRESETS["tiny"], grids={"pfedwn": {"pfedwn.a": tuple(val)}}, window=2
    )
    label = {"dataset": "D"}
    (tuned,) = runs.choose(res, ["pfedwn.a"], 2, label)
    (below,) = runs.below_one(p, "pfedwn", res, runs_json, label)
    assert tuned["chosen"] == {"pfedwn.a": 1.0}
    assert below["chosen"] == {"pfedwn.a": 0.9} and below["method"] == presets.BELOW_ONE
    assert below["config"] == {"a": 0.9, "seed": 0} and below["sweep_method"] == "pfedwn"
    assert runs.below_one(p, "local", res, runs_json, label) == []
    no_one = dataclasses.replace(p, grids={"pfedwn": {"pfedwn.a": (0.5, 0.9)}})
    assert runs.below_one(no_one, "pfedwn", res, runs_json, label) == []
