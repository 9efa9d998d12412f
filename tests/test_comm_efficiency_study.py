"""The communication-efficiency study's reading of a sweep (`reproduce.comm_efficiency`): per
run statistics from the table's rows and the paired comparisons, on a made-up table; who
reaches the target under a deadline, on a tiny real sweep."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from helpers import TINY_RUN

import pfedwn_jax
from pfedwn_jax import ExperimentConfig
from pfedwn_jax.reproduce import comm_efficiency as ce
from pfedwn_jax.results.cost_curves import time_to_accuracy
from pfedwn_jax.results.paired import paired_t
from pfedwn_jax.results.sweep import SweepResult

ROUNDS = 6


def table() -> SweepResult:
    """One case, every variant, 3 seeds; accuracy rising to a level that depends on the
    method, time and energy growing 2x faster without selection."""
    cols: dict[str, list] = {k: [] for k in ("run", "seed", "case", "variant", "method")}
    cols |= {k: [] for k in ("round", "target_accuracy", "clock_s", "cumulative_energy_j")}
    level = {"pfedwn": 0.9, "fedavg": 0.7, "local": 0.8}
    run = 0
    for variant in ce.VARIANTS:
        slow = 1.0 if variant.startswith("eps") else 2.0
        for seed in range(3):
            for method in ce.METHODS:
                for r in range(1, ROUNDS + 1):
                    acc = level[method] * min(1.0, r / 3) + 0.01 * seed
                    acc -= 0.02 * (not variant.startswith("eps")) * (method == "pfedwn")
                    values = (run, seed, "Case 1", variant, method, r, acc, slow * r, slow * 10 * r)
                    for k, v in zip(cols, values, strict=True):
                        cols[k].append(v)
            run += 1
    rows = {k: np.asarray(v) for k, v in cols.items()}
    rows |= {"target_loss": rows["target_accuracy"] * 0, "diverged": rows["round"] < 0}
    rows["mean_client_accuracy"] = rows["target_accuracy"]
    return SweepResult(rows, ("case", "variant"))


def test_per_run_statistics_come_from_each_runs_curves():
    runs = ce.per_run(table())
    got = runs[("Case 1", "eps 0.05", "pfedwn")]
    last = np.mean([0.9 * min(1.0, r / 3) for r in range(ROUNDS - ce.WINDOW + 1, ROUNDS + 1)])
    np.testing.assert_allclose(got["accuracy"], last + np.array([0.0, 0.01, 0.02]))
    np.testing.assert_allclose(got["clock_s"], [ROUNDS] * 3)
    np.testing.assert_allclose(got["energy_j"], [10 * ROUNDS] * 3)
    acc = [0.9 * min(1.0, r / 3) for r in range(1, ROUNDS + 1)]
    want = time_to_accuracy(acc, np.arange(1, ROUNDS + 1.0))
    assert got["time_to_90"][0] == pytest.approx(float(want)) == 3.0


def test_selection_is_compared_with_every_neighbor_paired_by_seed_under_holm():
    runs = ce.per_run(table())
    summary = ce.summarize(runs, {"Case 1": 300})
    pairs = [t for t in summary["tests"] if t["kind"] == "selection"]
    assert len(pairs) == len(ce.PAIRS) * 2  # pFedWN and FedAvg
    assert summary["comparisons"] == len(pairs) + len(ce.VARIANTS) * 2
    t = next(t for t in pairs if t["method"] == "pfedwn" and t["a"] == "eps 0.05")
    a = runs[("Case 1", "eps 0.05", "pfedwn")]["accuracy"]
    b = runs[("Case 1", "all in range", "pfedwn")]["accuracy"]
    assert t["diff"] == pytest.approx(paired_t(a, b, 300)["diff"]) == pytest.approx(0.02)
    np.testing.assert_allclose(t["clock_s"], [0.5] * 3)  # time ratio per seed
    assert all(t["p_holm"] >= t["p"] for t in summary["tests"])


def test_a_deadline_of_two_and_a_half_airtimes_lets_two_of_three_neighbors_through():
    """Serial reception over ideal links, each model (the logistic regression's 7,850
    parameters at 32 bits) taking one airtime at the threshold rate: of the target's three
    neighbors the two first ready arrive every round, the third is cut every round (two
    training seeds over one partition and topology, as the study's seeds)."""
    airtime = 32 * 7850 / (100e6 / 14 * math.log2(1 + TINY_RUN["gamma_th"]))
    config = ExperimentConfig(
        **{**TINY_RUN, "rounds": 2},
        algorithms=("fedavg",),
        cost=True,
        reception="serial",
        deadline_s=2.5 * airtime,
        data_seed=0,
        topology_seed=0,
    )
    configs = [config, dataclasses.replace(config, seed=1)]
    labels = [{"case": "Case 1", "variant": "all, deadline"}] * 2
    res = pfedwn_jax.sweep(configs, labels=labels, records=ce.KEPT, progress=False)
    rows = ce.arrivals(res, configs)
    assert [r["slot"] for r in rows] == [1, 2, 3]
    assert sorted(r["arrived"] for r in rows) == [0.0, 1.0, 1.0]
    assert all(r["arrived"] + r["cut_by_deadline"] == 1.0 for r in rows)
    assert max(rows, key=lambda r: r["compute_s"])["cut_by_deadline"] == 1.0  # ready last
    assert all(0 < r["target_classes_held"] <= 1 and r["samples"] > 0 for r in rows)
