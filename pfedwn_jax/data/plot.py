"""Fig. 7-style heatmap of class counts per client (matplotlib imported lazily, Agg backend)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np


def plot_label_heatmap(
    counts: np.ndarray, path: str | Path, title: str = "", client_labels: list[str] | None = None
) -> Path:
    """Write a clients x labels heatmap of `counts [clients, classes]` to `path` (PNG/PDF/SVG).

    Cells are annotated with counts when the grid is small enough to read. Needs matplotlib
    (the `plot` extra); the file is written atomically.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError("plotting needs matplotlib: pip install 'pfedwn-jax[plot]'") from e
    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ValueError(f"counts must be [clients, classes]; got shape {counts.shape}")
    clients, classes = counts.shape
    path = Path(path)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * classes + 2), max(3.0, 0.35 * clients + 1.5)))
    try:
        im = ax.imshow(counts, aspect="auto", cmap="Blues")
        fig.colorbar(im, ax=ax, label="samples")
        ax.set_xlabel("label")
        ax.set_ylabel("client")
        if classes <= 20:
            ax.set_xticks(range(classes), [f"L{k}" for k in range(classes)])
        if clients <= 40:
            ax.set_yticks(range(clients), client_labels or [str(n) for n in range(clients)])
        if clients * classes <= 400:
            hi = counts.max(initial=0)
            for (n, k), v in np.ndenumerate(counts):
                if v:
                    color = "white" if v > 0.6 * hi else "black"
                    ax.text(k, n, str(v), ha="center", va="center", fontsize=7, color=color)
        if title:
            ax.set_title(title)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=path.suffix or ".png")
        os.close(fd)
        try:
            fig.savefig(tmp, dpi=120)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    finally:
        plt.close(fig)
    return path
