"""The reproduction's learning figures: Fig. 1 and Fig. 9 (curves with 95% bands over seeds)
and Fig. 8 (pFedWN's EM weights, read from the Table II sweep's records)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.setup import federation_of
from pfedwn_jax.io import atomic_write_json, atomic_write_text
from pfedwn_jax.plotting import pyplot, rounds_axis, save_figure
from pfedwn_jax.reproduce.presets import METHODS, Preset
from pfedwn_jax.reproduce.runs import SPECIAL, pick
from pfedwn_jax.reproduce.tables import finite, row_of
from pfedwn_jax.results.result import to_jsonable
from pfedwn_jax.results.sweep import SweepResult


def _curve(res: SweepResult, row: Mapping[str, Any], metric: str) -> dict[str, np.ndarray]:
    (c,) = pick(res, row).curves(metric)
    return c


def _band(ax: Any, c: Mapping[str, np.ndarray], label: str) -> None:
    x = c["round"]
    ax.plot(x, 100 * c["mean"], lw=1.5, label=label)
    if np.isfinite(c["ci_low"]).any():
        low, high = (np.clip(100 * c[k], 0.0, 100.0) for k in ("ci_low", "ci_high"))
        ax.fill_between(x, low, high, alpha=0.2)  # an accuracy's interval, cut to [0, 100]


def _curves_csv(path: Path, named: Mapping[str, Mapping[str, np.ndarray]]) -> Path:

    lines = ["curve,round,n,mean,ci_low,ci_high"]
    for name, c in named.items():
        for i in range(len(c["round"])):
            vals = (c["n"][i], c["mean"][i], c["ci_low"][i], c["ci_high"][i])
            lines.append(f"{name},{c['round'][i]}," + ",".join(f"{v:.6g}" for v in vals))
    return atomic_write_text(path, "\n".join(lines) + "\n")


def fig1(rows, sweeps, preset: Preset, out: Path) -> dict[str, Path]:
    """Fig. 1: FedAvg over all 11 clients (no selection): target client's test accuracy vs
    the global model's mean test accuracy over the clients, mean and 95% band over seeds."""

    row = row_of(rows, preset.fig1, "all clients", "fedavg")
    res = sweeps[(preset.fig1, "fedavg")][0]
    named = {
        "target client": _curve(res, row, "target_accuracy"),
        "global model (mean over clients)": _curve(res, row, "mean_client_accuracy"),
    }
    paths = {"csv": _curves_csv(out / "fig1.csv", named)}
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(5, 3.4), dpi=120)
        for name, c in named.items():
            _band(ax, c, name)
        ax.set(xlabel="communication round", ylabel="test accuracy (%)")
        ax.set_title(f"Fig. 1: FedAvg, {preset.fig1}, 11 clients", fontsize=9)
        ax.legend(fontsize=8)
        paths["png"] = save_figure(fig, out / "fig1_target_vs_global.png")
    return paths


def fig9(rows, sweeps, preset: Preset, out: Path) -> dict[str, Path]:
    """Fig. 9: every method's target test accuracy per round, 10-neighbor (Case 2, gamma_th
    10) vs 20-neighbor network, at the chosen hyperparameters, mean and 95% band."""

    label = preset.fig9
    cases = [r["case"] for r in rows if r["dataset"] == label and r["case"] not in SPECIAL]
    ten = list(dict.fromkeys(cases))[1]  # Case 2: gamma_th = 10, as the 20-neighbor network
    panels: dict[str, dict[str, Any]] = {ten: {}, "20 neighbors": {}}
    for (lab, m), (res, _) in sweeps.items():
        if lab == label and m in METHODS:
            for case in panels:
                panels[case][m] = _curve(res, row_of(rows, label, case, m), "target_accuracy")
    flat = {f"{case}|{m}": c for case, p in panels.items() for m, c in p.items()}
    paths = {"csv": _curves_csv(out / "fig9.csv", flat)}
    plt = pyplot()
    if plt is not None:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), dpi=120, sharey=True)
        for ax, (case, p) in zip(axes, panels.items(), strict=True):
            for m, c in p.items():
                _band(ax, c, m)
            ax.set(xlabel="communication round", title=f"{label}: {case}")
        axes[0].set_ylabel("target test accuracy (%)")
        axes[1].legend(fontsize=7)
        paths["png"] = save_figure(fig, out / "fig9_10_vs_20_neighbors.png")
    return paths


