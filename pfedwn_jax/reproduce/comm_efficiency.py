"""The paper's communication-efficiency claim, measured: channel-aware selection (`P_err <
eps`) against taking every neighbor in range, in simulated time and energy.

    python -m pfedwn_jax.reproduce.comm_efficiency docs/results/comm-efficiency

The paper's Cases 1-3 at its data scale (full MNIST over 11 clients, the `mnist-full`
preset's partition, cases chosen by label similarity, the MLP), the cost of every round
counted (`cost=True`: each link at the Shannon rate of `gamma_th` on its sub-channel, ARQ
with `RETRIES` retries, each attempt failing with the link's P_err; a node's round is
its local training plus the airtime of what it receives). pFedWN, FedAvg and Local train
in every `VARIANTS` entry: the paper's selection at `eps = 0.05` or
every neighbor in range (`selection=False`), the receiver taking its links one at a time
(`reception="serial"`), without and with a deadline (`--deadline`, seconds: a neighbor
whose model misses it is dropped that round).
Each method is charged what it sends (`algorithms.payload`): pFedWN and FedAvg one model
per listed link and round, Local nothing (its clock and energy are its training's); the ARQ
and the deadline decide, for both alike, which models arrive. All runs are one
`pfedwn_jax.sweep` of the configs (labels `case`, `variant`; the records `KEPT`), saved
under `OUT/sweep` (reloaded on a re-run instead of run again).

Per case, variant, method and seed: the target's accuracy (mean of the last 5 rounds), the
simulated seconds and joules of the whole run (`clock_s`, `cumulative_energy_j` at the last
round) and to 90% of the final accuracy (`time_to_90`, `energy_to_90`). The comparisons, each
paired by seed: selection against every neighbor for pFedWN and FedAvg (accuracy difference
with test-set sampling, `results.paired.paired_t`, Holm-adjusted over the study; time and
energy as the per-seed ratio), and each method against Local. Under a deadline, which of the
target's neighbors arrive (`arrivals`). Writes `summary.json` and `comm_efficiency.png`
(accuracy against simulated seconds and joules, Case 1).
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
from pfedwn_jax.results.cost_curves import energy_to_accuracy, time_to_accuracy
from pfedwn_jax.results.paired import holm, is_separated, paired_t
from pfedwn_jax.results.sweep import SweepResult

METHODS = ("pfedwn", "fedavg", "local")
#: variant -> config fields (`deadline_s` True: the `--deadline` value). Serial reception
#: throughout: with every link on its own sub-channel at once, at the one threshold rate, a
#: round's clock is its slowest link's attempts whatever the number of links.
VARIANTS: dict[str, dict[str, Any]] = {
    "eps 0.05": {"eps": 0.05, "reception": "serial"},
    "all in range": {"selection": False, "reception": "serial"},
    "eps 0.05, deadline": {"eps": 0.05, "reception": "serial", "deadline_s": True},
    "all in range, deadline": {"selection": False, "reception": "serial", "deadline_s": True},
}
#: (selection, every neighbor) pairs compared.
PAIRS = [(v, v.replace("eps 0.05", "all in range")) for v in VARIANTS if v.startswith("eps")]
WINDOW = 5
#: ARQ retries per link and round (each attempt fails with the link's P_err).
RETRIES = 3


def base_config(rounds: int) -> ExperimentConfig:
    """The `mnist-full` preset's set-up with the cost counted."""
    fields: dict[str, Any] = {**FULL_BASE, "rounds": rounds}
    return ExperimentConfig(
        **fields,
        dataset=f"npz:{shared_data_dir() / 'mnist.npz'}",
        model="mlp",
        algorithms=METHODS,
        cost=True,
        retries=RETRIES,
    )


def study_configs(
    base: ExperimentConfig, seeds: Sequence[int], deadline: float
) -> tuple[list[ExperimentConfig], list[dict[str, Any]], list[dict[str, Any]]]:
    """`(configs, labels, cases)`: every case x variant x seed, and the cases' descriptions
    (with their targets' test samples)."""
    cases = paper_cases(base, criterion="similarity")
    configs, labels = [], []
    described = []
    for case in cases:
        n_test = target_test_samples(case.config(base))
        described.append({**case.to_dict(), "target_test_samples": n_test})
        for name, fields in VARIANTS.items():
            fields = {k: (deadline if v is True else v) for k, v in fields.items()}
            for seed in seeds:
                configs.append(dataclasses.replace(case.config(base), seed=seed, **fields))
                labels.append({"case": case.name, "variant": name})
    return configs, labels, described


def per_run(res: SweepResult) -> dict[tuple[str, str, str], dict[str, np.ndarray]]:
    """`(case, variant, method) -> {statistic: [seeds]}` in seed order."""
    rows = res.rows
    out: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for run in np.unique(rows["run"]):
        for method in METHODS:
            at = (rows["run"] == run) & (rows["method"] == method)
            order = np.argsort(rows["round"][at])
            acc = rows["target_accuracy"][at][order]
            clock = rows["clock_s"][at][order]
            energy = rows["cumulative_energy_j"][at][order]
            key = (str(rows["case"][at][0]), str(rows["variant"][at][0]), method)
            stats = out.setdefault(key, {k: [] for k in STATS})
            values = (
                acc[-WINDOW:].mean(),
                clock[-1],
                energy[-1],
                time_to_accuracy(acc, clock),
                energy_to_accuracy(acc, energy),
            )
            for k, v in zip(STATS, values, strict=True):
                stats[k].append(float(v))
    return {k: {s: np.asarray(v) for s, v in d.items()} for k, d in out.items()}


STATS = ("accuracy", "clock_s", "energy_j", "time_to_90", "energy_to_90")
#: The per-round records the study keeps: which listed links delivered, which the deadline cut.
KEPT = ("link_received", "link_straggler")


