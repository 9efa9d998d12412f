"""`SweepResult`: the tidy table of a sweep, its statistics over seeds, files and plots.

Tables are built by hand here (no sweep runs), and every statistic is recomputed by a plain
loop with numpy and scipy (`scipy.stats.t`), independently of the implementation.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import re
import sys
import types

import numpy as np
import pytest
import scipy.stats

from pfedwn_jax.plotting import pyplot
from pfedwn_jax.results.stats import mean_std_ci, student_t_ppf
from pfedwn_jax.results.sweep import COLUMNS, SCHEMA, SweepResult

GRID = {"lr": [0.01, 0.05], "pfedwn.a": [0.3, 0.5, 0.7]}
SEEDS = (0, 1, 2)
METHODS = ("local", "pfedwn")
ROUNDS = 6


def make_rows(seeds=SEEDS, grid=GRID, methods=METHODS, rounds=ROUNDS, rng_seed=0, stop=None):
    """A table in the sweep's layout with random accuracies; `stop = {run: last_round}` ends
    those runs early and marks them diverged from that round on."""
    rng = np.random.default_rng(rng_seed)
    stop = stop or {}
    rows = {k: [] for k in ("run", "seed", *grid, *COLUMNS[2:])}
    points = list(itertools.product(*grid.values()))
    for run, (point, seed) in enumerate(itertools.product(points, seeds)):
        for method in methods:
            last = stop.get(run, rounds)
            for rnd in range(1, last + 1):
                rows["run"].append(run)
                rows["seed"].append(seed)
                for key, value in zip(grid, point):
                    rows[key].append(value)
                rows["method"].append(method)
                rows["round"].append(rnd)
                rows["target_accuracy"].append(rng.uniform(0.3, 0.95))
                rows["target_loss"].append(rng.uniform(0.1, 2.0))
                rows["mean_client_accuracy"].append(rng.uniform(0.3, 0.95))
                rows["diverged"].append(run in stop and rnd == last)
    return {k: np.array(v) for k, v in rows.items()}


def make_result(**kw) -> SweepResult:
    grid = kw.get("grid", GRID)
    meta = {"seeds": list(kw.get("seeds", SEEDS)), "grid": grid, "base": {"rounds": ROUNDS}}
    return SweepResult(make_rows(**kw), tuple(grid), meta)


def reference_summary(rows, swept, window):
    """Per (grid point, method) in order of first appearance: the three per-run statistics
    of target accuracy, by a plain loop over the rows."""
    per_run = {}
    for i in range(len(rows["run"])):
        point = tuple(rows[k][i].item() for k in swept)
        key = (point, str(rows["method"][i]), int(rows["run"][i]))
        per_run.setdefault(key, []).append(
            (int(rows["round"][i]), float(rows["target_accuracy"][i]))
        )
    groups = {}
    for (point, method, _run), series in per_run.items():
        acc = [a for _, a in sorted(series)]
        stats = (acc[-1], float(np.mean(acc[-window:])), max(acc))
        groups.setdefault((point, method), []).append(stats)
    return groups


def scipy_ci(x):
    """(mean, std, low, high) with scipy's t interval; NaN bounds and std 0 for one value."""
    x = np.asarray(x, float)
    if x.size == 1:
        return x[0], 0.0, math.nan, math.nan
    low, high = scipy.stats.t.interval(0.95, x.size - 1, loc=x.mean(), scale=scipy.stats.sem(x))
    return x.mean(), x.std(ddof=1), low, high


# --------------------------------------------------------------------------- statistics
def test_t_quantile_closed_forms_and_table_values():
    # scipy.stats.t.ppf is exact to rounding in scipy 1.17, to ~2e-11 relative in 1.14 (the
    # floor, df = 1): 1e-9 is far below anything an interval over seeds can show.
    # closed forms: Cauchy t = tan(pi (p - 1/2)); df 2: P(|T| <= t) = t / sqrt(2 + t^2)
    assert student_t_ppf(0.975, 1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-9)
    assert student_t_ppf(0.9, 2) == pytest.approx(0.8 * math.sqrt(2 / (1 - 0.64)), rel=1e-9)
    assert student_t_ppf(0.025, 4) == pytest.approx(-2.7764451051977987, rel=1e-9)  # table
    assert student_t_ppf(0.975, 10**6) == pytest.approx(1.959965, rel=1e-6)  # the normal's


