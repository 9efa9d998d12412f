"""matplotlib for every plot of the package: imported lazily, non-interactive backend.

matplotlib is an optional, heavy dependency (the `plot` extra), so it is imported only when a
plot is drawn. Behaviour without it, everywhere: `pyplot()` returns None, the plotting function
returns None without writing anything, and a command-line caller prints `MISSING` once.

Shared conventions: `save_figure` crops to the drawn content (no label is cut off at the
figure's edge); an axis of communication rounds goes through `rounds_axis` (whole-number
ticks, however few rounds); a curve of few points gets markers (`curve_style`), so a run of
one round still draws its point.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pfedwn_jax.io import atomic_savefig

MISSING = "matplotlib is not installed (pip install 'pfedwn-jax[plot]'): no plot written"
ROUNDS_LABEL = "communication round"
#: Curves of at most this many points are drawn with markers.
MARKER_POINTS = 30


def pyplot() -> ModuleType | None:
    """`matplotlib.pyplot` (Agg backend unless pyplot was already set up), or None if missing.

    Agg renders files without a display; a session that imported pyplot itself (a notebook)
    keeps its backend.
    """
    try:
        import matplotlib  # heavy optional package: deferred until a plot is drawn
    except ImportError:
        return None
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy optional package: deferred until a plot is drawn

    return plt


def save_figure(fig: Any, path: str | Path, **savefig_kwargs: Any) -> Path:
    """Write `fig` atomically (format from the suffix) and close it; returns the path.

    Cropped to what is drawn (`bbox_inches="tight"` unless given), so an axis label or a
    legend outside the axes is never cut off.
    """
    plt = pyplot()
    savefig_kwargs.setdefault("bbox_inches", "tight")
    try:
        return atomic_savefig(fig, path, **savefig_kwargs)
    finally:
        if plt is not None:
            plt.close(fig)


def rounds_axis(ax: Any, label: str = ROUNDS_LABEL) -> None:
    """Make the x axis of `ax` (call it after plotting) an axis of communication rounds: its
    label and whole-number ticks (two rounds would otherwise be ticked 1.0, 1.2, ..., 2.0;
    a single round gets the limits round +- 0.5, so its one tick is the round)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    low, high = ax.get_xlim()
    if high - low < 1:
        centre = round((low + high) / 2)
        ax.set_xlim(centre - 0.5, centre + 0.5)


def curve_style(num_points: int) -> dict[str, Any]:
    """Line keywords for a curve of `num_points`: markers when there are few, so one point
    (a one-round run, a method stopped at round 1) is still drawn."""
    return {"marker": "o", "ms": 4} if num_points <= MARKER_POINTS else {}


# line styles and markers cycled over the curves of one panel, so curves that coincide
# (FedProx at mu = 0 is FedAvg) stay told apart: each shows its own dashes and markers
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "x", "P", "*")


def distinct_style(index: int, num_points: int) -> dict[str, Any]:
    """Line keywords of the `index`-th curve of a panel: its own line style and marker
    (about ten markers along the curve), drawn with a thinner line the later it comes, so
    an earlier curve under a coinciding later one stays visible."""
    every = max(1, num_points // 10)
    return {
        "ls": LINE_STYLES[index % len(LINE_STYLES)],
        "marker": MARKERS[index % len(MARKERS)],
        "ms": 4,
        "markevery": (index % every, every),
        "lw": max(2.4 - 0.3 * index, 1.0),
        "zorder": 2 + index,
    }


COINCIDE = 5e-3  # accuracy (fraction) within which two curves are said to coincide


def same_as(curves: dict[str, Any]) -> dict[str, str]:
    """`name -> earlier name` for every curve within `COINCIDE` (0.5 percentage points) of
    an earlier one at every round (hard to tell apart on the plot): the legend then says
    "fedprox (within 0.5 pt of fedavg)" instead of hiding one line under the other."""
    import numpy as np

    out: dict[str, str] = {}
    names = list(curves)
    for k, name in enumerate(names):
        for earlier in names[:k]:
            a, b = np.asarray(curves[name]), np.asarray(curves[earlier])
            if a.shape == b.shape and np.allclose(a, b, rtol=0, atol=COINCIDE, equal_nan=True):
                out[name] = out.get(earlier, earlier)
                break
    return out