def arrivals(
    res: SweepResult, configs: Sequence[ExperimentConfig], method: str = "fedavg"
) -> list[dict[str, Any]]:
    """Who reaches the target under a deadline: per case and deadline variant, each of the
    target's listed neighbors (seed 0's set-up: its training samples, the share of the
    target's classes it holds, its training time) and the share of rounds x seeds its model
    arrived at ``method``'s target and was cut by the deadline."""
    rows, out = res.rows, []
    groups: dict[tuple[str, str], list[int]] = {}
    for run in np.unique(rows["run"]):
        at = np.flatnonzero(rows["run"] == run)[0]
        groups.setdefault((str(rows["case"][at]), str(rows["variant"][at])), []).append(int(run))
    for (case, variant), ids in sorted(groups.items()):
        if "deadline" not in variant:
            continue
        exp = setup(configs[ids[0]])
        got = np.mean([res.record("link_received", r, method)[:, 0] for r in ids], (0, 1))
        cut = np.mean([res.record("link_straggler", r, method)[:, 0] for r in ids], (0, 1))
        for k, facts in enumerate(_listed(exp)):
            out.append(
                {"case": case, "variant": variant, **facts, "arrived": float(got[k + 1])}
                | {"cut_by_deadline": float(cut[k + 1])}
            )
    return out


def _listed(exp: Any) -> list[dict[str, Any]]:
    """The target's listed neighbors (list order): slot, training samples, share of the
    target's classes it holds, training time a round."""
    ctx, train = exp.ctx, exp.data.train
    nbr, mask = np.asarray(ctx.neighbors)[0], np.asarray(ctx.neighbor_mask)[0]
    client, count = np.asarray(ctx.data_client), np.asarray(train.count)

    def classes(slot: int) -> set[int]:
        c = client[slot]
        return set(np.asarray(train.y[c])[: count[c]].tolist())

    own = classes(0)
    return [
        {
            "slot": int(j),
            "samples": int(count[client[j]]),
            "target_classes_held": len(own & classes(int(j))) / len(own),
            "compute_s": float(np.asarray(ctx.links.cost.compute_s)[j]),
        }
        for j in nbr[1:][mask[1:]]
    ]


def summarize(runs: dict, n_test: dict[str, int]) -> dict[str, Any]:
    """Means per (case, variant, method) and the paired comparisons (Holm over all)."""
    means = [
        {"case": c, "variant": v, "method": m, **{s: float(np.nanmean(a)) for s, a in d.items()}}
        for (c, v, m), d in sorted(runs.items())
    ]
    tests: list[dict[str, Any]] = []
    for case in sorted(n_test):
        for sel, every in PAIRS:
            for m in METHODS[:-1]:
                a, b = runs[(case, sel, m)], runs[(case, every, m)]
                t = paired_t(a["accuracy"], b["accuracy"], n_test[case])
                ratios = {s: (a[s] / b[s]).tolist() for s in STATS[1:]}
                pair = {"kind": "selection", "case": case, "method": m, "a": sel, "b": every}
                tests.append({**pair, **t, **ratios})
        for v in VARIANTS:
            for m in METHODS[:-1]:
                a, b = runs[(case, v, m)], runs[(case, v, "local")]
                t = paired_t(a["accuracy"], b["accuracy"], n_test[case])
                tests.append({"kind": "vs local", "case": case, "method": m, "variant": v, **t})
    for t, p in zip(tests, holm([t["p"] for t in tests]), strict=True):
        t.update(p_holm=float(p), separated=is_separated(t, p))
    return {"comparisons": len(tests), "means": means, "tests": tests}


def plot(runs_rows: SweepResult, path: Path, case: str = "Case 1") -> Path | None:
    """Case 1's target accuracy against simulated seconds and joules, mean over seeds, per
    method and variant (no deadline)."""
    plt = pyplot()
    if plt is None:
        return None
    rows = runs_rows.rows
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    shown = ("eps 0.05", "all in range")
    for variant in shown:
        for method in METHODS:
            at = (rows["case"] == case) & (rows["variant"] == variant) & (rows["method"] == method)
            rounds = np.unique(rows["round"][at])

            def mean(col: str, at: Any = at, rounds: Any = rounds) -> list[float]:
                return [float(rows[col][at & (rows["round"] == r)].mean()) for r in rounds]

            style = "-" if variant.startswith("eps") else "--"
            acc = 100 * np.asarray(mean("target_accuracy"))
            label = f"{method}, {variant}"
            axes[0].plot(mean("clock_s"), acc, style, label=label)
            axes[1].plot(mean("cumulative_energy_j"), acc, style, label=label)
    axes[0].set_xlabel("simulated seconds")
    axes[1].set_xlabel("joules (all nodes)")
    for ax in axes:
        ax.set_ylabel("target test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[1].set_xscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{case}, mnist-full, mean over seeds (solid: P_err < 0.05; dashed: all)")
    fig.tight_layout()
    return save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--deadline", type=float, default=1.0, help="seconds (serial variants)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    configs, labels, cases = study_configs(base_config(args.rounds), args.seeds, args.deadline)
    res = case_sweep(args.out / "sweep", configs, labels, KEPT)
    runs = per_run(res)
    n_test = {c["name"]: c["target_test_samples"] for c in cases}
    summary = summarize(runs, n_test)
    summary["arrivals"] = arrivals(res, configs)
    summary.update(cases=cases, **study_footer("comm_efficiency", argv, res, t0))
    atomic_write_json(args.out / "summary.json", summary)
    print("wrote", args.out / "summary.json", plot(res, args.out / "comm_efficiency.png"))


if __name__ == "__main__":
    main()
