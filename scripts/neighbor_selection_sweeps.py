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
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax.io import atomic_write_json
from pfedwn_jax.plotting import MISSING, pyplot, save_figure
from pfedwn_jax.wireless import (
    MOMENT_MODES,
    ChannelParams,
    error_probability,
    place_uniform,
    sample_ppp,
    select_neighbors,
)

SUBCHANNELS = np.arange(8, 21)
DENSITIES = np.round(np.arange(1, 16) * 0.5e-3, 6)
GAMMAS = np.array([5.0, 10.0, 15.0])
FIG6_EPS = np.array([0.01, 0.03, 0.05, 0.1])
FIG6_GAMMA_A = 5.0
MAX_NEIGHBORS = 30


def fig5_grid(
    key: Any, draws: int, max_nodes: int, moments: str, eps: float = 0.05
) -> dict[str, Any]:
    """Mean selected count [gamma, F, density] and mean node count [density]."""
    params = ChannelParams()
    k_t, k_p = jax.random.split(key)
    targets = jax.random.uniform(k_t, (len(DENSITIES), draws, 2)) * params.area_m
    keys = jax.random.split(k_p, (len(DENSITIES), draws))
    dens = jnp.broadcast_to(jnp.asarray(DENSITIES)[:, None], keys.shape)
    xy, valid = jax.jit(jax.vmap(jax.vmap(lambda k, d: sample_ppp(k, d, params, max_nodes))))(
        keys, dens
    )

    def per_f(f: Any) -> Any:
        p = dataclasses.replace(params, num_subchannels=f)
        perr = error_probability(
            targets, xy, jnp.asarray(GAMMAS)[:, None, None], p, moments, valid
        )  # [gamma, density, draw, node]
        return select_neighbors(perr, eps, valid).sum(-1).mean(-1)  # [gamma, density]

    counts = jax.vmap(per_f)(jnp.asarray(SUBCHANNELS))  # [F, gamma, density]
    return {
        "num_subchannels": SUBCHANNELS.tolist(),
        "density_per_m2": DENSITIES.tolist(),
        "gamma_th": GAMMAS.tolist(),
        "eps": eps,
        "draws": draws,
        "max_nodes": max_nodes,
        "truncated_draws": int(np.sum(np.asarray(valid).all(-1))),
        "mean_nodes": np.asarray(valid).sum(-1).mean(-1).tolist(),
        "mean_selected": np.transpose(np.asarray(counts), (1, 0, 2)).tolist(),
    }


def fig6_grid(key: Any, draws: int, moments: str) -> dict[str, Any]:
    """Mean |M_n| vs |G_n| = 1..30 for each (gamma_th, eps)."""
    gammas = np.unique(np.concatenate([GAMMAS, [FIG6_GAMMA_A]]))
    keys = jax.random.split(key, draws)
    t, nb = jax.jit(jax.vmap(place_uniform, (0, None)), static_argnums=1)(keys, MAX_NEIGHBORS)
    sizes = np.arange(1, MAX_NEIGHBORS + 1)
    valid = jnp.arange(MAX_NEIGHBORS) < jnp.asarray(sizes)[:, None, None]  # [G, 1, n]
    valid = jnp.broadcast_to(valid, (len(sizes), draws, MAX_NEIGHBORS))
    perr = error_probability(
        t, nb, jnp.asarray(gammas)[:, None, None], None, moments, valid
    )  # [gamma, G, draw, n]
    chosen = select_neighbors(
        perr[None], jnp.asarray(FIG6_EPS)[:, None, None, None, None], valid
    )  # [eps, gamma, G, draw, n]
    mean = np.asarray(chosen.sum(-1).mean(-1))  # [eps, gamma, G]
    return {
        "num_neighbors": sizes.tolist(),
        "gamma_th": gammas.tolist(),
        "eps": FIG6_EPS.tolist(),
        "draws": draws,
        "mean_selected": mean.tolist(),
    }


def plot(out: Path, fig5: dict[str, Any], fig6: dict[str, Any], moments: str) -> list[Path]:
    """Fig. 5 and Fig. 6 as PNGs in `out` (none without matplotlib)."""
    plt = pyplot()
    if plt is None:
        print(MISSING, file=sys.stderr)
        return []
    paths = []
    f_grid, d_grid = np.meshgrid(
        fig5["num_subchannels"], np.asarray(fig5["density_per_m2"]) * 1e3, indexing="ij"
    )
    sel = np.asarray(fig5["mean_selected"])
    fig = plt.figure(figsize=(15, 4.6))
    for i, g in enumerate(fig5["gamma_th"]):
        ax = fig.add_subplot(1, 3, i + 1, projection="3d")
        ax.plot_surface(f_grid, d_grid, sel[i], cmap="viridis", vmin=0, vmax=sel.max())
        ax.set(
            xlabel="|F|",
            ylabel="density (1e-3 / m^2)",
            zlabel="avg selected",
            title=f"gamma_th = {g:g}, eps = {fig5['eps']:g}",
            zlim=(0, sel.max()),
        )
    fig.suptitle(
        f"Fig. 5: average number of selected neighbors ({fig5['draws']} PPP draws, "
        f"moments={moments})"
    )
    fig.tight_layout()
    paths.append(save_figure(fig, out / "fig5_subchannels_density.png", dpi=110))

    m = np.asarray(fig6["mean_selected"])
    gammas, eps = fig6["gamma_th"], fig6["eps"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    gi = gammas.index(FIG6_GAMMA_A)
    for ei, e in enumerate(eps):
        a.plot(fig6["num_neighbors"], m[ei, gi], marker="o", ms=3, label=f"eps = {e:g}")
    a.set(title=f"(a) gamma_th = {FIG6_GAMMA_A:g}", xlabel="|G_n|", ylabel="|M_n| (mean)")
    ei = eps.index(0.05)
    for gj, g in enumerate(gammas):
        b.plot(fig6["num_neighbors"], m[ei, gj], marker="o", ms=3, label=f"gamma_th = {g:g}")
    b.set(title="(b) eps = 0.05", xlabel="|G_n|", ylabel="|M_n| (mean)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"Fig. 6: selected vs available neighbors ({fig6['draws']} draws, moments={moments})"
    )
    fig.tight_layout()
    paths.append(save_figure(fig, out / "fig6_selected_vs_neighbors.png", dpi=110))
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
