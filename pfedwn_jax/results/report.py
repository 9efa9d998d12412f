"""Human-readable outputs of a `Result`: the paper's Table II layout and learning curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pfedwn_jax.plotting import (
    distinct_style,
    pyplot,
    rounds_axis,
    same_as,
    save_figure,
)
from pfedwn_jax.results.result import Result

RESUMED_NOTE = "* resumed: time includes the interrupted run's rounds and compilation"


def _pct(x: float | None) -> str:
    return "  -  " if x is None or not np.isfinite(x) else f"{100 * x:5.1f}"


def describe_network(result: Result) -> str:
    """One line: dataset, network size, target and its selected neighbors."""
    net, cfg = result.network, result.config
    head = (
        f"{result.data['name']}, {cfg.num_clients} clients, gamma_th {cfg.gamma_th:g}, "
        f"eps {cfg.eps:g}, {cfg.rounds} rounds, model {cfg.model}"
    )
    if net["mode"] == "single":
        sel = net.get("selected_neighbors", [])
        return f"{head}; target client {net['target']} with {len(sel)} selected neighbor(s) {sel}"
    return f"{head}; network-wide, {count_links(net)} selected links (accuracy: mean over clients)"


def count_links(network: dict) -> int:
    """Selected links of a network-mode `Result.network`: the real entries of its neighbor
    lists but each slot's own (column 0), or, for files without lists, of the dense adjacency
    but the diagonal."""
    mask = network.get("slot_neighbor_mask")
    if mask is not None:
        return int(np.sum(np.asarray(mask, bool)[:, 1:]))
    return int(np.sum(np.asarray(network["adjacency"], bool))) - int(network["num_slots"])


def format_table(result: Result) -> str:
    """Max and final target test accuracy (%) per method, like the paper's Table II.

    A method that diverged says `diverged @r` (its first diverged round) after its time.
    """
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
        resumed = "*" if m.get("timings", {}).get("resumed_at") else ""
        diverged = m.get("diverged")
        note = f"  diverged @{diverged['round']}" if diverged else ""
        lines.append(
            f"{name:<{width}}  {_pct(m.get('max_target_accuracy'))}  "
            f"{_pct(m.get('final_target_accuracy'))}  {time_s}{resumed}{note}"
        )
    if any(result.methods[name].get("timings", {}).get("resumed_at") for name in names):
        lines.append(RESUMED_NOTE)
    return "\n".join(lines)


def plot_learning_curves(result: Result, path: str | Path) -> Path | None:
    """Target test accuracy vs round for every method, as a PNG (None without matplotlib).

    In network mode (every client a target) the line is the mean over clients, and the spread
    of per-client accuracy is drawn around it: the median (dashed) and a band from the 10th to
    the 90th percentile of the clients (`Result.client_accuracy_stats`), every round.
    """
    plt = pyplot()
    if plt is None:
        return None
    network = result.network.get("mode") == "network"
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    curves = {name: result.target_accuracy(name) for name in result.methods}
    equal = same_as(curves)
    for index, (name, acc) in enumerate(curves.items()):
        rounds = np.arange(1, len(acc) + 1)
        label = f"{name} (mean)" if network else name
        if name in equal:
            label += f" (within 0.5 pt of {equal[name]})"
        style = distinct_style(index, len(acc))
        (line,) = ax.plot(rounds, 100 * acc, label=label, **style)
        if network:
            _client_spread(ax, result.client_accuracy_stats(name), rounds, line.get_color())
    rounds_axis(ax)
    ylabel = "test accuracy over clients (%)" if network else "target test accuracy (%)"
    ax.set_ylabel(ylabel)
    title = describe_network(result).split(";")[0]
    if network:
        title += "\ndashed: median client; band: 10th-90th percentile of clients"
    ax.set_title(title, fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def _client_spread(ax, stats: dict[str, np.ndarray], rounds: np.ndarray, color) -> None:
    """The median client's accuracy (dashed) and the 10-90 % band of clients, in %."""
    n = min(len(rounds), len(stats["q50"]))
    x = rounds[:n]
    ax.plot(x, 100 * stats["q50"][:n], color=color, lw=1.0, ls="--")
    ax.fill_between(x, 100 * stats["q10"][:n], 100 * stats["q90"][:n], color=color, alpha=0.15)


def case_label(result: Result) -> str:
    """A short column label for one experiment: dataset, gamma_th, target (single mode)."""
    cfg = result.config
    target = result.network.get("target", -1)
    where = f"target {target}" if result.network.get("mode") == "single" else "network"
    sel = result.network.get("selected_neighbors")
    sns = f", {len(sel)} SNs" if sel is not None else ""
    return f"{result.data['name']} (gamma_th {cfg.gamma_th:g}, {where}{sns})"


