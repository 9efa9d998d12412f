"""Plots of a `SweepResult`: learning curves with bands, a metric against one varying key,
a heatmap of a 2-D grid (matplotlib, imported lazily: None where it is missing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pfedwn_jax._checks import check_choice
from pfedwn_jax.plotting import pyplot, save_figure

SweepResult = Any  # `results.sweep.SweepResult` (which imports this module)

STATS = ("final", "last", "max")  # as `results.sweep.STATS`
_BAR = ("mean", "ci_low", "ci_high")  # the summary entries an error bar is drawn from


def shown(value: Any) -> str:
    """A swept value for tables, labels and tick marks (floats in `%g`); "-" where the
    value is missing (NaN, "" or None: a key that does not concern the method)."""
    if value is None or value == "" or (isinstance(value, float) and value != value):
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def plot_curves(res: SweepResult, path: str | Path, metric: str = "target_accuracy") -> Path | None:
    """Learning curves: one panel per method, one line per grid point (the mean over its
    seeds) with a band of the 95% Student-t interval of that mean (no band for one
    seed; for accuracies, in %, cut to [0, 100]). None (nothing written) without
    matplotlib."""
    curves = res.curves(metric)
    if not curves:
        raise ValueError("plot_curves: the sweep has no rows")
    plt = pyplot()
    if plt is None:
        return None
    methods, scale = res.methods, 100.0 if metric.endswith("accuracy") else 1.0
    points = list(dict.fromkeys(tuple(shown(c[k]) for k in res.swept) for c in curves))
    ncols = min(3, len(methods))
    nrows = -(-len(methods) // ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), dpi=120, squeeze=False, sharey=True
    )
    for c in curves:
        ax = axes.flat[methods.index(c["method"])]
        color = _color(plt, points.index(tuple(shown(c[k]) for k in res.swept)), len(points))
        own = [k for k in res.swept if shown(c[k]) != "-"]  # keys that concern the method
        label = ", ".join(f"{k}={shown(c[k])}" for k in own) or c["method"]
        ax.plot(c["round"], scale * c["mean"], color=color, lw=1.4, label=label)
        band = np.stack([c["ci_low"], c["ci_high"]])
        band = np.clip(band, 0.0, 1.0) if scale == 100.0 else band  # accuracy: in [0, 1]
        ax.fill_between(c["round"], *(scale * band), color=color, alpha=0.2, lw=0)
    for i, ax in enumerate(axes.flat):
        ax.set_visible(i < len(methods))
        ax.set(title=methods[i] if i < len(methods) else "", xlabel="communication round")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel(f"{metric} (%)" if scale == 100.0 else metric)
    if res.swept:  # each panel its own: a method lists only the keys that concern it
        for ax in axes.flat[: len(methods)]:
            ax.legend(fontsize=7)
    fig.suptitle("mean over seeds; band: 95% confidence interval (Student t)", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_vs_key(
    res: SweepResult, path: str | Path, stat: str = "final", window: int = 5
) -> Path | None:
    """`stat` target accuracy (%) against the one varying swept key: per method, the mean
    over seeds with its 95% Student-t interval as error bars (none for one seed). Numbers
    on a numeric axis (logarithmic when positive and spanning a factor of 20 or more),
    other values as categories. A method the key does not concern is one dashed flat line
    (its band shaded). `ValueError` unless exactly one key varies; None (nothing
    written) without matplotlib."""
    if len(res.varying) != 1:
        raise ValueError(
            "a plot against a swept key needs exactly one varying key; this sweep varies "
            f"{list(res.varying)}"
        )
    stat = check_choice("stat", stat, STATS)
    key, summary = res.varying[0], res.summary(window)
    plt = pyplot()
    if plt is None:
        return None
    values = res.values_of(key)
    numeric = values.dtype.kind in "iuf"
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for i, method in enumerate(res.methods):
        color = _color(plt, i, len(res.methods))
        entries = [e for e in summary if e["method"] == method]
        mean, low, high = (np.array([e[f"{stat}_{k}"] for e in entries]) for k in _BAR)
        low, high = np.clip(low, 0.0, 1.0), np.clip(high, 0.0, 1.0)  # accuracies
        if shown(entries[0][key]) == "-":  # the key does not concern it: one flat line
            ax.axhline(100 * mean[0], color=color, lw=1.4, ls="--", label=f"{method} (no {key})")
            if np.isfinite(low[0]):
                ax.axhspan(100 * low[0], 100 * high[0], color=color, alpha=0.12, lw=0)
            continue
        at = [np.flatnonzero(values == e[key])[0] for e in entries]
        x = values[at] if numeric else np.asarray(at, float)
        err = np.nan_to_num(np.stack([mean - low, high - mean]))  # n = 1: no bar
        style = {"marker": "o", "capsize": 3, "lw": 1.4}
        ax.errorbar(x, 100 * mean, yerr=100 * err, color=color, label=method, **style)
    if numeric and values.min() > 0 and values.max() >= 20 * values.min():
        ax.set_xscale("log")
    if not numeric:
        ax.set_xticks(range(values.size), [shown(v) for v in values.tolist()])
    what = {"final": "final", "last": f"last-{window}-round mean", "max": "maximum"}[stat]
    ax.set(xlabel=key, ylabel=f"{what} target accuracy (%)")
    ax.set_title("mean over seeds; bars: 95% confidence interval (Student t)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_heatmap(
    res: SweepResult, path: str | Path, method: str, stat: str = "final", window: int = 5
) -> Path | None:
    """A 2-D grid's mean `stat` target accuracy (%) over seeds of `method`, as a heatmap
    with the values written in the cells (blank: not run; a key that does not concern
    `method` is one row or column "-"). `ValueError` unless exactly two
    keys are swept; None (nothing written) without matplotlib."""
    rows, cols, cells = res.heatmap_values(method, stat, window)
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(2.5 + 0.9 * len(cols), 2.0 + 0.55 * len(rows)), dpi=120)
    im = ax.imshow(100 * cells, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(cols)), [shown(v) for v in cols])
    ax.set_yticks(range(len(rows)), [shown(v) for v in rows])
    ax.set(xlabel=res.swept[1], ylabel=res.swept[0])
    middle = (im.norm.vmin + im.norm.vmax) / 2 if np.isfinite(cells).any() else 0.0
    for (i, j), v in np.ndenumerate(100 * cells):
        if np.isfinite(v):
            color = "white" if v < middle else "black"
            ax.text(j, i, f"{v:.1f}", ha="center", va="center", color=color, fontsize=8)
    fig.colorbar(im, ax=ax, label="target accuracy (%)")
    what = {"final": "final", "last": f"last-{window}-round mean", "max": "maximum"}[stat]
    ax.set_title(f"{method}: {what} target accuracy, mean over seeds", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def _color(plt: Any, i: int, n: int) -> Any:
    """The colour of line `i` of `n`: tab10 for up to 10, else evenly along viridis."""
    if n <= 10:
        return plt.get_cmap("tab10")(i)
    return plt.get_cmap("viridis")(i / (n - 1))
