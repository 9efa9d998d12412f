"""A grid key `"<method>.<field>"` belongs to its method: the other methods run once per seed,
the key is missing in their rows, and the summary, files and plots say so."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from helpers import TINY_RUN, VARIED_RUN
from hypothesis import given
from hypothesis import strategies as st

import pfedwn_jax
from pfedwn_jax import ExperimentConfig, sweep
from pfedwn_jax.experiment.grid import RunSpec, concerns, expand, key_method, run_config
from pfedwn_jax.results.plots import shown
from pfedwn_jax.results.sweep import SweepResult, owned_columns
from pfedwn_jax.results.table import Table

THREE = ExperimentConfig(algorithms=("local", "fedavg", "pfedwn"))
FOUR = ExperimentConfig(algorithms=("local", "fedavg", "fedprox", "pfedwn"))


def _runs_of(specs, method):
    """`(seed, values)` of every run that runs `method`."""
    return [(s.seed, s.values) for s in specs if method in s.methods]


# ------------------------------------------------------------------------------ expansion
def test_a_method_key_multiplies_its_method_alone():
    specs = expand(THREE, "0-1", {"pfedwn.a": [0.3, 0.7]})
    assert [(s.index, s.seed, s.values, s.methods) for s in specs] == [
        (0, 0, {"pfedwn.a": 0.3}, ("local", "fedavg", "pfedwn")),
        (1, 1, {"pfedwn.a": 0.3}, ("local", "fedavg", "pfedwn")),
        (2, 0, {"pfedwn.a": 0.7}, ("pfedwn",)),
        (3, 1, {"pfedwn.a": 0.7}, ("pfedwn",)),
    ]
    assert [len(_runs_of(specs, m)) for m in ("local", "fedavg", "pfedwn")] == [2, 2, 4]


def test_a_config_key_multiplies_every_method():
    specs = expand(THREE, [5], {"lr": [0.01, 0.05], "pfedwn.a": [0.3, 0.7]})
    assert _runs_of(specs, "local") == [
        (5, {"lr": 0.01, "pfedwn.a": 0.3}),
        (5, {"lr": 0.05, "pfedwn.a": 0.3}),
    ]
    assert len(_runs_of(specs, "pfedwn")) == 4


def test_two_method_keys_leave_out_the_point_that_runs_nothing():
    specs = expand(FOUR, [0], {"pfedwn.a": [0.3, 0.7], "fedprox.mu": [0.1, 0.2]})
    assert [(s.values, s.methods) for s in specs] == [
        ({"pfedwn.a": 0.3, "fedprox.mu": 0.1}, ("local", "fedavg", "fedprox", "pfedwn")),
        ({"pfedwn.a": 0.3, "fedprox.mu": 0.2}, ("fedprox",)),
        ({"pfedwn.a": 0.7, "fedprox.mu": 0.1}, ("pfedwn",)),
    ]
    assert [s.index for s in specs] == [0, 1, 2]


def test_zipped_lists_run_a_method_at_each_of_its_own_values():
    grid = {"lr": [0.01, 0.01, 0.05], "pfedwn.a": [0.3, 0.7, 0.3]}
    specs = expand(THREE, [0], grid, zip=True)
    every = ("local", "fedavg", "pfedwn")
    assert [s.methods for s in specs] == [every, ("pfedwn",), every]


@given(
    lengths=st.lists(st.integers(1, 3), min_size=0, max_size=3),
    seeds=st.lists(st.integers(0, 50), min_size=1, max_size=3, unique=True),
)
def test_methods_match_the_first_value_reference(lengths, seeds):
    """Product order: a method runs where every key that does not concern it takes its
    first value (a reference from the definition, not from the implementation)."""
    keys = ["lr", "fedprox.mu", "pfedwn.a"][: len(lengths)]
    grid = {k: [round(0.1 * (i + 1), 3) for i in range(n)] for k, n in zip(keys, lengths)}
    specs = expand(FOUR, seeds, grid)
    expected = []
    for combo in itertools.product(*grid.values()):
        point = dict(zip(keys, combo))
        methods = tuple(
            m
            for m in FOUR.method_names
            if all(point[k] == grid[k][0] for k in keys if not concerns(k, m))
        )
        expected += [(s, point, methods) for s in seeds if methods]
    assert [(s.seed, s.values, s.methods) for s in specs] == expected


def test_key_method_and_concerns():
    assert key_method("pfedwn.a") == "pfedwn" and key_method("lr") is None
    assert concerns("lr", "local") and concerns("pfedwn.a", "pfedwn")
    assert not concerns("pfedwn.a", "local")


def test_run_config_runs_only_the_methods_of_the_run():
    spec = RunSpec(2, 4, {"lr": 0.2, "pfedwn.a": 0.7, "fedprox.mu": 0.5}, ("pfedwn",))
    config = run_config(FOUR, spec)
    assert config == ExperimentConfig(
        algorithms=("pfedwn",), hparams={"pfedwn": {"a": 0.7}}, lr=0.2, seed=4
    )
    default = ExperimentConfig()  # algorithms=(): the default methods, left as given
    every = RunSpec(0, 4, {"pfedwn.a": 0.7}, default.method_names)
    assert run_config(default, every).algorithms == ()


# ------------------------------------------------------------------------------ the result
def _rows(runs):
    """Tidy rows of `(run, seed, a, method, accuracy per round)` (2 rounds each)."""
    cols = {k: [] for k in ("run", "seed", "pfedwn.a", "method", "round", "target_accuracy")}
    for run, seed, a, method, acc in runs:
        for r, x in enumerate(acc, 1):
            for k, v in zip(cols, (run, seed, a, method, r, x)):
                cols[k].append(v)
    n = len(cols["run"])
    rows = {k: np.array(v) for k, v in cols.items()}
    rows |= {"target_loss": np.ones(n), "mean_client_accuracy": np.full(n, 0.5)}
    rows["diverged"] = np.zeros(n, bool)
    return owned_columns(rows, {"pfedwn.a": "pfedwn"})


RUNS = [
    (0, 0, 0.3, "local", [0.5, 0.6]),
    (0, 0, 0.3, "pfedwn", [0.6, 0.7]),
    (1, 1, 0.3, "local", [0.5, 0.8]),
    (1, 1, 0.3, "pfedwn", [0.6, 0.9]),
    (2, 0, 0.7, "pfedwn", [0.4, 0.5]),
    (3, 1, 0.7, "pfedwn", [0.4, 0.7]),
]


def test_owned_columns_are_missing_for_the_other_methods():
    res = SweepResult(_rows(RUNS), ("pfedwn.a",))
    a, method = res.rows["pfedwn.a"], res.rows["method"]
    assert np.isnan(a[method == "local"]).all() and set(a[method == "pfedwn"]) == {0.3, 0.7}
    assert res.varying == ("pfedwn.a",)
    assert res.values_of("pfedwn.a").tolist() == [0.3, 0.7]
    summary = res.summary(window=1)
    heads = [(e["method"], e["pfedwn.a"], e["n"]) for e in summary]
    assert heads[0][0] == "local" and math.isnan(heads[0][1]) and heads[0][2] == 2
    assert heads[1:] == [("pfedwn", 0.3, 2), ("pfedwn", 0.7, 2)]
    assert summary[0]["final_mean"] == pytest.approx(0.7)
    table = res.summary_table(window=1).splitlines()
    assert table[3].split()[:3] == ["-", "local", "2"]
    assert [line.split()[:2] for line in table[4:]] == [["0.3", "pfedwn"], ["0.7", "pfedwn"]]
    # a missing value is no value: one list of a single value does not vary
    one = SweepResult(_rows(RUNS[:4]), ("pfedwn.a",))
    assert one.varying == ()


def test_owned_columns_of_int_bool_and_text_keys():
    rows = {
        "method": np.array(["local", "pfedwn"]),
        "pfedwn.em_steps": np.array([3, 3]),
        "pfedwn.component_updates": np.array([True, False]),
        "perfedavg.variant": np.array(["fo", "hf"]),
    }
    owners = {"pfedwn.em_steps": "pfedwn", "pfedwn.component_updates": "pfedwn"}
    out = owned_columns(rows, owners | {"perfedavg.variant": "perfedavg"})
    np.testing.assert_array_equal(out["pfedwn.em_steps"], [np.nan, 3.0])
    np.testing.assert_array_equal(out["pfedwn.component_updates"], [np.nan, 0.0])
    assert out["perfedavg.variant"].tolist() == ["", ""]


def test_files_round_trip_and_plots_draw_each_method_once(tmp_path):
    pytest.importorskip("matplotlib")
    res = SweepResult(_rows(RUNS), ("pfedwn.a",), {"owners": {"pfedwn.a": "pfedwn"}})
    paths = res.save(tmp_path, window=1)
    assert {"rows", "sweep", "summary", "curves", "vs_pfedwn.a"} <= set(paths)
    back = SweepResult.load(tmp_path)
    for k, v in res.rows.items():
        np.testing.assert_array_equal(back.rows[k], v, err_msg=k)
    lines = (tmp_path / "rows.csv").read_text().splitlines()
    assert lines[1].split(",")[2] == "" and lines[3].split(",")[2] == "0.3"  # local, pfedwn
    curves = res.curves()
    assert [c["method"] for c in curves] == ["local", "pfedwn", "pfedwn"]  # local once


def test_heatmap_of_a_method_one_key_does_not_concern(tmp_path):
    pytest.importorskip("matplotlib")
    runs = [(i, 0, a, m, [x]) for i, (a, m, x) in enumerate([(0.3, "local", 0.5)])]
    runs += [(i + 1, 0, a, "pfedwn", [x]) for i, (a, x) in enumerate([(0.3, 0.6), (0.7, 0.7)])]
    rows = _rows(runs)
    rows["lr"] = np.full(len(rows["run"]), 0.05)
    res = SweepResult(rows, ("lr", "pfedwn.a"))
    assert res.heatmap_values("local")[:2] == ([0.05], [None])
    _, cols, cells = res.heatmap_values("pfedwn")
    assert cols == [0.3, 0.7] and cells.tolist() == [[0.6, 0.7]]
    paths = res.save(tmp_path, window=1)
    assert "heatmap_pfedwn" in paths and "heatmap_local" not in paths  # nothing to map
    assert res.plot_heatmap(tmp_path / "local.png", "local") is not None


# ------------------------------------------------------------------------------ the sweep
def _check_owned_sweep(tmp_path, method, key, rounds, compared):
    """local, fedavg and `method` over `key` (two values) x 2 seeds: runs counted from the
    rows, the runs `compared` (indices) each equal to `run()` of its own config, summary and
    files."""
    config = ExperimentConfig(
        **{**VARIED_RUN, "rounds": rounds}, algorithms=("local", "fedavg", method)
    )
    grid = {key: [0.3, 0.7]}
    res = sweep(config, seeds=[0, 1], grid=grid, block=1, progress=False)
    pairs = {(int(r), str(m)) for r, m in zip(res.rows["run"], res.rows["method"])}
    per_method = {m: sum(1 for _, n in pairs if n == m) for m in config.method_names}
    assert per_method == {"local": 2, "fedavg": 2, method: 4}
    assert res.meta["owners"] == {key: method}
    assert res.meta["programs"] == 2  # all three methods; `method` alone
    specs = expand(config, [0, 1], grid)
    for spec in (specs[i] for i in compared):
        own = pfedwn_jax.run(run_config(config, spec), progress=False)
        assert tuple(own.methods) == spec.methods
        for name in spec.methods:
            sel = (res.rows["run"] == spec.index) & (res.rows["method"] == name)
            np.testing.assert_allclose(
                res.rows["target_accuracy"][sel], own.methods[name]["target_accuracy"], atol=1e-6
            )
    summary = [(e["method"], shown(e[key]), e["n"]) for e in res.summary()]
    assert summary == [
        ("local", "-", 2),
        ("fedavg", "-", 2),
        (method, "0.3", 2),
        (method, "0.7", 2),
    ]
    back = SweepResult.load(res.save(tmp_path, plots=False)["sweep"].parent)
    np.testing.assert_array_equal(back.rows[key], res.rows[key])


def test_sweep_runs_other_methods_once_per_seed_and_runs_equal_run(tmp_path):
    """The quick tier: FedProx's mu, one round; a FedProx-only run against run() (a run of
    every method against run(): the slow tier)."""
    _check_owned_sweep(tmp_path, "fedprox", "fedprox.mu", rounds=1, compared=(3,))


@pytest.mark.slow
def test_sweep_of_pfedwn_a_equals_every_run(tmp_path):
    _check_owned_sweep(tmp_path, "pfedwn", "pfedwn.a", rounds=2, compared=range(4))


@pytest.mark.slow  # the quick tier resumes sweeps in tests/test_sweep.py
def test_resume_of_an_owned_key_sweep_is_exact(tmp_path, monkeypatch):
    config = ExperimentConfig(**{**VARIED_RUN, "rounds": 2}, algorithms=("local", "pfedwn"))
    kwargs: dict = dict(seeds=[0], grid={"pfedwn.a": [0.3, 0.7]}, block=1, progress=False)
    kwargs["checkpoint"] = tmp_path / "ck"
    full = sweep(config, **{**kwargs, "checkpoint": None})
    add_block, calls = Table.add_block, []

    def interrupted(self, *args, **kw):
        calls.append(1)
        if len(calls) == 5:  # the pfedwn-only program (local 2 + pfedwn 2 blocks came first)
            raise KeyboardInterrupt
        return add_block(self, *args, **kw)

    monkeypatch.setattr(Table, "add_block", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sweep(config, **kwargs)
    monkeypatch.setattr(Table, "add_block", add_block)
    resumed = sweep(config, **kwargs, resume=True)
    for key in ("run", "method", "round", "pfedwn.a", "target_accuracy", "target_loss"):
        np.testing.assert_array_equal(resumed.rows[key], full.rows[key], err_msg=key)


def test_saved_models_of_an_owned_key_sweep(tmp_path):
    """Every method's models are kept for the runs that ran it; another run says so."""
    config = ExperimentConfig(**{**VARIED_RUN, "rounds": 1}, algorithms=("local", "fedprox"))
    grid = {"fedprox.mu": [0.1, 0.2]}
    sweep(config, seeds=[0], grid=grid, progress=False, save_models=tmp_path / "m")
    saved = pfedwn_jax.load_models(tmp_path / "m")
    assert saved.methods == ("local", "fedprox") and saved.num_runs == 2
    assert saved.labels(1) == {"seed": 0, "fedprox.mu": 0.2}
    assert saved.params("local", 0) is not None and saved.params("fedprox", 1) is not None
    with pytest.raises(ValueError, match=r"run 1 did not run 'local'.*\['fedprox'\]"):
        saved.params("local", 1)