@pytest.mark.parametrize(
    "args, message",
    [((0.0, 3), "p must be in (0.0, 1.0)"), ((1.2, 3), "p must be"), ((0.9, 0), "df must be")],
)
def test_t_quantile_rejects_bad_input(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        student_t_ppf(*args)


def test_mean_std_ci_hand_case_and_single_value():
    mean, std, low, high = mean_std_ci([0.5, 0.7, 0.9])
    assert (mean, std) == pytest.approx((0.7, 0.2))
    t2 = 0.95 * math.sqrt(2 / (1 - 0.95**2))  # t_{0.975, 2}: P(|T| <= t) = t / sqrt(2 + t^2)
    half = t2 * 0.2 / math.sqrt(3)
    assert (low, high) == pytest.approx((0.7 - half, 0.7 + half), rel=1e-9)  # see below
    mean, std, low, high = mean_std_ci([0.42])
    assert (mean, std) == (0.42, 0.0) and math.isnan(low) and math.isnan(high)
    assert math.isnan(mean_std_ci([0.5, math.nan])[0])  # NaN is never dropped
    with pytest.raises(ValueError, match="at least one value"):
        mean_std_ci([])


@pytest.mark.parametrize("window", [1, 3, 5, 50])
def test_summary_matches_a_plain_loop_and_scipy(window):
    result = make_result()
    reference = reference_summary(result.rows, result.swept, window)
    summary = result.summary(window)
    assert len(summary) == len(reference) == 6 * 2
    for entry, ((point, method), stats) in zip(summary, reference.items()):
        assert tuple(entry[k] for k in result.swept) == point and entry["method"] == method
        assert entry["n"] == len(SEEDS) and entry["n_diverged"] == 0
        for i, name in enumerate(("final", "last", "max")):
            expected = scipy_ci([s[i] for s in stats])
            got = [entry[f"{name}_{k}"] for k in ("mean", "std", "ci_low", "ci_high")]
            np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_summary_groups_in_order_of_appearance_and_counts_seeds():
    result = make_result(seeds=(5,), grid={"lr": [0.1, 0.01]}, methods=("b", "a"))
    summary = result.summary()
    assert [(e["lr"], e["method"]) for e in summary] == [
        (0.1, "b"),
        (0.1, "a"),
        (0.01, "b"),
        (0.01, "a"),
    ]
    assert all(e["n"] == 1 and e["final_std"] == 0.0 for e in summary)
    assert all(math.isnan(e["final_ci_low"]) and math.isnan(e["max_ci_high"]) for e in summary)
    assert isinstance(summary[0]["lr"], float) and isinstance(summary[0]["n"], int)


def test_summary_of_runs_stopped_by_divergence_uses_their_own_last_rounds():
    # runs 0 and 1 share the grid point lr=0.01 with run 2; both stop early
    result = make_result(grid={"lr": [0.01, 0.05]}, stop={0: 2, 1: 4})
    entry = result.summary(window=3)[0]
    assert entry["n"] == 3 and entry["n_diverged"] == 2
    rows = result.rows
    finals = []
    for run in (0, 1, 2):
        acc = rows["target_accuracy"][(rows["run"] == run) & (rows["method"] == "local")]
        finals.append(acc[-1])
    assert entry["final_mean"] == pytest.approx(np.mean(finals), rel=1e-12)


def test_summary_without_swept_keys_and_unsorted_rows():
    rows = make_rows(grid={})
    perm = np.random.default_rng(1).permutation(len(rows["run"]))
    shuffled = SweepResult({k: v[perm] for k, v in rows.items()}, ())
    summary = shuffled.summary(window=2)
    assert [e["method"] for e in summary] == sorted(METHODS, key=list(rows["method"][perm]).index)
    reference = reference_summary(rows, (), 2)
    for entry in summary:
        stats = reference[((), entry["method"])]
        assert entry["last_mean"] == pytest.approx(np.mean([s[1] for s in stats]), rel=1e-12)


def test_curves_mean_and_band_per_round():
    result = make_result(stop={0: 4})
    curve = result.curves("target_loss")[0]  # lr=0.01, pfedwn.a=0.3, local: runs 0, 1, 2
    rows = result.rows
    np.testing.assert_array_equal(curve["round"], np.arange(1, ROUNDS + 1))
    np.testing.assert_array_equal(curve["n"], [3, 3, 3, 3, 2, 2])
    for r in range(1, ROUNDS + 1):
        sel = (rows["round"] == r) & (rows["method"] == "local") & np.isin(rows["run"], [0, 1, 2])
        expected = scipy_ci(rows["target_loss"][sel])
        got = [curve[k][r - 1] for k in ("mean", "std", "ci_low", "ci_high")]
        np.testing.assert_allclose(got, expected, rtol=1e-12)
    with pytest.raises(ValueError, match="metric must be one of"):
        result.curves("run")


def test_heatmap_values_are_the_mean_final_accuracy():
    result = make_result()
    rows_v, cols_v, cells = result.heatmap_values("pfedwn")
    assert rows_v == GRID["lr"] and cols_v == GRID["pfedwn.a"] and cells.shape == (2, 3)
    r = result.rows
    sel = (r["lr"] == 0.05) & (r["pfedwn.a"] == 0.7) & (r["method"] == "pfedwn")
    finals = [r["target_accuracy"][sel & (r["run"] == run)][-1] for run in np.unique(r["run"][sel])]
    assert cells[1, 2] == pytest.approx(np.mean(finals), rel=1e-12)


# --------------------------------------------------------------------------- validation
def test_missing_columns_and_unequal_lengths_are_named():
    rows = make_rows()
    with pytest.raises(ValueError, match=r"missing column\(s\) \['pfedwn.a', 'diverged'\]"):
        SweepResult(
            {k: v for k, v in rows.items() if k not in ("pfedwn.a", "diverged")}, tuple(GRID)
        )
    short = {**rows, "target_loss": rows["target_loss"][:-1]}
    with pytest.raises(ValueError, match=r"equal lengths.*'target_loss': 215"):
        SweepResult(short, tuple(GRID))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"method": np.arange(216)}, "column 'method' must hold str values; got int64"),
        ({"round": np.full(216, 1.5)}, "column 'round' must hold int/uint values; got float64"),
        ({"diverged": np.zeros(216)}, "column 'diverged' must hold bool values"),
        ({"lr": np.zeros((216, 1))}, "column 'lr' must be 1-D; got shape (216, 1)"),
        ({"round": np.zeros(216, int)}, "column 'round' must be >= 1; got 0"),
        ({"run": np.full(216, -1)}, "column 'run' must be >= 0; got -1"),
        ({"seed": np.arange(216)}, "column 'seed' must be constant within a run; run 0 varies"),
        ({"round": np.ones(216, int)}, "rows repeat (run, method, round) = (0, 'local', 1)"),
    ],
)
def test_bad_columns_are_rejected(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SweepResult({**make_rows(), **change}, tuple(GRID))


def test_bad_swept_and_meta_are_rejected():
    rows = make_rows()
    with pytest.raises(ValueError, match="swept must be distinct key names other than"):
        SweepResult(rows, ("lr", "method"))
    with pytest.raises(ValueError, match="swept must be distinct"):
        SweepResult(rows, ("lr", "lr"))
    with pytest.raises(ValueError, match="meta must be JSON-friendly"):
        SweepResult(rows, tuple(GRID), {"f": object()})


def test_columns_are_ordered_read_only_copies_and_meta_is_json():
    rows = make_rows()
    extra = np.arange(216)
    backwards = {"extra": extra, **dict(reversed(rows.items()))}
    result = SweepResult(backwards, tuple(GRID), {"grid": {"lr": (0.01, 0.05)}})
    assert result.columns == ("run", "seed", "lr", "pfedwn.a", *COLUMNS[2:], "extra")
    assert result.meta == {"grid": {"lr": [0.01, 0.05]}}
    with pytest.raises(ValueError, match="read-only"):
        result.rows["run"][0] = 5
    extra[0] = 99  # the result holds a copy
    assert result.rows["extra"][0] == 0
    assert len(result) == 216 and result.num_runs == 18 and result.methods == METHODS


# --------------------------------------------------------------------------- select
def test_select_filters_rows():
    result = make_result()
    sub = result.select({"pfedwn.a": [0.3, 0.7]}, method="pfedwn", lr=0.05)
    r = result.rows
    keep = (r["method"] == "pfedwn") & (r["lr"] == 0.05) & np.isin(r["pfedwn.a"], [0.3, 0.7])
    for k in result.columns:
        np.testing.assert_array_equal(sub.rows[k], r[k][keep])
    assert sub.swept == result.swept and sub.methods == ("pfedwn",)
    assert sub.meta["selected"] == {"pfedwn.a": [0.3, 0.7], "method": "pfedwn", "lr": 0.05}
    assert sub.select(run=[10, 11]).meta["selected"]["run"] == [10, 11]
    assert len(result.select(method="local", run=0)) == ROUNDS


def test_select_matches_float32_columns_and_reports_bad_conditions():
    rows = make_rows(grid={"lr": [0.01, 0.05]})
    rows["lr"] = rows["lr"].astype(np.float32)
    result = SweepResult(rows, ("lr",))
    assert len(result.select(lr=0.05)) == len(rows["lr"]) // 2
    with pytest.raises(ValueError, match=r"no rows with lr=0.5; present: \[0.0099"):
        result.select(lr=0.5)
    with pytest.raises(ValueError, match=r"select: column must be one of \['run', 'seed', 'lr'"):
        result.select(mu=0.1)


# --------------------------------------------------------------------------- files
def special_result() -> SweepResult:
    """Float32 metrics, NaN and infinite losses, a str-valued and an int-valued swept key."""
    rows = make_rows(grid={"model": ["mlp", "logreg"], "topology_seed": [0, 3]}, seeds=(0, 1))
    rows["target_accuracy"] = rows["target_accuracy"].astype(np.float32)
    rows["target_accuracy"][1] = 0.1  # float32(0.1) = 0.100000001490116...
    rows["target_loss"][[0, 5, 9]] = [np.nan, np.inf, -np.inf]
    rows["diverged"][5] = True
    return SweepResult(rows, ("model", "topology_seed"), {"seeds": [0, 1], "x": None})


def assert_same(a: SweepResult, b: SweepResult) -> None:
    assert a.columns == b.columns and a.swept == b.swept and a.meta == b.meta
    for k in a.columns:
        assert a.rows[k].dtype == b.rows[k].dtype, k
        np.testing.assert_array_equal(a.rows[k], b.rows[k])


def test_json_round_trip_is_exact_including_dtypes(tmp_path):
    result = special_result()
    text = result.to_json()
    assert json.loads(text)["schema"] == SCHEMA
    assert json.loads(text)["rows"]["target_loss"]["values"][5] == "inf"
    assert_same(SweepResult.from_json(text), result)
    path = tmp_path / "sub" / "sweep.json"
    assert result.to_json(path) == text == path.read_text()
    assert_same(SweepResult.from_json(path), result)
    assert_same(SweepResult.from_json(str(path)), result)
    one_row = result.select(run=[0]).select(method="local").select(round=[1])
    assert len(one_row) == 1
    assert_same(SweepResult.from_json(one_row.to_json()), one_row)
    empty = result.select(run=0, model="logreg")  # run 0 is an "mlp" run
    assert len(empty) == 0 and empty.summary() == [] and empty.curves() == []
    assert_same(SweepResult.from_json(empty.to_json()), empty)


def test_from_json_rejects_other_files():
    with pytest.raises(ValueError, match="schema must be 'pfedwn-sweep/1'; got 'pfedwn-results/1'"):
        SweepResult.from_json('{"schema": "pfedwn-results/1"}')
    with pytest.raises(ValueError, match="malformed: KeyError"):
        SweepResult.from_json(json.dumps({"schema": SCHEMA, "swept": []}))


def test_csv_parses_back_with_the_csv_module(tmp_path):
    result = special_result()
    text = result.to_csv()
    table = list(csv.reader(io.StringIO(text)))
    assert table[0] == list(result.columns)
    assert len(table) == len(result) + 1
    for i, line in enumerate(table[1:]):
        cells = dict(zip(table[0], line))
        assert int(cells["run"]) == result.rows["run"][i]
        assert cells["model"] == result.rows["model"][i]
        assert int(cells["topology_seed"]) == result.rows["topology_seed"][i]
        assert cells["diverged"] == str(bool(result.rows["diverged"][i]))
        assert np.float32(cells["target_accuracy"]) == result.rows["target_accuracy"][i]
        loss = result.rows["target_loss"][i]
        assert (
            (cells["target_loss"] == "") if np.isnan(loss) else float(cells["target_loss"]) == loss
        )
    assert table[1][COLUMNS.index("target_loss") + 2] == ""  # NaN: an empty field
    assert table[6][COLUMNS.index("target_loss") + 2] == "inf"
    assert table[2][COLUMNS.index("target_accuracy") + 2] == "0.1"  # float32's shortest form
    path = tmp_path / "rows.csv"
    assert result.to_csv(path) == text == path.read_text()


def test_to_pandas_without_pandas_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` raises ImportError
    with pytest.raises(ImportError, match=r"needs pandas.*pfedwn-jax\[analysis\].*CSV"):
        make_result().to_pandas()


def test_to_pandas_builds_a_frame_with_every_column(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(DataFrame=lambda data, columns: calls.append((data, columns)))
    monkeypatch.setitem(sys.modules, "pandas", fake)
    result = make_result()
    result.to_pandas()
    ((data, columns),) = calls
    assert columns == result.columns and list(data) == list(result.columns)
    assert all(data[k].flags.writeable for k in columns)  # a copy the frame may modify
    np.testing.assert_array_equal(data["target_accuracy"], result.rows["target_accuracy"])


def test_to_pandas_with_pandas():
    import pandas as pd  # the test extra installs it: never skipped

    frame = make_result().to_pandas()
    assert isinstance(frame, pd.DataFrame) and list(frame.columns)[:4] == [
        "run",
        "seed",
        "lr",
        "pfedwn.a",
    ]


def test_summary_table_is_aligned_text():
    result = make_result()
    table = result.summary_table(window=3)
    lines = table.splitlines()
    assert "mean +- 95% CI half-width" in lines[0]
    assert lines[1].split() == ["lr", "pfedwn.a", "method", "n", "div", "final", "last3", "max"]
    assert set(lines[2]) == {"-"} and len(lines) == 3 + 12
    e = result.summary(3)[1]  # lr=0.01, pfedwn.a=0.3, pfedwn
    cell = f"{100 * e['final_mean']:.1f} +- {100 * (e['final_ci_high'] - e['final_mean']):.1f}"
    assert lines[4].split()[:5] == ["0.01", "0.3", "pfedwn", "3", "0"] and cell in lines[4]
    single = make_result(seeds=(0,), grid={"lr": [0.01]}).summary_table()
    assert "+-" not in single.splitlines()[-1]


# --------------------------------------------------------------------------- save and plots
def test_save_writes_every_file(tmp_path):
    result = make_result()
    paths = result.save(tmp_path / "out", window=3)
    for name in ("rows", "sweep", "summary"):
        assert paths[name].is_file()
    assert_same(SweepResult.from_json(paths["sweep"]), result)
    assert_same(SweepResult.load(tmp_path / "out"), result)
    summary = json.loads(paths["summary"].read_text())
    assert summary["window"] == 3 and summary["swept"] == list(GRID)
    assert summary["groups"][0]["final_mean"] == pytest.approx(result.summary(3)[0]["final_mean"])
    if pyplot() is not None:
        assert {"curves", "heatmap_local", "heatmap_pfedwn"} <= set(paths)
        assert all(p.stat().st_size > 1000 for p in paths.values())


def test_save_one_seed_stores_nan_bounds_as_null(tmp_path):
    result = make_result(seeds=(0,), grid={"lr": [0.01]})
    paths = result.save(tmp_path)
    group = json.loads(paths["summary"].read_text())["groups"][0]
    assert group["final_ci_low"] is None and group["n"] == 1
    assert "heatmap_local" not in paths  # not a 2-D grid


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    result = make_result(stop={2: 3})
    curves = result.plot_curves(tmp_path / "c.png")
    loss = result.plot_curves(tmp_path / "loss.pdf", metric="target_loss")
    heat = result.plot_heatmap(tmp_path / "h.png", "pfedwn", stat="max")
    assert curves.read_bytes()[:4] == b"\x89PNG" and heat.read_bytes()[:4] == b"\x89PNG"
    assert loss.read_bytes()[:4] == b"%PDF"
    one_method = make_result(grid={}, methods=("fedavg",)).plot_curves(tmp_path / "one.png")
    assert one_method.is_file()


def test_plots_without_matplotlib_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr("pfedwn_jax.results.sweep.pyplot", lambda: None)
    monkeypatch.setattr("pfedwn_jax.results.plots.pyplot", lambda: None)
    result = make_result()
    assert result.plot_curves(tmp_path / "c.png") is None
    assert result.plot_heatmap(tmp_path / "h.png", "local") is None
    assert set(result.save(tmp_path)) == {"rows", "sweep", "summary"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv", "summary.json", "sweep.json"]


def test_heatmap_errors_name_the_problem(tmp_path):
    one_d = make_result(grid={"lr": [0.01, 0.05]})
    with pytest.raises(
        ValueError, match=re.escape("needs a 2-D grid (two swept keys); this sweep sweeps ['lr']")
    ):
        one_d.plot_heatmap(tmp_path / "h.png", "pfedwn")
    result = make_result()
    with pytest.raises(
        ValueError, match=re.escape("method must be one of ['local', 'pfedwn']; got 'fedavg'")
    ):
        result.plot_heatmap(tmp_path / "h.png", "fedavg")
    with pytest.raises(ValueError, match="stat must be one of"):
        result.plot_heatmap(tmp_path / "h.png", "local", stat="mean")
    assert not list(tmp_path.iterdir())


def test_curve_plot_draws_the_means_and_their_intervals(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    figures = []
    monkeypatch.setattr(
        "pfedwn_jax.results.plots.save_figure", lambda fig, path: figures.append(fig) or path
    )
    result = make_result(seeds=(0, 1))  # two seeds: t_{0.975, 1} = 12.7, bands beyond [0, 1]
    result.plot_curves(tmp_path / "c.png")
    (fig,) = figures
    local = fig.axes[0]
    assert local.get_title() == "local" and fig.axes[1].get_title() == "pfedwn"
    curve = result.curves()[0]  # lr=0.01, pfedwn.a=0.3, local: the first line and band
    np.testing.assert_allclose(local.lines[0].get_ydata(), 100 * curve["mean"])
    assert local.lines[0].get_label() == "lr=0.01, pfedwn.a=0.3"
    band_y = local.collections[0].get_paths()[0].vertices[:, 1]
    expected = 100 * np.clip(np.concatenate([curve["ci_low"], curve["ci_high"]]), 0, 1)
    assert band_y.min() == pytest.approx(expected.min()) and band_y.max() == pytest.approx(
        expected.max()
    )
    assert band_y.min() >= 0 and band_y.max() <= 100 and (curve["ci_high"] > 1).any()


def test_load_refuses_wrong_paths_with_named_errors(tmp_path):
    make_result().save(tmp_path / "out", window=3)
    (tmp_path / "empty").mkdir()
    bad = [
        (tmp_path / "out" / "sweep.json", r"takes the directory save\(\) wrote; .*is a file"),
        (tmp_path / "absent", r"directory '.*absent' does not exist"),
        (tmp_path / "empty", r"'.*empty' holds no sweep\.json .*found \[\]"),
    ]
    for path, match in bad:
        with pytest.raises(ValueError, match=match):
            SweepResult.load(path)
    with pytest.raises(ValueError, match=r"is a directory; SweepResult\.load\(directory\)"):
        SweepResult.from_json(tmp_path / "out")


def _captured(monkeypatch) -> list:
    """Figures passed to the sweep's `save_figure` (nothing is written)."""
    figures: list = []
    monkeypatch.setattr(
        "pfedwn_jax.results.plots.save_figure", lambda fig, path: figures.append(fig) or path
    )
    return figures


def test_one_varying_key_is_plotted_against_its_values(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    grid = {"lr": [0.01, 0.05, 0.2], "pfedwn.a": [0.5]}  # pfedwn.a swept but fixed
    result = make_result(grid=grid)
    assert result.varying == ("lr",)
    figures = _captured(monkeypatch)
    result.plot_vs_key(tmp_path / "v.png", stat="max", window=3)
    ((ax,),) = [fig.axes for fig in figures]
    assert ax.get_xlabel() == "lr" and ax.get_xscale() == "log"  # 0.01..0.2: a factor of 20
    for method, line in zip(METHODS, ax.lines[:: len(ax.lines) // 2], strict=True):
        entries = [e for e in result.summary(3) if e["method"] == method]
        np.testing.assert_allclose(line.get_xdata(), [0.01, 0.05, 0.2])
        np.testing.assert_allclose(line.get_ydata(), [100 * e["max_mean"] for e in entries])
    bars = ax.collections[0].get_segments()  # the first method's error bars, clipped to 100 %
    top = [100 * min(e["max_ci_high"], 1.0) for e in result.summary(3) if e["method"] == "local"]
    np.testing.assert_allclose([seg[:, 1].max() for seg in bars], top)


def test_save_plots_a_one_key_sweep_and_refuses_other_shapes(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    paths = make_result(grid={"method_kind": ["a", "b"]}).save(tmp_path / "one")
    assert paths["vs_method_kind"].name == "vs_method_kind.png" and "curves" in paths
    two = make_result()  # two varying keys: a heatmap, no plot against one key
    assert not any(name.startswith("vs_") for name in two.save(tmp_path / "two"))
    with pytest.raises(ValueError, match=r"exactly one varying key; this sweep varies \['lr', "):
        two.plot_vs_key(tmp_path / "v.png")
    with pytest.raises(ValueError, match=r"varies \[\]"):
        make_result(grid={}).plot_vs_key(tmp_path / "v.png")
