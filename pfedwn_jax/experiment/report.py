"""Human-readable outputs of a `Result`: the paper's Table II layout and learning curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pfedwn_jax.experiment.io import atomic_write_with
from pfedwn_jax.experiment.results import Result


def _pct(x: float | None) -> str:
    return "  -  " if x is None or not np.isfinite(x) else f"{100 * x:5.1f}"


def describe_network(result: Result) -> str:
    """One line: dataset, network size, target and its selected neighbors."""
    net, cfg = result.network, result.config
    head = f"{result.data['name']}, {cfg.num_clients} clients, gamma_th {cfg.gamma_th:g}, " \
           f"eps {cfg.eps:g}, {cfg.rounds} rounds, model {cfg.model}"
    if net["mode"] == "single":
        sel = net.get("selected_neighbors", [])
        return f"{head}; target client {net['target']} with {len(sel)} selected " \
               f"neighbor(s) {sel}"
    links = int(np.sum(net["adjacency"])) - net["num_slots"]
    return f"{head}; network-wide, {links} selected links (accuracy: mean over clients)"


def format_table(result: Result) -> str:
    """Max and final target test accuracy (%) per method, like the paper's Table II."""
    names = list(result.methods)
    width = max([6, *map(len, names)])
    lines = [
        "Target client test accuracy (%): " + describe_network(result),
        f"{'method':<{width}}    max  final  time(s)",
        "-" * (width + 24),
    ]
    for name in names:
        m = result.methods[name]
        secs = m.get("timings", {}).get("total_s")
        time_s = f"{secs:7.1f}" if secs is not None else "      -"
        lines.append(
            f"{name:<{width}}  {_pct(m.get('max_target_accuracy'))}  "
            f"{_pct(m.get('final_target_accuracy'))}  {time_s}"
        )
    return "\n".join(lines)


def plot_learning_curves(result: Result, path: str | Path) -> Path | None:
    """Target test accuracy vs round for every method, as a PNG (None without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for name in result.methods:
        acc = result.target_accuracy(name)
        ax.plot(np.arange(1, len(acc) + 1), 100 * acc, label=name, lw=1.6)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("communication round")
    ax.set_ylabel("target test accuracy (%)")
    ax.set_title(describe_network(result).split(";")[0], fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    atomic_write_with(path, lambda f: fig.savefig(f, format="png"))
    plt.close(fig)
    return path
