"""Fig. 7-style heatmap of class counts per client (matplotlib via `pfedwn_jax.plotting`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pfedwn_jax.plotting import pyplot, save_figure


def plot_label_heatmap(
    counts: np.ndarray, path: str | Path, title: str = "", client_labels: list[str] | None = None
) -> Path | None:
    """Write a clients x labels heatmap of `counts [clients, classes]` to `path` (PNG/PDF/SVG).

    Cells are annotated with counts when the grid is small enough to read. The file is written
    atomically. Returns None (nothing written) without matplotlib (the `plot` extra).
    """
    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ValueError(f"counts must be [clients, classes]; got shape {counts.shape}")
    plt = pyplot()
    if plt is None:
        return None
    clients, classes = counts.shape
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
    except BaseException:
        plt.close(fig)
        raise
    return save_figure(fig, path, dpi=120)
