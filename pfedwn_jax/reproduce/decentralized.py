"""Learning without a server at scale: every node's test accuracy and the consensus distance
against the number of nodes and against the link failure rate, for D-PSGD, push-sum, pFedWN
and Local in network mode, paired by seed.

    python -m pfedwn_jax.reproduce.decentralized docs/results/decentralized

The network is `benchmarks/bench_scaling.py`'s: every node a target, its candidates the 10
nearest (channel-aware selection among them, `eps` the config's), the demo's node density,
interference within 100 m plus the mean-field tail, full MNIST partitioned Dirichlet(0.5)
into one client per node (at least 5 samples each). The nodes axis runs ideal links at
`NODES`; the failure axis runs Bernoulli link failures (`link_model="bernoulli"`) at
`FAILURE_NODES` nodes. Each cell is one `pfedwn_jax.run` per seed (3 seeds; 2 at
10,000 nodes) (the four methods on one
network and partition); a cell's numbers are written to `cells.json` as soon as it ends
(atomically), and a re-run skips the cells there, so an interrupted study resumes.

Reported per cell and method: the accuracy (mean over the nodes of each node's test
accuracy after the last round) and the consensus distance (mean squared distance of the
nodes' models from their connected component's mean, `consensus_distance`); against Local,
the paired difference over seeds with test-set sampling in the interval (`results.paired`
`paired_t`, `n_test` the nodes' test samples together: each node's accuracy is on its own
test set, so this treats the mean as one proportion, an approximation), Holm-adjusted over
every comparison of the study. Writes `summary.json` and `decentralized.png`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pfedwn_jax import api
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.io import atomic_write_json, read_json
from pfedwn_jax.plotting import pyplot, save_figure
from pfedwn_jax.reproduce.presets import shared_data_dir
from pfedwn_jax.results.paired import holm, is_separated, paired_t

METHODS = ("dpsgd", "pushsum", "pfedwn", "local")
NODES = (100, 1_000, 10_000)
FAILURES = (0.0, 0.2, 0.5)
FAILURE_NODES = 1_000
#: Cells of this many nodes or more run only the first `--large-seeds` seeds (their runs are
#: the study's cost: about 2 minutes a method at 10,000 nodes on 2 cores).
LARGE = 10_000
DENSITY = 11 / 2500  # the demo's 11 nodes on 50 m x 50 m


def network_config(nodes: int, **fields: Any) -> ExperimentConfig:
    """Network mode at `nodes` nodes as this study and `benchmarks/bench_scaling.py` run it
    (module docstring), with `fields` on top."""
    base: dict[str, Any] = {
        "mode": "network",
        "num_neighbors": nodes - 1,
        "candidates": min(10, nodes - 1),
        "interference_cutoff": 100.0,
        "node_density": DENSITY,
        "model": "mlp",
        "partition": "dirichlet",
        "alpha": 0.5,
        "batch_size": 32,
        "min_samples": 5,
        "dataset": f"npz:{shared_data_dir() / 'mnist.npz'}",
    }
    return ExperimentConfig(**{**base, **fields})


def cell_config(nodes: int, failure: float, seed: int, rounds: int) -> ExperimentConfig:
    """The config of one cell and seed (module docstring)."""
    links: dict[str, Any] = {}
    if failure > 0:
        links = {"link_model": "bernoulli", "link_failure": failure}
    return network_config(nodes, algorithms=METHODS, rounds=rounds, seed=seed, **links)


def run_cell(nodes: int, failure: float, seed: int, rounds: int) -> dict[str, Any]:
    """One seed of a cell: per method its accuracy and consensus distance (per round); the
    nodes' test samples; the run's wall seconds."""
    t0 = time.perf_counter()
    result = api.run(cell_config(nodes, failure, seed, rounds), progress=False)
    methods = {}
    for name in METHODS:
        acc = result.client_accuracy(name)[-1]
        methods[name] = {
            "accuracy": float(np.mean(acc)),
            "consensus": result.metric(name, "consensus_distance").tolist(),
        }
    n_test = int(np.sum(result.data["test_counts"]))
    return {"methods": methods, "n_test": n_test, "wall_s": round(time.perf_counter() - t0, 1)}


def cells(
    nodes: Sequence[int], failures: Sequence[float], failure_nodes: int
) -> list[tuple[int, float]]:
    """`(nodes, failure)` of every cell: the nodes axis at failure 0, then the failure axis
    at `failure_nodes` nodes."""
    out = [(n, 0.0) for n in nodes]
    return out + [(failure_nodes, f) for f in failures if (failure_nodes, f) not in out]


def study(
    out: Path,
    nodes: Sequence[int],
    failures: Sequence[float],
    seeds: Sequence[int],
    rounds: int,
    failure_nodes: int = FAILURE_NODES,
    large_seeds: int | None = None,
) -> dict[str, Any]:
    """Run every missing (cell, seed) into `out/cells.json` (cells of `LARGE` nodes or more
    the first `large_seeds` seeds only); return the cells."""
    path = out / "cells.json"
    done: dict[str, Any] = read_json(path, "study cells") if path.exists() else {}
    for n, f in cells(nodes, failures, failure_nodes):
        for seed in seeds[:large_seeds] if n >= LARGE else seeds:
            key = f"{n}/{f:g}/{seed}"
            if key in done and done[key]["rounds"] == rounds:
                continue
            print(f"nodes {n:>6}  failure {f:.1f}  seed {seed}", end="  ", flush=True)
            done[key] = {"nodes": n, "failure": f, "seed": seed, "rounds": rounds}
            done[key].update(run_cell(n, f, seed, rounds))
            print(f"{done[key]['wall_s']:.0f} s", flush=True)
            atomic_write_json(path, done)
    return done


def summarize(done: dict[str, Any]) -> dict[str, Any]:
    """Per cell: each method's mean accuracy and final consensus distance over the seeds,
    and each method's paired difference against Local (Holm over all comparisons)."""
    groups: dict[tuple[int, float], list[dict[str, Any]]] = {}
    for cell in done.values():
        groups.setdefault((cell["nodes"], cell["failure"]), []).append(cell)
    rows: list[dict[str, Any]] = []
    tests: list[tuple[dict[str, Any], str, dict[str, Any]]] = []
    for (n, f), runs in sorted(groups.items()):
        runs = sorted(runs, key=lambda r: r["seed"])
        acc = {m: np.array([r["methods"][m]["accuracy"] for r in runs]) for m in METHODS}
        cons = {m: [r["methods"][m]["consensus"][-1] for r in runs] for m in METHODS}
        row: dict[str, Any] = {"nodes": n, "failure": f, "seeds": [r["seed"] for r in runs]}
        row["accuracy"] = {m: float(a.mean()) for m, a in acc.items()}
        row["consensus"] = {m: float(np.mean(c)) for m, c in cons.items()}
        row["wall_s"] = float(sum(r["wall_s"] for r in runs))
        row["vs_local"] = {}
        for m in METHODS[:-1]:
            if len(runs) > 1:
                t = paired_t(acc[m], acc["local"], runs[0]["n_test"])
                row["vs_local"][m] = t
                tests.append((row, m, t))
        rows.append(row)
    adjusted = holm([t["p"] for _, _, t in tests]) if tests else np.zeros(0)
    for (row, m, t), p in zip(tests, adjusted, strict=True):
        row["vs_local"][m] = {**t, "p_holm": float(p), "separated": is_separated(t, p)}
    return {"comparisons": len(tests), "cells": rows}