SIX = ("local", "fedavg", "fedprox", "perfedavg", "pfedwn", "ditto")


def test_a_ditto_key_over_six_methods_expands_the_other_five_once_per_seed():
    """Ditto's lambda over six methods: Ditto at each value, the other five once per seed."""
    config = ExperimentConfig(**TINY_RUN, algorithms=SIX)
    specs = expand(config, [0, 1], {"ditto.lam": [0.1, 1.0, 2.0]})
    runs = {m: sum(m in s.methods for s in specs) for m in SIX}
    assert runs == {**dict.fromkeys(SIX[:-1], 2), "ditto": 6}


@pytest.mark.slow
def test_a_ditto_sweep_over_six_methods_runs_the_others_once_per_seed():
    """The same counted from a real sweep's rows (one round)."""
    config = ExperimentConfig(**{**TINY_RUN, "rounds": 1}, algorithms=SIX)
    res = sweep(config, seeds=[0, 1], grid={"ditto.lam": [0.1, 1.0]}, progress=False)
    pairs = {(int(r), str(m)) for r, m in zip(res.rows["run"], res.rows["method"])}
    runs = {m: sum(1 for _, n in pairs if n == m) for m in SIX}
    assert runs == {**dict.fromkeys(SIX[:-1], 2), "ditto": 4}
