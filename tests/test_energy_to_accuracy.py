"""Energy-to-accuracy beside time-to-accuracy: the cumulative energy column (a running total
that goes on across blocks, as after a resume) and the summaries of `Result` and
`SweepResult`, on curves small enough to read by hand."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import TINY_RUN

from pfedwn_jax import ExperimentConfig
from pfedwn_jax.results.cost_curves import energy_to_accuracy, to_accuracy
from pfedwn_jax.results.entries import method_entry
from pfedwn_jax.results.result import Result
from pfedwn_jax.results.sweep import SweepResult
from pfedwn_jax.results.table import RunInfo, Table

# two slots, slot 0 the target; five rounds
TARGET = [[0.1, 0.5, 0.8, 0.7, 0.85], [0.2, 0.9, 0.3, 0.4, 1.0]]  # per run
ENERGY = np.array([[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]], float)  # [R, S] joules
ROUND_S = np.array([0.5, 1.0, 1.5, 2.0, 2.5])
# by hand: totals 3, 7, 11, 15, 19 J, so 3, 10, 21, 36, 55 J spent; clock 0.5 ... 7.5 s.
# Run 0 ends at 0.85, 90% of it is 0.765: first met at round 3 (0.8): 21 J, 3 s.
# Run 1 ends at 1.0, 90% is 0.9: met at round 2: 10 J, 1.5 s.
SPENT_J = [3.0, 10.0, 21.0, 36.0, 55.0]
CONFIG = ExperimentConfig(**TINY_RUN)
WANT = [{"energy_to_90": 21.0, "time_to_90": 3.0}, {"energy_to_90": 10.0, "time_to_90": 1.5}]


def _table(runs: int) -> Table:
    """The runs' rounds added in two blocks (rounds 1-2, then 3-5)."""
    info = RunInfo(np.array([True, False]), np.arange(2))
    table = Table([info] * runs, [{"seed": r} for r in range(runs)], ["m"])
    for run in range(runs):
        acc = np.stack([TARGET[run], np.full(5, 0.5)], axis=1)
        for lo, hi in ((0, 2), (2, 5)):
            block = {
                "accuracy": acc[lo:hi],
                "loss": np.ones((hi - lo, 2)),
                "finite": np.ones((hi - lo, 2), bool),
                "energy_j": ENERGY[lo:hi],
                "round_s": np.repeat(ROUND_S[lo:hi, None], 2, axis=1),
                "records": {},
            }
            table.add_block(run, "m", lo, block, 0.1)
    return table


def _entry() -> dict:
    return method_entry(_table(1).track(0, "m"), CONFIG.hparams_for("local"), 1, 5)


def test_the_cumulative_energy_goes_on_across_blocks():
    entry = _entry()
    np.testing.assert_allclose(entry["energy_j"], ENERGY.sum(axis=1))
    np.testing.assert_allclose(entry["cumulative_energy_j"], SPENT_J)
    np.testing.assert_allclose(entry["clock_s"], np.cumsum(ROUND_S))


def test_a_results_summary_has_energy_and_time_to_90_by_hand():
    entry = _entry()
    result = Result(CONFIG, {"mode": "single"}, {"name": "x"}, {"m": entry})
    summary = result.summary()["m"]
    assert summary["energy_to_90"] == pytest.approx(WANT[0]["energy_to_90"])
    assert summary["time_to_90"] == pytest.approx(WANT[0]["time_to_90"])


def test_a_sweeps_summary_has_energy_to_90_over_its_seeds():
    rows = _table(2).columns()
    np.testing.assert_allclose(rows["cumulative_energy_j"], SPENT_J * 2)
    (entry,) = SweepResult(rows, (), {}).summary()
    for key in ("energy_to_90", "time_to_90"):
        values = [w[key] for w in WANT]
        assert entry[f"{key}_mean"] == pytest.approx(np.mean(values))
        assert entry[f"{key}_std"] == pytest.approx(np.std(values, ddof=1))


def test_energy_to_accuracy_and_its_absence():
    assert float(energy_to_accuracy(TARGET[0], SPENT_J)) == 21.0
    assert np.isnan(energy_to_accuracy([0.5, 0.4, np.nan], SPENT_J[:3]))  # final NaN: never
    # no cost counted: no spend columns, no keys
    assert to_accuracy(TARGET[0], {"target_accuracy": TARGET[0]}) == {}
