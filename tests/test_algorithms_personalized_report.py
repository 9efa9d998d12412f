"""Reports for the personalised methods: Table II with one column per case, the pi plot."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from pfedwn_jax.cli.run import configs_from_args
from pfedwn_jax.experiment import ExperimentConfig, Result, format_table_cases, plot_pi_history


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