def fig8(rows, sweeps, preset: Preset, out: Path) -> dict[str, Path]:
    """Fig. 8: pFedWN's EM weights of the Case 1 target (fig8 dataset) at its chosen point,
    from the Table II sweep's records (first seed): the first estimate's EM path (prior, outer
    steps, refined pi: the paper's convergence of the weights) and pi over the rounds."""

    cases = [r for r in rows if r["dataset"] == preset.fig8 and r["method"] == "pfedwn"]
    row = next(r for r in cases if r["case"] not in SPECIAL)
    weights = pi_of_run(sweeps[(preset.fig8, "pfedwn")][0], row)
    doc = {"config": row["config"], "seed": row["seeds"][0], "case": row["case"], **weights}
    paths = {"json": atomic_write_json(out / "fig8_pi.json", finite(to_jsonable(doc)))}
    png = plot_pi_target(weights, out / "fig8_em_weights.png", f"{preset.fig8}, {row['case']}")
    if png is not None:
        paths["png"] = png
    return paths


def pi_of_run(res: SweepResult, row: Mapping[str, Any]) -> dict[str, Any]:
    """The target's (slot 0's) EM weights in the first-seed run of a table row: `neighbors`
    (data clients of its list columns 1..), `pi [R, K-1]` per round, `trace [E+2, K-1]` of
    the first estimate and the round (from 1) it was made in."""

    sel = pick(res, row).rows
    run = int(sel["run"][sel["seed"] == row["seeds"][0]][0])
    pi = np.asarray(res.record("pi", run, "pfedwn"))[:, 0, 1:]  # [R, K - 1]
    trace = np.asarray(res.record("pi_trace", run, "pfedwn"))[:, :, 0, 1:]  # [R, E+2, K-1]
    clients = federation_of(ExperimentConfig.from_dict(row["config"])).data_client
    first = int(np.flatnonzero(pi.sum(1) > 0)[0])
    k = min(pi.shape[1], len(clients) - 1)  # single mode: column k is slot k
    return {"neighbors": [int(c) for c in clients[1 : k + 1]], "pi": pi[:, :k].tolist(),
            "trace": trace[first, :, :k].tolist(), "estimated_round": first + 1}  # fmt: skip


def plot_pi_target(weights: Mapping[str, Any], path: Path, title: str) -> Path | None:
    """Left: the first estimate's EM path; right: pi over rounds; a line per neighbor."""

    plt = pyplot()
    if plt is None:
        return None
    trace, pi = np.asarray(weights["trace"]), np.asarray(weights["pi"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 3.0), dpi=120)
    steps, rounds = np.arange(trace.shape[0]), np.arange(1, pi.shape[0] + 1)
    shown = np.where(pi.sum(1, keepdims=True) > 0, pi, np.nan)  # no weight before the estimate
    for j, client in enumerate(weights["neighbors"]):
        left.plot(steps, trace[:, j], marker="o", ms=3, lw=1.5, label=f"neighbor {client}")
        right.plot(rounds, shown[:, j], marker=".", ms=3, lw=1.5, label=f"neighbor {client}")
    ticks = [str(s) for s in steps]
    ticks[0], ticks[-1] = "prior", "final"
    left.set_xticks(steps, ticks, fontsize=7)
    left.set_xlabel(f"EM step (estimate of round {weights['estimated_round']})")
    rounds_axis(right)
    for ax in (left, right):
        ax.set(ylabel="pi (target)", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
    right.legend(fontsize=7)
    fig.suptitle(f"Fig. 8: pFedWN aggregation weights, {title}", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
