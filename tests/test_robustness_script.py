"""scripts/robustness.py and `pfedwn_jax.reproduce.robustness`: the plan of runs, the
statistics, and the artifacts of a tiny run (every method x setting x seed in the table)."""

from __future__ import annotations

import csv
import importlib.util
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from pfedwn_jax.reproduce import robustness as rb
from pfedwn_jax.reproduce.robustness import PRESETS, plan, run_stats, summarize

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location(
        "robustness_script", ROOT / "scripts/robustness.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------- the plan
def test_plan_sets_each_axis_and_nothing_else():
    preset = PRESETS["small"]
    points = plan(preset)
    base = preset.base
    expected = sum(len(v) for v in preset.values.values()) * 2 * len(preset.seeds)
    assert len(points) == expected
    for p in points:
        c, v = p["config"], p["value"]
        assert (c.seed, c.selection, c.algorithms) == (p["seed"], p["selection"], base.algorithms)
        if p["axis"] == "gamma":
            assert (c.link_model, c.gamma_th, c.eps) == ("physical", v, base.eps)
        elif p["axis"] == "eps":
            assert (c.link_model, c.eps, c.gamma_th) == ("physical", v, base.gamma_th)
        elif p["axis"] == "loss":
            assert (c.link_model, c.link_failure, c.gamma_th) == ("bernoulli", v, base.gamma_th)
        else:
            assert c.link_model == "physical"
            if v == 0:  # the static run (equal to speed 0 with mobility, tested elsewhere)
                assert c.mobility == "none"
            else:
                assert (c.mobility, c.speed) == ("waypoint", v)
                assert (c.reselect_every, c.round_seconds) == (
                    preset.reselect_every,
                    preset.round_seconds,
                )
        if p["axis"] != "speed":
            assert c.mobility == "none"
    # the whole grid: every axis x value x selection x seed once
    got = sorted((p["axis"], p["value"], p["selection"], p["seed"]) for p in points)
    want = sorted(
        (a, float(v), sel, s)
        for a, vals in preset.values.items()
        for v, sel, s in itertools.product(vals, (True, False), preset.seeds)
    )
    assert got == want


def test_plan_distinct_configs():
    """Points with equal configs run once: eps = 0.05 is the gamma = 5 point (both
    selections), speed 0 the gamma = 5 point too."""
    preset = PRESETS["small"]
    points = plan(preset, "gamma,eps,speed")
    keys = {rb._key(p["config"]) for p in points}
    # gamma: 3 values x 2 x 3 seeds = 18; eps adds 0.02 and 0.15 (x 2 x 3); speed adds 5 only
    assert len(points) == 18 + 18 + 12
    assert len(keys) == 18 + 12 + 6


def test_parse_axes_order_and_errors():
    assert rb.parse_axes("speed,gamma") == ("gamma", "speed")
    with pytest.raises(ValueError, match="only"):
        rb.parse_axes("gamma,wind")
    with pytest.raises(ValueError, match="only"):
        rb.parse_axes([])


# ---------------------------------------------------------------------------- statistics
def test_run_stats_hand_case():
    acc = np.array([0.5, 0.75, 0.25, 1.0])
    assert run_stats(acc, 2) == {"last": 0.625, "final": 1.0, "max": 1.0}
    assert run_stats(acc, 10)["last"] == pytest.approx(0.625)  # all rounds


def test_summarize_against_scipy_t_interval():
    vals = [0.6, 0.7, 0.95]
    rows = [
        {"axis": "loss", "value": 0.3, "selection": sel, "seed": s, "method": m, "last": v}
        for sel in (True, False)
        for m in ("local", "pfedwn")
        for s, v in enumerate(vals)
    ]
    out = summarize(rows)
    assert len(out) == 4 and all(r["n"] == 3 for r in out)
    mean, sem = np.mean(vals), scipy.stats.sem(vals)
    low, high = scipy.stats.t.interval(0.95, 2, loc=mean, scale=sem)
    for r in out:
        assert r["mean"] == pytest.approx(mean)
        assert (r["ci_low"], r["ci_high"]) == (pytest.approx(low), pytest.approx(high))


def test_curves_picks_the_run_and_orders_rounds():
    cols = {
        "run": np.array([1, 0, 1, 0, 1, 1]),
        "method": np.array(["a", "a", "a", "a", "b", "b"]),
        "round": np.array([2, 1, 1, 2, 2, 1]),
        "target_accuracy": np.array([0.2, 0.9, 0.1, 0.8, 0.4, 0.3]),
    }
    got = rb._curves(cols, cols["run"] == 1)
    assert list(got) == ["a", "b"]
    np.testing.assert_array_equal(got["a"], [0.1, 0.2])
    np.testing.assert_array_equal(got["b"], [0.3, 0.4])


# ------------------------------------------------------------------------------ the script
def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _check_artifacts(out: Path, axes, methods, seeds) -> list[dict[str, str]]:
    for name in ("runs.csv", "summary.csv", "robustness.json", "robustness.png"):
        assert (out / name).stat().st_size > 0, name
    rows = _read_csv(out / "runs.csv")
    values = PRESETS["tiny"].values
    want = {
        (a, float(v), sel, s, m)
        for a in axes
        for v in values[a]
        for sel in (True, False)
        for s in seeds
        for m in methods
    }
    got = [
        (r["axis"], float(r["value"]), r["selection"] == "True", int(r["seed"]), r["method"])
        for r in rows
    ]
    assert len(got) == len(set(got)) and set(got) == want
    for r in rows:
        assert 0 <= float(r["last"]) <= 1 and int(r["rounds_run"]) == 2
        assert r["config.selection"] == r["selection"]
    summary = _read_csv(out / "summary.csv")
    assert len(summary) == len(want) // len(seeds)
    doc = json.loads((out / "robustness.json").read_text())
    assert doc["schema"] == rb.SCHEMA and doc["meta"]["seeds"] == list(seeds)
    assert len(doc["runs"]) == len(rows)
    loaded = rb.RobustnessResult.load(out / "robustness.json")
    assert len(loaded.rows) == len(rows) and loaded.summary == doc["summary"]
    return rows


@pytest.mark.slow
def test_script_tiny_loss_axis(tmp_path):
    """The CLI end to end on one axis, two methods, two seeds: every artifact and every
    method x setting x seed row; Local does not communicate, so per seed its accuracy is the
    same at every loss probability, with and without selection."""
    out = tmp_path / "rob"
    argv = ["--preset", "tiny", "--out", str(out), "--only", "loss", "--methods", "local,fedavg"]
    assert _script().main(argv) == 0
    rows = _check_artifacts(out, ["loss"], ["local", "fedavg"], [0, 1])
    # Local does not communicate: its accuracy is the same at every loss and selection
    local = {}
    for r in rows:
        if r["method"] == "local":
            local.setdefault(r["seed"], set()).add(r["last"])
    assert all(len(v) == 1 for v in local.values())


@pytest.mark.slow
def test_script_tiny_every_axis_and_method(tmp_path):
    """The tiny preset, every axis and method: the table is complete, and a static and a
    mobile row equal `run()` of the row's config (the mapping of runs to rows)."""
    import pfedwn_jax

    out = tmp_path / "rob"
    assert _script().main(["--preset", "tiny", "--out", str(out)]) == 0
    rows = _check_artifacts(out, rb.AXES, rb.METHODS, [0, 1])
    preset = PRESETS["tiny"]
    for axis, value in (("gamma", 15.0), ("speed", 5.0)):
        cfg = rb.point_config(preset, axis, value, False, 1)
        res = pfedwn_jax.run(cfg, progress=False)
        for m in rb.METHODS:
            (row,) = [
                r
                for r in rows
                if (r["axis"], float(r["value"]), r["selection"], r["seed"], r["method"])
                == (axis, value, "False", "1", m)
            ]
            assert math.isclose(float(row["final"]), res.target_accuracy(m)[-1], abs_tol=1e-6)


@pytest.mark.slow
def test_script_resume_continues_an_interrupted_study(tmp_path, monkeypatch, capsys):
    """Interrupted after its first checkpoint step, the study keeps its checkpoint and says
    how to continue; run again without --resume it is refused, with --resume it finishes
    with the uninterrupted study's rows and removes its checkpoint."""
    from pfedwn_jax.runner import checkpoint as ckpt

    argv = ["--preset", "tiny", "--only", "loss", "--methods", "local,fedavg"]
    whole = tmp_path / "whole"
    assert _script().main([*argv, "--out", str(whole)]) == 0
    commit = ckpt.Checkpoint.commit

    def stop_after_first(self, *a, **k):
        commit(self, *a, **k)
        self.wait()
        raise KeyboardInterrupt

    out = tmp_path / "rob"
    with monkeypatch.context() as m:
        m.setattr(ckpt.Checkpoint, "commit", stop_after_first)
        assert _script().main([*argv, "--out", str(out)]) == 130
    assert "checkpoint kept" in capsys.readouterr().err
    assert _script().main([*argv, "--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert _script().main([*argv, "--out", str(out), "--resume"]) == 0
    assert not (out / "checkpoint").exists()
    keep = ("axis", "value", "selection", "seed", "method", "final")
    pick = [{k: r[k] for k in keep} for r in _read_csv(out / "runs.csv")]
    assert pick == [{k: r[k] for k in keep} for r in _read_csv(whole / "runs.csv")]
