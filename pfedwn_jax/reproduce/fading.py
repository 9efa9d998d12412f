"""Learning across fading models: the paper's Cases 1-3 under Rayleigh, Nakagami-m and
Rician-K fading, target accuracy of pFedWN and two baselines, paired by seed.

    python -m pfedwn_jax.reproduce.fading docs/results/fading

Each case (the `mnist-full` partition, the cases chosen by label similarity under the paper's
Rayleigh channel: a topology, a target and a threshold) is held fixed and only the fading
changes, so its two effects show together: which neighbors the target selects (`P_err <
eps` under the model's law, `wireless.fading`) and which of their models arrive each round
(`link_model="physical"`: block fading and interference redrawn every round from the same
law). pFedWN, FedAvg and FedAMP train in every case x `FADINGS` entry x seed (10 rounds,
seeds 0-2; the seeds share the case's partition and topology). All runs are one
`pfedwn_jax.sweep` of the configs (labels `case`, `fading`), saved under `OUT/sweep`
(reloaded on a re-run instead of run again).

Per case, fading and method: the number of neighbors the target selected, the target's
accuracy (mean of its last 5 rounds) and the share of its listed links that delivered. The
comparisons, each paired by seed with test-set sampling in the interval
(`results.paired.paired_t`), Holm-adjusted together over the study: every fading against
Rayleigh per case and method, and pFedWN against each baseline per case and fading. Writes
`summary.json` and `fading.png` (accuracy per fading model, one panel a case).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.setup import setup
from pfedwn_jax.io import atomic_write_json
from pfedwn_jax.plotting import pyplot, save_figure
from pfedwn_jax.reproduce.cases import case_sweep, paper_cases, study_footer, target_test_samples
from pfedwn_jax.reproduce.presets import FULL_BASE, shared_data_dir
from pfedwn_jax.results.paired import holm, is_separated, paired_t
from pfedwn_jax.results.sweep import SweepResult

METHODS = ("pfedwn", "fedavg", "fedamp")
#: label -> (fading model, its parameter): the paper's Rayleigh first (the reference), a
#: deeper (m < 1) and a milder Nakagami law, and Rician with a weak and a strong line of sight.
FADINGS: dict[str, tuple[str, float | None]] = {
    "Rayleigh": ("rayleigh", None),
    "Nakagami m=0.6": ("nakagami", 0.6),
    "Nakagami m=2": ("nakagami", 2.0),
    "Rician K=3": ("rician", 3.0),
    "Rician K=10": ("rician", 10.0),
}
REFERENCE = "Rayleigh"
WINDOW = 5
#: The per-round record the study keeps: which listed links delivered.
KEPT = ("link_received",)


def base_config(rounds: int) -> ExperimentConfig:
    """The `mnist-full` preset's set-up, links drawn from the channel every round."""
    fields: dict[str, Any] = {**FULL_BASE, "rounds": rounds}
    return ExperimentConfig(
        **fields,
        dataset=f"npz:{shared_data_dir() / 'mnist.npz'}",
        model="mlp",
        algorithms=METHODS,
        link_model="physical",
    )


def study_configs(
    base: ExperimentConfig, seeds: Sequence[int], fadings: Sequence[str]
) -> tuple[list[ExperimentConfig], list[dict[str, Any]], list[dict[str, Any]]]:
    """`(configs, labels, cases)`: every case x fading x seed, and the cases' descriptions
    (found under Rayleigh, with their targets' test samples)."""
    configs, labels, described = [], [], []
    for case in paper_cases(base, criterion="similarity"):
        described.append(
            {**case.to_dict(), "target_test_samples": target_test_samples(case.config(base))}
        )
        for name in fadings:
            kind, param = FADINGS[name]
            for seed in seeds:
                config = case.config(base)
                configs.append(
                    dataclasses.replace(config, fading=kind, fading_param=param, seed=seed)
                )
                labels.append({"case": case.name, "fading": name})
    return configs, labels, described


def per_run(
    res: SweepResult, counts: dict[tuple[str, str], int]
) -> dict[tuple[str, str, str], dict[str, np.ndarray]]:
    """`(case, fading, method) -> {"accuracy", "delivered": [seeds]}` in seed order;
    ``counts`` the target's selected neighbors per `(case, fading)` (`selected_counts`)."""
    rows = res.rows
    out: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for run in np.unique(rows["run"]):
        for method in METHODS:
            at = (rows["run"] == run) & (rows["method"] == method)
            acc = rows["target_accuracy"][at][np.argsort(rows["round"][at])]
            got = res.record("link_received", int(run), method)[:, 0]  # [R, K] the target's
            case, fading = str(rows["case"][at][0]), str(rows["fading"][at][0])
            stats = out.setdefault((case, fading, method), {"accuracy": [], "delivered": []})
            stats["accuracy"].append(float(acc[-WINDOW:].mean()))
            stats["delivered"].append(_delivered_share(got, counts[(case, fading)]))
    return {k: {s: np.asarray(v) for s, v in d.items()} for k, d in out.items()}


