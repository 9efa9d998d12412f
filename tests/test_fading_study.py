"""The fading study's reading of a sweep (`reproduce.fading`): per-run statistics and the
paired comparisons on a made-up table, the selected-neighbor counts of real set-ups."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import TINY_RUN

from pfedwn_jax import ExperimentConfig
from pfedwn_jax.reproduce import fading as fs
from pfedwn_jax.results.paired import paired_t
from pfedwn_jax.results.sweep import SweepResult

ROUNDS, SEEDS, K = 6, 3, 4
FADINGS = ("Rayleigh", "Nakagami m=2")
COUNTS = {("Case 1", "Rayleigh"): 2, ("Case 1", "Nakagami m=2"): 2}


def table() -> SweepResult:
    """One case, two fadings, 3 seeds: accuracy 0.9 (pFedWN), 0.8, 0.7 plus 0.01 per seed,
    0.02 higher under Nakagami for pFedWN; the target's 2 listed links deliver in every
    other round under Rayleigh, always under Nakagami (its column 3 is padding)."""
    cols: dict[str, list] = {k: [] for k in ("run", "seed", "case", "fading", "method")}
    cols |= {k: [] for k in ("round", "target_accuracy")}
    level = dict(zip(fs.METHODS, (0.9, 0.8, 0.7), strict=True))
    records, run = {}, 0
    for fading in FADINGS:
        for seed in range(SEEDS):
            for method in fs.METHODS:
                bonus = 0.02 * (fading != "Rayleigh") * (method == "pfedwn")
                for r in range(1, ROUNDS + 1):
                    values = (
                        run,
                        seed,
                        "Case 1",
                        fading,
                        method,
                        r,
                        level[method] + 0.01 * seed + bonus,
                    )
                    for k, v in zip(cols, values, strict=True):
                        cols[k].append(v)
                got = np.ones((ROUNDS, 2, K), bool)  # the padding column reads delivered
                if fading == "Rayleigh":
                    got[::2, 0, 1:3] = False
                records[f"{run}/{method}/link_received"] = got
            run += 1
    rows = {k: np.asarray(v) for k, v in cols.items()}
    rows |= {"target_loss": rows["target_accuracy"] * 0, "diverged": rows["round"] < 0}
    rows["mean_client_accuracy"] = rows["target_accuracy"]
    return SweepResult(rows, ("case", "fading"), records=records)


def test_per_run_statistics_come_from_each_runs_curve_and_links():
    runs = fs.per_run(table(), COUNTS)
    got = runs[("Case 1", "Nakagami m=2", "pfedwn")]
    np.testing.assert_allclose(got["accuracy"], 0.92 + 0.01 * np.arange(SEEDS))
    np.testing.assert_allclose(got["delivered"], [1.0] * SEEDS)
    np.testing.assert_allclose(runs[("Case 1", "Rayleigh", "fedavg")]["delivered"], [0.5] * SEEDS)


def test_each_fading_is_compared_with_rayleigh_and_pfedwn_with_each_baseline():
    runs = fs.per_run(table(), COUNTS)
    summary = fs.summarize(runs, {"Case 1": 300}, {**COUNTS, ("Case 1", "Nakagami m=2"): 4})
    kinds = [t["kind"] for t in summary["tests"]]
    assert kinds.count("vs Rayleigh") == len(fs.METHODS)  # one other fading
    assert kinds.count("pfedwn vs") == 2 * len(FADINGS)
    assert summary["comparisons"] == len(summary["tests"])
    t = next(t for t in summary["tests"] if t["kind"] == "vs Rayleigh" and t["method"] == "pfedwn")
    a = runs[("Case 1", "Nakagami m=2", "pfedwn")]["accuracy"]
    b = runs[("Case 1", "Rayleigh", "pfedwn")]["accuracy"]
    assert t["diff"] == pytest.approx(paired_t(a, b, 300)["diff"]) == pytest.approx(0.02)
    assert all(t["p_holm"] >= t["p"] for t in summary["tests"])
    sel = {(m["fading"], m["method"]): m["selected"] for m in summary["means"]}
    assert sel[("Nakagami m=2", "fedamp")] == 4


def test_selected_counts_follow_each_fading_laws_p_err():
    """The tiny run under Rayleigh selects its 3 neighbors (P_err 0.077, 0.107, ~0 below eps
    0.12); a deeper Nakagami law (m = 0.6) raises the far links' P_err above eps."""
    base = ExperimentConfig(**TINY_RUN)
    configs = [
        dataclasses.replace(base, fading=kind, fading_param=param)
        for kind, param in (fs.FADINGS["Rayleigh"], fs.FADINGS["Nakagami m=0.6"])
    ]
    labels = [{"case": "c", "fading": f} for f in ("Rayleigh", "Nakagami m=0.6")]
    counts = fs.selected_counts(configs, labels)
    assert counts[("c", "Rayleigh")] == 3
    assert counts[("c", "Nakagami m=0.6")] < 3
