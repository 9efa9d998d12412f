"""Run plots (`results.report`): network mode draws the spread of client accuracy."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import table_entry

from pfedwn_jax import Result
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.results.report import plot_learning_curves

pytest.importorskip("matplotlib")


def fake_result(mode: str, rounds: int = 4, slots: int = 20) -> Result:
    """A `Result` of `fedavg` over random per-client accuracies (every slot a target)."""
    config = ExperimentConfig(rounds=rounds, algorithms=("fedavg",), mode=mode, num_neighbors=5)
    rng = np.random.default_rng(0)
    r = np.arange(1, rounds + 1)[:, None]
    acc = rng.uniform(0.1 * r, 0.2 * r, (rounds, slots))
    entry = table_entry(config.hparams_for("fedavg"), acc, 1 - acc, np.ones(slots, bool))
    network = {"mode": mode, "num_slots": slots, "target": 0, "selected_neighbors": []}
    network["slot_neighbor_mask"] = np.ones((slots, 3), bool).tolist()
    data = {"name": "mnist_embedded"}
    return Result(config, network, data, {"fedavg": entry})


def _figure(monkeypatch, result: Result):
    figures: list = []
    monkeypatch.setattr(
        "pfedwn_jax.results.report.save_figure", lambda fig, path: figures.append(fig) or path
    )
    plot_learning_curves(result, "unused.png")
    (fig,) = figures
    return fig.axes[0]


def test_network_mode_plots_the_median_and_the_10_90_band(monkeypatch):
    result = fake_result("network")
    ax = _figure(monkeypatch, result)
    stats = result.client_accuracy_stats("fedavg")
    mean, median = ax.lines[0], ax.lines[1]
    np.testing.assert_allclose(mean.get_ydata(), 100 * result.target_accuracy("fedavg"))
    np.testing.assert_allclose(median.get_ydata(), 100 * stats["q50"])
    assert median.get_linestyle() == "--" and median.get_color() == mean.get_color()
    (band,) = ax.collections
    y = band.get_paths()[0].vertices[:, 1]
    assert y.min() == pytest.approx(100 * stats["q10"].min())
    assert y.max() == pytest.approx(100 * stats["q90"].max())
    assert "10th-90th percentile" in ax.get_title() and mean.get_label() == "fedavg (mean)"


def test_single_mode_plots_the_target_only(monkeypatch):
    ax = _figure(monkeypatch, fake_result("single"))
    assert len(ax.lines) == 1 and not ax.collections and ax.lines[0].get_label() == "fedavg"


def test_coinciding_curves_stay_visible_and_are_named(monkeypatch):
    """FedProx at a small mu runs over FedAvg: each curve gets its own dashes and markers,
    and the legend says that one lies on the other."""
    config = ExperimentConfig(rounds=4, algorithms=("fedavg", "fedprox"), num_neighbors=5)
    acc = np.linspace(0.2, 0.8, 4)[:, None] * np.ones((4, 6))
    methods = {
        m: table_entry(config.hparams_for(m), acc, 1 - acc, np.ones(6, bool))
        for m in config.algorithms
    }
    network = {"mode": "single", "num_slots": 6, "target": 0, "selected_neighbors": []}
    result = Result(config, network, {"name": "mnist_embedded"}, methods)
    ax = _figure(monkeypatch, result)
    fedavg, fedprox = ax.lines
    assert fedprox.get_label() == "fedprox (within 0.5 pt of fedavg)"
    assert fedavg.get_linestyle() != fedprox.get_linestyle()
    assert fedavg.get_marker() != fedprox.get_marker()
    assert fedavg.get_linewidth() > fedprox.get_linewidth()  # the one below shows around it
    assert ax.get_legend() is not None