def _delivered_share(received: np.ndarray, listed: int) -> float:
    """Share of the target's ``listed`` links (columns 1 .. listed of its row ``received
    [R, K]``; the rest is a program's padding) that delivered, over the rounds; NaN when it
    lists none."""
    links = received[:, 1 : 1 + listed]
    return float(links.mean()) if links.size else float("nan")


def selected_counts(configs: Sequence[ExperimentConfig], labels: Sequence[dict]) -> dict:
    """`(case, fading) -> the number of neighbors the target selects` (seed-independent: one
    set-up per pair)."""
    out: dict[tuple[str, str], int] = {}
    for config, label in zip(configs, labels, strict=True):
        key = (label["case"], label["fading"])
        if key not in out:
            out[key] = int(setup(config).federation.num_slots) - 1
    return out


def summarize(runs: dict, n_test: dict[str, int], counts: dict) -> dict[str, Any]:
    """Means per (case, fading, method) and the paired comparisons (Holm over all)."""
    means = [
        {"case": c, "fading": f, "method": m, "selected": counts[(c, f)]}
        | {s: float(np.nanmean(a)) for s, a in d.items()}
        for (c, f, m), d in sorted(runs.items())
    ]
    tests: list[dict[str, Any]] = []
    fadings = sorted({f for _, f, _ in runs}, key=list(FADINGS).index)
    for case in sorted(n_test):
        for fading in fadings:
            for m in METHODS:
                if fading != REFERENCE:
                    a, b = runs[(case, fading, m)], runs[(case, REFERENCE, m)]
                    t = paired_t(a["accuracy"], b["accuracy"], n_test[case])
                    tests.append(
                        {"kind": "vs Rayleigh", "case": case, "fading": fading, "method": m, **t}
                    )
            for m in METHODS[1:]:
                a, b = runs[(case, fading, METHODS[0])], runs[(case, fading, m)]
                t = paired_t(a["accuracy"], b["accuracy"], n_test[case])
                tests.append(
                    {"kind": "pfedwn vs", "case": case, "fading": fading, "method": m, **t}
                )
    for t, p in zip(tests, holm([t["p"] for t in tests]), strict=True):
        t.update(p_holm=float(p), separated=is_separated(t, p))
    return {"comparisons": len(tests), "means": means, "tests": tests}


def plot(summary: dict[str, Any], path: Path) -> Path | None:
    """Target accuracy per fading model (mean over seeds), one panel a case, a line a method;
    the selected-neighbor count under each tick."""
    plt = pyplot()
    if plt is None:
        return None
    means = summary["means"]
    cases = sorted({r["case"] for r in means})
    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 3.8), dpi=120, squeeze=False)
    for ax, case in zip(axes[0], cases, strict=True):
        rows = [r for r in means if r["case"] == case]
        fadings = [f for f in FADINGS if any(r["fading"] == f for r in rows)]
        for method, marker in zip(METHODS, "osd", strict=True):
            acc = [
                next(100 * r["accuracy"] for r in rows if (r["fading"], r["method"]) == (f, method))
                for f in fadings
            ]
            ax.plot(range(len(fadings)), acc, marker=marker, label=method)
        count = {r["fading"]: r["selected"] for r in rows}
        ax.set_xticks(range(len(fadings)), [f"{f}\n({count[f]} sel.)" for f in fadings], fontsize=7)
        ax.set_title(case)
        ax.set_ylabel("target test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("mnist-full, physical links, mean over seeds (selected neighbors per model)")
    fig.tight_layout()
    return save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--fadings", nargs="+", default=list(FADINGS), choices=list(FADINGS))
    args = ap.parse_args(argv)
    if REFERENCE not in args.fadings:
        ap.error(f"--fadings must include the reference {REFERENCE!r}; got {args.fadings}")
    t0 = time.perf_counter()
    configs, labels, cases = study_configs(base_config(args.rounds), args.seeds, args.fadings)
    res = case_sweep(args.out / "sweep", configs, labels, KEPT)
    n_test = {c["name"]: c["target_test_samples"] for c in cases}
    counts = selected_counts(configs, labels)
    summary = summarize(per_run(res, counts), n_test, counts)
    summary.update(cases=cases, **study_footer("fading", argv, res, t0))
    atomic_write_json(args.out / "summary.json", summary)
    print("wrote", args.out / "summary.json", plot(summary, args.out / "fading.png"))


if __name__ == "__main__":
    main()
