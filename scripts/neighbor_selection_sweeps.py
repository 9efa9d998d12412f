"""Reproduce the paper's neighbor-selection sweeps (Fig. 5 and Fig. 6) as PNG + JSON.

Fig. 5: average number of selected neighbors vs |F| (8..20) and PPP density (0.5e-3..7.5e-3
per m^2) for gamma_th 5, 10, 15 at eps 0.05, `--draws` PPP realisations per grid point
(the target is placed uniformly; by Slivnyak's theorem the other PPP points are its
neighbors). The whole grid is one vectorized call: a vmap over |F| of `error_probability`
on [gamma_th, density, draw, max_nodes] links.
Fig. 6: |M_n| vs |G_n| (1..30 uniformly placed neighbors) for several eps (a) and gamma_th
(b), also one call. The same placements are reused across |F|, gamma_th and eps (common
random numbers), so differences between curves are not sampling noise.

    python scripts/neighbor_selection_sweeps.py --out runs/sweeps [--draws 100] [--moments paper]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from pfedwn_jax.io import atomic_write_json
from pfedwn_jax.plotting import MISSING
from pfedwn_jax.reproduce.wireless_figs import plot_fig5, plot_fig6
from pfedwn_jax.wireless import MOMENT_MODES, ChannelParams
from pfedwn_jax.wireless.selection_sweeps import (
    DENSITIES,
    GAMMAS,
    SUBCHANNELS,
    fig5_grid,
    fig6_grid,
)


def plot(out: Path, fig5: dict[str, Any], fig6: dict[str, Any], moments: str) -> list[Path]:
    """Fig. 5 and Fig. 6 as PNGs in `out` (none without matplotlib)."""
    paths = [plot_fig5(out, fig5, f"moments={moments}"), plot_fig6(out, fig6, f"moments={moments}")]
    if None in paths:
        print(MISSING, file=sys.stderr)
        return []
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/neighbor_sweeps"))
    ap.add_argument("--draws", type=int, default=100, help="PPP draws per Fig. 5 grid point")
    ap.add_argument("--fig6-draws", type=int, default=20, help="draws per Fig. 6 point")
    ap.add_argument("--max-nodes", type=int, default=48, help="PPP padding (mean <= 18.75)")
    ap.add_argument("--moments", choices=MOMENT_MODES, default="paper")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    k5, k6 = jax.random.split(jax.random.key(args.seed))
    start = time.perf_counter()
    fig5 = fig5_grid(k5, args.draws, args.max_nodes, args.moments)
    t5 = time.perf_counter() - start
    start = time.perf_counter()
    fig6 = fig6_grid(k6, args.fig6_draws, args.moments)
    t6 = time.perf_counter() - start
    links5 = len(SUBCHANNELS) * len(GAMMAS) * len(DENSITIES) * args.draws * args.max_nodes
    result = {
        "moments": args.moments,
        "seed": args.seed,
        "fig5": fig5,
        "fig6": fig6,
        "wall_s": {"fig5": t5, "fig6": t6},
        "fig5_links_evaluated": links5,
        "params": ChannelParams().to_dict(),
    }
    path = args.out / "neighbor_selection_sweeps.json"
    atomic_write_json(path, result)
    print(f"Fig. 5 grid ({links5:,} padded links, incl. compilation): {t5:.1f} s")
    print(f"Fig. 6 grid: {t6:.1f} s")
    sel = np.asarray(fig5["mean_selected"])
    for i, g in enumerate(GAMMAS):
        print(
            f"  gamma_th={g:g}: mean selected over the Fig. 5 grid {sel[i].mean():.2f} "
            f"(|F|=14: {sel[i, 6].min():.2f}..{sel[i, 6].max():.2f} across densities)"
        )
    print(f"wrote {path}")
    if not args.no_plot:
        for p in plot(args.out, fig5, fig6, args.moments):
            print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
