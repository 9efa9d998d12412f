"""Reports for the personalised methods: Table II with one column per case, the pi plot."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from pfedwn_jax import Result
from pfedwn_jax.cli.run import configs_from_args
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.results.report import format_table_cases, plot_pi_history


def fake_result(accs: dict[str, float], gamma_th=5.0, pi=None, name="mnist") -> Result:
    methods = {}
    for m, a in accs.items():
        methods[m] = {"max_target_accuracy": a, "final_target_accuracy": a, "records": {}}
    if pi is not None:
        trace = np.repeat(pi[:, None], 4, axis=1)  # [R, K, S, S]
        methods.setdefault("pfedwn", {"max_target_accuracy": 0.5})["records"] = {
            "pi": pi.tolist(),
            "pi_trace": trace.tolist(),
        }
    s = 3
    network = {
        "mode": "single",
        "target": 0,
        "slot_client": [0, 4, 7],
        "is_target": [True, False, False],
        "selected_neighbors": [4, 7],
        "adjacency": np.ones((s, s), bool).tolist(),
        "num_slots": s,
    }
    cfg = ExperimentConfig(gamma_th=gamma_th, rounds=len(pi) if pi is not None else 2)
    return Result(config=cfg, network=network, data={"name": name}, methods=methods)


def test_table_has_one_column_per_case_and_marks_the_best():
    a = fake_result({"local": 0.9, "fedavg": 0.8, "pfedwn": 0.95})
    b = fake_result({"local": 0.7, "fedavg": 0.75}, gamma_th=10)
    text = format_table_cases([a, b], ["case 1", "case 2"])
    lines = text.splitlines()
    assert lines[1].split() == ["method", "case", "1", "case", "2"]
    rows = {ln.split()[0]: ln.split()[1:] for ln in lines[3:]}
    assert rows["local"] == ["90.0", "70.0"]
    assert rows["fedavg"] == ["80.0", "75.0*"]
    assert rows["pfedwn"] == ["95.0*", "-"]  # not run in case 2
    with pytest.raises(ValueError, match="labels"):
        format_table_cases([a, b], ["only one"])


def test_pi_history_plot(tmp_path):
    rounds, s = 5, 3
    pi = np.zeros((rounds, s, s))
    pi[1:, 0] = [0.0, 0.8, 0.2]  # estimated after one warm-up round
    png = plot_pi_history(fake_result({"local": 0.9}, pi=pi), tmp_path / "pi.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_pi_history(fake_result({"local": 0.9}), tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def _args(**kw):
    base = {"config": None, **{k: None for k in ("dataset", "gamma_th", "target")}}
    return argparse.Namespace(**{**base, **kw})


def test_cases_from_flags_in_table_ii_order():
    configs = configs_from_args(_args(gamma_th="5,10", target="0,3", dataset="a,b"))
    got = [(c.gamma_th, c.target, c.dataset) for c in configs]
    assert got == [(5.0, 0, "a"), (5.0, 0, "b"), (10.0, 3, "a"), (10.0, 3, "b")]
    one = configs_from_args(_args(gamma_th="15", target="random"))
    assert [(c.gamma_th, c.target) for c in one] == [(15.0, "random")]
    with pytest.raises(ValueError, match="target"):
        configs_from_args(_args(gamma_th="5,10,15", target="0,1"))
    with pytest.raises(ValueError, match="gamma_th"):
        configs_from_args(_args(gamma_th="5,x"))


def test_pi_history_plot_of_neighbor_list_records(tmp_path):
    """`pi [R, S, K]` with columns as in `network.slot_neighbors` (network mode, uneven
    degrees): the plot maps columns to clients through the lists; dense `[R, S, S]` results
    written before the lists map column j to slot j."""
    from pfedwn_jax.results.report import pi_columns, pi_targets

    rounds, nbr = 4, [[0, 2, 0], [1, 0, 2], [2, 2, 2]]
    pi = np.zeros((rounds, 3, 3))
    pi[1:, 0] = [0.0, 1.0, 0.0]  # slot 0 hears only slot 2
    pi[1:, 1] = [0.0, 0.3, 0.7]
    res = fake_result({"local": 0.9}, pi=pi)
    res.network.update(
        mode="network",
        is_target=[True] * 3,
        slot_neighbors=nbr,
        slot_neighbor_mask=[[True, True, False], [True] * 3, [True, False, False]],
    )
    np.testing.assert_array_equal(pi_columns(res, 3), nbr)
    assert pi_targets(res) == [0, 1]
    png = plot_pi_history(res, tmp_path / "pi.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    dense = fake_result({"local": 0.9}, pi=pi)
    np.testing.assert_array_equal(pi_columns(dense, 3), np.tile(np.arange(3), (3, 1)))


def test_pi_history_has_a_legend_on_every_panel_and_says_when_pi_is_fixed(monkeypatch):
    figures: list = []
    monkeypatch.setattr(
        "pfedwn_jax.results.report.save_figure", lambda fig, path: figures.append(fig) or path
    )
    pi = np.zeros((5, 3, 3))
    pi[1:, 0] = [0.0, 0.8, 0.2]  # estimated in round 2, then fixed
    plot_pi_history(fake_result({"local": 0.9}, pi=pi), "unused.png")
    (fig,) = figures
    assert all(ax.get_legend() is not None for ax in fig.axes)
    notes = [t.get_text() for t in fig.axes[1].texts]
    assert notes == ["pi fixed after its estimate in round 2"]
