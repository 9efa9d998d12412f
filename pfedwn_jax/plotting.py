"""matplotlib for every plot of the package: imported lazily, non-interactive backend.

matplotlib is an optional, heavy dependency (the `plot` extra), so it is imported only when a
plot is drawn. Behaviour without it, everywhere: `pyplot()` returns None, the plotting function
returns None without writing anything, and a command-line caller prints `MISSING` once.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pfedwn_jax.io import atomic_savefig

MISSING = "matplotlib is not installed (pip install 'pfedwn-jax[plot]'): no plot written"


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
    """Write `fig` atomically (format from the suffix) and close it; returns the path."""
    plt = pyplot()
    try:
        return atomic_savefig(fig, path, **savefig_kwargs)
    finally:
        if plt is not None:
            plt.close(fig)
