"""`pfedwn neighbors`: place a target and n neighbors, print P_err and the selection, plot.

`--seed S` places the network `run()` uses for `topology_seed=S` (`place_network`), so with the
default target (data client 0) neighbor `k` here is data client `k` in the experiment.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from pfedwn_jax._checks import check_int
from pfedwn_jax.cli.common import check_eps_flag
from pfedwn_jax.io import atomic_write_json, check_writable_file
from pfedwn_jax.plotting import MISSING, pyplot, save_figure
from pfedwn_jax.wireless import (
    MOMENT_MODES,
    ChannelParams,
    error_probability,
    perr_ceiling,
    place_network,
    select_neighbors,
)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "neighbors",
        help="channel-aware neighbor selection for one random topology",
        description="Place a target and N neighbors uniformly in the area, compute each "
        "link's transmission error probability and select neighbors with "
        "P_err < eps (paper Sec. III-B).",
    )
    p.add_argument("--num-neighbors", type=int, default=10)
    p.add_argument("--gamma-th", type=float, default=5.0, help="SINR threshold (linear)")
    p.add_argument("--eps", type=float, default=0.05, help="selection threshold on P_err")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="topology seed: the network `pfedwn run --topology-seed` places (default: 0)",
    )
    p.add_argument("--moments", choices=MOMENT_MODES, default="paper")
    p.add_argument("--num-subchannels", type=int, default=ChannelParams().num_subchannels)
    p.add_argument("--plot", type=Path, default=None, help="write a Fig. 4-style heatmap PNG")
    p.add_argument("--json", type=Path, default=None, help="write the table as JSON")
    p.set_defaults(func=run)


def probe_field(
    target: Any,
    neighbors: Any,
    gamma_th: float,
    params: ChannelParams,
    moments: str,
    grid: int = 120,
) -> tuple[np.ndarray, np.ndarray]:
    """P_err of a probe neighbor at each grid point, all placed neighbors interfering."""
    axis = np.linspace(0.0, float(params.area_m), grid)
    gx, gy = np.meshgrid(axis, axis)
    probes = np.stack([gx.ravel(), gy.ravel()], -1)[:, None, :]  # [G, 1, 2]
    nb = np.broadcast_to(np.asarray(neighbors), (probes.shape[0], *np.shape(neighbors)))
    links = np.concatenate([probes, nb], axis=1)  # probe first
    perr = error_probability(np.asarray(target), links, gamma_th, params, moments)
    return axis, np.asarray(perr[:, 0]).reshape(grid, grid)


def plot_heatmap(
    path: Path,
    target: Any,
    neighbors: Any,
    perr: Any,
    chosen: Any,
    gamma_th: float,
    eps: float,
    params: ChannelParams,
    moments: str,
) -> Path | None:
    """Positions coloured by P_err over a probe-neighbor P_err field; selected ones ringed.

    Returns the path, or None (nothing written) without matplotlib.
    """
    plt = pyplot()
    if plt is None:
        return None
    axis, field = probe_field(target, neighbors, gamma_th, params, moments)
    fig, ax = plt.subplots(figsize=(6.4, 5.4))
    im = ax.pcolormesh(
        axis,
        axis,
        field,
        cmap="viridis_r",
        shading="auto",
        vmin=0.0,
        vmax=perr_ceiling(params, moments),
    )
    fig.colorbar(im, ax=ax, label="P_err of a neighbor at this position")
    _draw_nodes(ax, np.asarray(target), np.asarray(neighbors), perr, chosen, eps, im.norm)
    ax.set(
        xlim=(0, float(params.area_m)),
        ylim=(0, float(params.area_m)),
        xlabel="x (m)",
        ylabel="y (m)",
        title=f"P_err, gamma_th={gamma_th:g}, moments={moments}",
    )
    ax.set_aspect("equal")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=2, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


def _draw_nodes(
    ax: Any, target: np.ndarray, nb: np.ndarray, perr: Any, chosen: Any, eps: float, norm: Any
) -> None:
    """Neighbors `nb [n, 2]` coloured by P_err (numbered, selected ringed) and the target."""
    ax.scatter(
        nb[:, 0],
        nb[:, 1],
        c=np.asarray(perr),
        cmap="viridis_r",
        vmin=norm.vmin,
        vmax=norm.vmax,
        edgecolors="white",
        s=70,
        zorder=3,
    )
    sel = np.asarray(chosen)
    ax.scatter(
        nb[sel, 0],
        nb[sel, 1],
        facecolors="none",
        edgecolors="red",
        s=220,
        linewidths=2,
        zorder=4,
        label=f"selected (P_err < {eps:g})",
    )
    for i, (x, y) in enumerate(nb):
        ax.annotate(
            str(i + 1),
            (x, y),
            xytext=(6, 6),
            textcoords="offset points",
            color="white",
            fontsize=9,
            zorder=5,
        )
    ax.scatter(
        [target[0]],
        [target[1]],
        marker="*",
        s=350,
        c="black",
        edgecolors="white",
        zorder=5,
        label="target",
    )


def neighbor_rows(target: Any, neighbors: Any, perr: Any, chosen: Any) -> list[dict[str, Any]]:
    """One row per neighbor (ids from 1): position, distance to the target, P_err, selected."""
    dist = np.asarray(jnp.linalg.norm(neighbors - target, axis=-1))
    rows = []
    for i in range(len(dist)):
        x, y = (float(v) for v in neighbors[i])
        rows.append(
            {
                "id": i + 1,
                "x": x,
                "y": y,
                "distance_m": float(dist[i]),
                "perr": float(perr[i]),
                "selected": bool(chosen[i]),
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'id':>3} {'x (m)':>7} {'y (m)':>7} {'dist (m)':>9} {'P_err':>10}  selected")
    for r in rows:
        print(
            f"{r['id']:>3} {r['x']:>7.1f} {r['y']:>7.1f} {r['distance_m']:>9.2f} "
            f"{r['perr']:>10.4g}  {'yes' if r['selected'] else 'no'}"
        )
    chosen = [r["id"] for r in rows if r["selected"]]
    print(f"selected {len(chosen)} of {len(rows)}: {chosen}")


def run(args: argparse.Namespace) -> int:
    n = check_int("--num-neighbors", args.num_neighbors, 1, 10_000)
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None:
            check_writable_file(path, flag)
    params = ChannelParams(num_subchannels=args.num_subchannels)
    check_eps_flag(args.eps, params, args.moments)
    target, neighbors = place_network(args.seed, n, params)
    perr = error_probability(target, neighbors, args.gamma_th, params, args.moments)
    chosen = select_neighbors(perr, args.eps)
    print(
        f"target at ({float(target[0]):.1f}, {float(target[1]):.1f}) m; gamma_th="
        f"{args.gamma_th:g}, eps={args.eps:g}, |F|={args.num_subchannels}, "
        f"moments={args.moments}"
    )
    rows = neighbor_rows(target, neighbors, perr, chosen)
    print_table(rows)
    if args.json is not None:
        atomic_write_json(
            args.json,
            {
                "target": [float(v) for v in target],
                "gamma_th": args.gamma_th,
                "eps": args.eps,
                "moments": args.moments,
                "seed": args.seed,
                "params": params.to_dict(),
                "neighbors": rows,
            },
            indent=2,
        )
        print(f"wrote {args.json}")
    if args.plot is not None:
        png = plot_heatmap(
            args.plot,
            target,
            neighbors,
            perr,
            chosen,
            args.gamma_th,
            args.eps,
            params,
            args.moments,
        )
        if png is None:
            print(MISSING, file=sys.stderr)
        else:
            print(f"wrote {png}")
    return 0