def format_table_cases(
    results: list[Result], labels: list[str] | None = None, key: str = "max_target_accuracy"
) -> str:
    """The paper's Table II layout: one row per method, one column per dataset/case.

    Cells are the target's maximum test accuracy (%) (`key`), the best of each column marked
    with `*`. Methods missing from a case show `-`. Column labels default to `case_label`.
    """
    labels = [case_label(r) for r in results] if labels is None else list(labels)
    if len(labels) != len(results):
        raise ValueError(
            f"labels must have one entry per result ({len(results)}); got {len(labels)}"
        )
    methods: list[str] = []
    for r in results:
        methods += [m for m in r.methods if m not in methods]
    cells = np.full((len(methods), len(results)), np.nan)
    for c, r in enumerate(results):
        for m_idx, name in enumerate(methods):
            value = r.methods.get(name, {}).get(key)
            cells[m_idx, c] = np.nan if value is None else float(value)
    best = np.nanmax(np.where(np.isnan(cells), -np.inf, cells), axis=0)
    width = max([6, *map(len, methods)])
    col = max(9, *(len(lbl) for lbl in labels)) + 1
    what = "maximum" if key.startswith("max") else "final"
    lines = [
        f"Target client {what} test accuracy (%), best per column marked *",
        f"{'method':<{width}}" + "".join(f"{lbl:>{col}}" for lbl in labels),
    ]
    lines.append("-" * len(lines[-1]))
    for m_idx, name in enumerate(methods):
        row = f"{name:<{width}}"
        for c in range(len(results)):
            v = cells[m_idx, c]
            text = "-" if np.isnan(v) else f"{100 * v:.1f}" + ("*" if v == best[c] else " ")
            row += f"{text:>{col}}"
        lines.append(row)
    return "\n".join(lines)


def pi_columns(result: Result, num_cols: int) -> np.ndarray:
    """`[S, K]` slot of each column of an `[S, K]` record such as pFedWN's `pi`: the network's
    `slot_neighbors`; for a results file written before the neighbor lists (dense `[S, S]`
    records) column j is slot j."""
    nbr = result.network.get("slot_neighbors")
    if nbr is not None:
        return np.asarray(nbr, np.int64)
    slots = int(result.network["num_slots"])
    return np.tile(np.arange(num_cols), (slots, 1))


def pi_targets(result: Result, method: str = "pfedwn", max_targets: int = 4) -> list[int]:
    """Target slots whose pi row is nonzero at the end (at most `max_targets`)."""
    pi = result.records(method, "pi")  # [R, S, K]
    is_target = np.asarray(result.network.get("is_target", np.ones(pi.shape[1])), bool)
    return [i for i in range(pi.shape[1]) if is_target[i] and np.nansum(pi[-1, i]) > 0][
        :max_targets
    ]


def plot_pi_history(
    result: Result, path: str | Path, method: str = "pfedwn", max_targets: int = 4
) -> Path | None:
    """pFedWN's EM weights per target, like the paper's Fig. 8, as a PNG.

    Left: the first EM estimate's path (uniform prior, each outer EM step, the final refined
    pi); right: pi over communication rounds (flat after the estimate when pi is frozen).
    One row per target (network mode: the first `max_targets` targets with neighbors).
    Returns None without matplotlib or when `method` has no `pi` record.
    """
    records = result.methods.get(method, {}).get("records", {})
    if "pi" not in records or "pi_trace" not in records:
        return None
    targets = pi_targets(result, method, max_targets)
    plt = pyplot()
    if not targets or plt is None:
        return None
    pi = result.records(method, "pi")  # [R, S, K]: columns as in network.slot_neighbors
    trace = result.records(method, "pi_trace")  # [R, em_steps + 2, S, K]
    clients = list(result.network.get("slot_client", range(pi.shape[1])))
    columns = pi_columns(result, pi.shape[2])
    rounds = result.recorded_rounds(method)  # every round unless record_every > 1
    fig, axes = plt.subplots(
        len(targets), 2, figsize=(9.0, 2.8 * len(targets)), dpi=120, squeeze=False
    )
    for row, i in zip(axes, targets, strict=True):
        estimated = np.nonzero(np.nansum(pi[:, i], axis=1) > 0)[0]
        first = int(estimated[0])
        neighbors = [j for j in range(pi.shape[2]) if np.any(pi[estimated, i, j] > 0)]
        steps = np.arange(trace.shape[1])
        for k, j in enumerate(neighbors):
            label = f"neighbor {clients[columns[i, j]]}"
            row[0].plot(steps, trace[first, :, i, j], label=label, **distinct_style(k, len(steps)))
            # before the first estimate the target does not aggregate: no weight to show
            shown = np.where(np.nansum(pi[:, i], axis=1) > 0, pi[:, i, j], np.nan)
            row[1].plot(rounds, shown, label=label, **distinct_style(k, len(rounds)))
        if len(estimated) > 1 and np.allclose(pi[estimated, i], pi[first, i], equal_nan=True):
            row[1].text(
                0.04, 0.5, f"pi fixed after its estimate in round {rounds[first]}",
                transform=row[1].transAxes, ha="left", va="center", fontsize=7, alpha=0.7,
            )  # fmt: skip
        ticks = [str(s) for s in steps]
        ticks[0], ticks[-1] = "prior", "final"
        row[0].set_xticks(steps, ticks, fontsize=7)
        row[0].set_xlabel(f"EM step (estimate of round {rounds[first]})")
        rounds_axis(row[1])
        row[1].set_xlim(0.5, rounds[-1] + 0.5)
        for ax in row:
            ax.set_ylabel(f"pi (target {clients[i]})")
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=7, loc="best")  # a legend on every panel
        row[1].legend(fontsize=7, loc="center right")
    fig.suptitle("pFedWN aggregation weights (paper Fig. 8)", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