def plot(summary: dict[str, Any], path: Path, failure_nodes: int = FAILURE_NODES) -> Path | None:
    """Accuracy and consensus distance against nodes (ideal links) and against the failure
    rate (at `failure_nodes` nodes), one line per method."""
    plt = pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(2, 2, figsize=(9, 6.4), dpi=120)
    rows = summary["cells"]
    axis = {
        0: ([r for r in rows if r["failure"] == 0], "nodes", "nodes (ideal links)"),
        1: ([r for r in rows if r["nodes"] == failure_nodes], "failure", "link failure rate"),
    }
    for col, (mine, key, label) in axis.items():
        mine = sorted(mine, key=lambda r: r[key])
        x = [r[key] for r in mine]
        for m in METHODS:
            axes[0, col].plot(x, [100 * r["accuracy"][m] for r in mine], "o-", label=m)
            axes[1, col].plot(x, [max(r["consensus"][m], 1e-12) for r in mine], "o-", label=m)
        for ax in axes[:, col]:
            ax.set_xlabel(label)
            ax.grid(alpha=0.3)
            if key == "nodes":
                ax.set_xscale("log")
        axes[1, col].set_yscale("log")
    axes[0, 0].set_ylabel("mean node test accuracy (%)")
    axes[1, 0].set_ylabel("consensus distance")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("network mode, MLP on full MNIST, Dirichlet(0.5); mean over seeds", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--nodes", type=int, nargs="+", default=list(NODES))
    ap.add_argument("--failures", type=float, nargs="+", default=list(FAILURES))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--failure-nodes", type=int, default=FAILURE_NODES)
    ap.add_argument("--large-seeds", type=int, default=2, help=f"seeds at >= {LARGE} nodes")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sizes = (args.nodes, args.failures, args.seeds, args.rounds)
    done = study(args.out, *sizes, args.failure_nodes, args.large_seeds)
    summary = summarize(done)
    shown = sys.argv[1:] if argv is None else list(argv)
    summary["command"] = "python -m pfedwn_jax.reproduce.decentralized " + " ".join(shown)
    summary["this_call_s"] = round(time.perf_counter() - t0, 1)
    summary["cells_wall_s"] = round(sum(r["wall_s"] for r in done.values()), 1)
    atomic_write_json(args.out / "summary.json", summary)
    figure = plot(summary, args.out / "decentralized.png", args.failure_nodes)
    print("wrote", args.out / "summary.json", figure)


if __name__ == "__main__":
    main()
