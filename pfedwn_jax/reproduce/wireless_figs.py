"""The paper's wireless and data figures, Fig. 4-7, as PNG + JSON/CSV of every plotted number.

Each `figN(out_dir, preset) -> dict` writes its files into `out_dir` and returns what it wrote
(`files`), the numbers, the config, seeds and wall time (also in `figN.json`). Presets: "tiny"
(tests), "quick" (seconds on a 2-core CPU), "paper" (the paper's draw counts; still seconds:
these are wireless numerics and one partition). `base` = the runs' base `ExperimentConfig`
(channel, eps, moments, dataset, partition, data seed); `cases` = `paper_cases(base)`.
What the figures show, against the paper's: docs/REPRODUCTION.md.

* Cases (`cases.paper_cases`, Table I, "paper" moments, eps 0.05): the first topology seed
  whose target selects 4/3/2 neighbors at gamma_th 5/10/15, targets data clients 0, 1, 2.
* Fig. 4 (paper: P_err heatmaps of Case 1-3, selected neighbors ringed): `fig4a_case1.png`..
  The paper's three targets sit at different places of one network; here the target is the
  placement's centre node (what `run()` trains), so the three panels show one topology at
  three gamma_th (nested selections, since P_err grows with gamma_th) with three different
  target data clients. The background is the P_err a probe neighbor would have at each
  position (the placed neighbors interfering); it saturates at e^{-2} = 0.135 (docs/wireless.md).
* Fig. 5 (paper: mean selected count vs |F| 8-20 and PPP density 0.5e-3-7.5e-3 /m^2, one panel
  per gamma_th, eps 0.05, 100 draws): `wireless.selection_sweeps`' grid (as the script), 3-D
  surfaces.
* Fig. 6 (paper: |M_n| vs |G_n| for several eps (a) and gamma_th at eps 0.05 (b), 20
  placements, "rounded"): the script's grid; CSV holds the mean and the rounded mean. The paper
  does not list its eps values; we use 0.01, 0.03, 0.05, 0.1.
* Fig. 7 (paper: CIFAR-10 class counts of each case's target and selected neighbors, full
  CIFAR-10, 60,000 samples): `fig7a_case1.png`.. from the partition the runs use
  (`setup.load_data`). quick/tiny use the real CIFAR-10 subsets in `../shared/data`
  (6,187 / 1,200 samples), so counts are ~10x / 50x smaller than the paper's; "paper" reads
  full CIFAR-10 through TFDS and falls back to the subset (recorded as `fallback_dataset`)
  where TFDS has no prepared copy. The partition is the paper's scheme (Dirichlet 0.1, U{1..C}
  classes); pass the runs' `base` so the figure shows their data seed and dataset.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from pfedwn_jax._checks import check_choice
from pfedwn_jax.cli.neighbors import neighbor_rows, plot_heatmap, probe_field
from pfedwn_jax.data import DatasetUnavailableError, client_label_counts, load_dataset
from pfedwn_jax.data.plot import plot_label_heatmap
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.federation import channel_params
from pfedwn_jax.experiment.setup import load_data
from pfedwn_jax.io import atomic_write_json, atomic_write_text, atomic_write_with, write_npz
from pfedwn_jax.plotting import pyplot, save_figure
from pfedwn_jax.reproduce.cases import Case, paper_cases
from pfedwn_jax.reproduce.presets import shared_data_dir
from pfedwn_jax.wireless import ChannelParams, place_network
from pfedwn_jax.wireless.selection_sweeps import fig5_grid, fig6_grid


@dataclasses.dataclass(frozen=True)
class WirelessPreset:
    """Sizes of the wireless/data figures.

    Attributes:
      fig5_draws: PPP realisations per (|F|, density, gamma_th) point (paper: 100).
      fig6_draws: placements per |G_n| (paper: 20).
      max_nodes: PPP padding of Fig. 5 (mean node count <= 18.75).
      dataset: Fig. 7's default dataset: a file in the shared data folder or a TFDS name.
    """

    fig5_draws: int
    fig6_draws: int
    max_nodes: int
    dataset: str


PRESETS = {
    "tiny": WirelessPreset(2, 2, 48, "cifar10_1k_200.npz"),
    "quick": WirelessPreset(20, 20, 48, "cifar10_exact_subset.npz"),
    "mnist-full": WirelessPreset(100, 20, 48, "mnist.npz"),
    "paper": WirelessPreset(100, 20, 48, "cifar10"),
}
#: Probe positions per axis of the Fig. 4 background (`cli.neighbors.plot_heatmap`'s grid, so
#: the saved field is the one plotted).
FIG4_GRID = 120
#: Used by "paper" for Fig. 7 where TFDS has no prepared CIFAR-10.
FALLBACK_DATASET = "cifar10_exact_subset.npz"


def _dataset_name(name: str) -> str:
    """`npz:PATH` for a file of the shared data folder, else the name (TFDS)."""
    return f"npz:{shared_data_dir() / name}" if name.endswith(".npz") else name


def preset_config(preset: str) -> ExperimentConfig:
    """The base config of the figures for `preset` (Table I channel, the paper's partition)."""
    p = PRESETS[check_choice("preset", preset, PRESETS)]
    return ExperimentConfig(dataset=_dataset_name(p.dataset), partition="paper")


def _setup(
    out_dir: str | Path, preset: str, base: ExperimentConfig | None, data: bool = False
) -> tuple[Path, WirelessPreset, ExperimentConfig]:
    """Output folder, preset and base config. Only a figure of the data (`data`) needs the
    preset's dataset (the shared data folder); the wireless ones use the channel alone."""
    p = PRESETS[check_choice("preset", preset, PRESETS)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if base is None:
        base = preset_config(preset) if data else ExperimentConfig(partition="paper")
    return out, p, base


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Rows (same keys) as CSV, atomically."""
    lines = [",".join(rows[0])]
    lines += [",".join(_cell(v) for v in r.values()) for r in rows]
    return atomic_write_text(path, "\n".join(lines) + "\n")


def _cell(v: Any) -> str:
    return f"{v:.9g}" if isinstance(v, float) else str(v)


def _finish(out: Path, name: str, record: dict[str, Any], start: float) -> dict[str, Any]:
    """Add wall time and the JSON path to `record`, write `name.json`, return the record."""
    record["wall_s"] = round(time.perf_counter() - start, 3)
    path = out / f"{name}.json"
    record["files"] = [str(f) for f in [*record.get("files", []), path] if f is not None]
    atomic_write_json(path, record)
    return record


# --------------------------------------------------------------------------- Fig. 4
def fig4(
    out_dir: str | Path,
    preset: str = "quick",
    *,
    base: ExperimentConfig | None = None,
    cases: list[Case] | None = None,
) -> dict[str, Any]:
    """P_err maps of the three cases' targets with the selected neighbors ringed.

    Files: `fig4{a,b,c}_case{1,2,3}.png`, `fig4_links.csv` (every target-neighbor link:
    position, distance, P_err, selected), `fig4_field.npz` (the background `[case, y, x]`).
    """
    start = time.perf_counter()
    out, _, base = _setup(out_dir, preset, base)
    cases = paper_cases(base) if cases is None else cases
    params = channel_params(base)
    rows, fields, files = [], [], []
    for i, case in enumerate(cases):
        target, nbrs = place_network(case.topology_seed, case.num_neighbors, params)
        chosen = np.isin(np.arange(1, case.num_neighbors + 1), case.selected)
        perr = np.asarray(case.perr)
        for r in neighbor_rows(np.asarray(target), np.asarray(nbrs), perr, chosen):
            rows.append({"case": case.name, "gamma_th": case.gamma_th, **r})
        axis, field = probe_field(target, nbrs, case.gamma_th, params, base.moments, FIG4_GRID)
        fields.append(field)
        png = out / f"fig4{chr(97 + i)}_{case.name.lower().replace(' ', '')}.png"
        files.append(
            plot_heatmap(
                png, target, nbrs, perr, chosen, case.gamma_th, base.eps, params, base.moments
            )
        )
    files.append(_write_csv(out / "fig4_links.csv", rows))
    arrays = {
        "axis_m": axis,
        "perr": np.stack(fields),
        "gamma_th": np.array([c.gamma_th for c in cases]),
    }
    files.append(
        atomic_write_with(out / "fig4_field.npz", lambda f: write_npz(f, arrays, compressed=True))
    )
    record = {
        "figure": "fig4",
        "preset": preset,
        "config": base.to_dict(),
        "params": params.to_dict(),
        "cases": [c.to_dict() for c in cases],
        "links": rows,
        "files": files,
    }
    return _finish(out, "fig4", record, start)


# --------------------------------------------------------------------------- Fig. 5 and 6
def _sweep_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """The script's keys: Fig. 5 and Fig. 6 of `--seed seed` (same numbers as the script)."""
    k5, k6 = jax.random.split(jax.random.key(seed))
    return k5, k6


def _sweep_record(name: str, preset: str, base: ExperimentConfig, seed: int) -> dict[str, Any]:
    return {
        "figure": name,
        "preset": preset,
        "seed": seed,
        "moments": base.moments,
        "params": ChannelParams().to_dict(),
        "note": "Table I channel (the script's ChannelParams()), not base.channel",
    }


def fig5(
    out_dir: str | Path,
    preset: str = "quick",
    *,
    base: ExperimentConfig | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Mean selected count vs |F| and PPP density, one 3-D panel per gamma_th (eps 0.05).

    Files: `fig5_subchannels_density.png`, `fig5.csv` (gamma_th, |F|, density, mean selected,
    mean node count), `fig5.json`.
    """
    start = time.perf_counter()
    out, p, base = _setup(out_dir, preset, base)
    grid = fig5_grid(_sweep_keys(seed)[0], p.fig5_draws, p.max_nodes, base.moments)
    sel = np.asarray(grid["mean_selected"])  # [gamma, F, density]
    rows = [
        {
            "gamma_th": g,
            "num_subchannels": f,
            "density_per_m2": d,
            "mean_selected": float(sel[gi, fi, di]),
            "mean_nodes": float(grid["mean_nodes"][di]),
        }
        for gi, g in enumerate(grid["gamma_th"])
        for fi, f in enumerate(grid["num_subchannels"])
        for di, d in enumerate(grid["density_per_m2"])
    ]
    files = [_write_csv(out / "fig5.csv", rows), plot_fig5(out, grid)]
    record = {**_sweep_record("fig5", preset, base, seed), "grid": grid, "files": files}
    return _finish(out, "fig5", record, start)


def plot_fig5(out: Path, grid: dict[str, Any], note: str = "") -> Path | None:
    """Three 3-D surfaces (one per gamma_th), as the paper's Fig. 5 (`note` ends the title)."""
    plt = pyplot()
    if plt is None:
        return None
    f_grid, d_grid = np.meshgrid(
        grid["num_subchannels"], np.asarray(grid["density_per_m2"]) * 1e3, indexing="ij"
    )
    sel = np.asarray(grid["mean_selected"])
    fig = plt.figure(figsize=(15, 4.6))
    for i, g in enumerate(grid["gamma_th"]):
        ax = fig.add_subplot(1, 3, i + 1, projection="3d")
        ax.plot_surface(f_grid, d_grid, sel[i], cmap="viridis", vmin=0, vmax=sel.max())
        ax.set(
            xlabel="|F|",
            ylabel="PPP density (1e-3 / m^2)",
            zlabel="avg selected",
            title=f"({chr(97 + i)}) gamma_th = {g:g}",
            zlim=(0, max(sel.max(), 1e-9)),
        )
    fig.suptitle(
        f"Fig. 5: average selected neighbors, eps = {grid['eps']:g}, "
        f"{grid['draws']} PPP draws per point" + (f", {note}" if note else "")
    )
    fig.tight_layout()
    return save_figure(fig, out / "fig5_subchannels_density.png", dpi=110)


def fig6(
    out_dir: str | Path,
    preset: str = "quick",
    *,
    base: ExperimentConfig | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """|M_n| vs |G_n| = 1..30: (a) for several eps at gamma_th 5, (b) for gamma_th 5/10/15
    at eps 0.05.

    Files: `fig6_selected_vs_neighbors.png`, `fig6.csv` (eps, gamma_th, |G_n|, mean and
    rounded mean of |M_n|), `fig6.json`.
    """
    start = time.perf_counter()
    out, p, base = _setup(out_dir, preset, base)
    grid = fig6_grid(_sweep_keys(seed)[1], p.fig6_draws, base.moments)
    m = np.asarray(grid["mean_selected"])  # [eps, gamma, G]
    rows = [
        {
            "eps": e,
            "gamma_th": g,
            "num_neighbors": n,
            "mean_selected": float(m[ei, gi, ni]),
            "rounded": int(np.round(m[ei, gi, ni])),
        }
        for ei, e in enumerate(grid["eps"])
        for gi, g in enumerate(grid["gamma_th"])
        for ni, n in enumerate(grid["num_neighbors"])
    ]
    files = [_write_csv(out / "fig6.csv", rows), plot_fig6(out, grid)]
    record = {**_sweep_record("fig6", preset, base, seed), "grid": grid, "files": files}
    return _finish(out, "fig6", record, start)


def plot_fig6(out: Path, grid: dict[str, Any], note: str = "") -> Path | None:
    """(a) one curve per eps at gamma_th 5, (b) one per gamma_th at eps 0.05 (`note` ends
    the title)."""
    plt = pyplot()
    if plt is None:
        return None
    m, gammas, eps = np.asarray(grid["mean_selected"]), grid["gamma_th"], grid["eps"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for ei, e in enumerate(eps):
        a.plot(
            grid["num_neighbors"], m[ei, gammas.index(5.0)], marker="o", ms=3, label=f"eps = {e:g}"
        )
    for gj, g in enumerate(gammas):
        b.plot(
            grid["num_neighbors"],
            m[eps.index(0.05), gj],
            marker="o",
            ms=3,
            label=f"gamma_th = {g:g}",
        )
    a.set(title="(a) gamma_th = 5, different eps")
    b.set(title="(b) eps = 0.05, different gamma_th")
    for ax in (a, b):
        ax.set(xlabel="|G_n| (neighbors in the area)", ylabel="|M_n| (mean selected)")
        ax.grid(alpha=0.3)
        ax.legend()
    title = f"Fig. 6: selected vs available neighbors ({grid['draws']} placements each)"
    fig.suptitle(title + (f", {note}" if note else ""))
    fig.tight_layout()
    return save_figure(fig, out / "fig6_selected_vs_neighbors.png", dpi=110)


# --------------------------------------------------------------------------- Fig. 7
def _load_partition(base: ExperimentConfig, preset: str) -> tuple[np.ndarray, str | None]:
    """`[clients, classes]` counts of the runs' partition (all splits) and the fallback used
    ("paper" without a prepared TFDS CIFAR-10: the shared CIFAR-10 subset)."""

    fallback = None
    if preset == "paper" and base.dataset == PRESETS["paper"].dataset:
        try:
            load_dataset(base.dataset, data_dir=base.data_dir)
        except DatasetUnavailableError:
            fallback = _dataset_name(FALLBACK_DATASET)
            base = dataclasses.replace(base, dataset=fallback)
    return client_label_counts(load_data(base)[0], "all"), fallback


def fig7(
    out_dir: str | Path,
    preset: str = "quick",
    *,
    base: ExperimentConfig | None = None,
    cases: list[Case] | None = None,
) -> dict[str, Any]:
    """Class counts of each case's target (TC) and selected neighbors (SN k).

    Files: `fig7{a,b,c}_case{1,2,3}.png`, `fig7_counts.csv` (every client's class counts),
    `fig7.json` (also each case's rows). The partition is `setup.load_data(base)` with
    `base.num_neighbors` set to the cases' (it does not depend on target or topology).
    """
    start = time.perf_counter()
    out, _, base = _setup(out_dir, preset, base, data=True)
    cases = paper_cases(base) if cases is None else cases
    data_cfg = cases[0].config(base)
    counts, fallback = _load_partition(data_cfg, preset)
    files, panels = [], []
    for i, case in enumerate(cases):
        clients = [case.target, *case.selected_clients]
        labels = [f"TC (client {case.target})"]
        labels += [
            f"SN {k} (client {c})"
            for k, c in zip(case.selected, case.selected_clients, strict=True)
        ]
        title = (
            f"({chr(97 + i)}) {case.name}, gamma_th = {case.gamma_th:g}: {case.num_selected} SNs"
        )
        png = out / f"fig7{chr(97 + i)}_{case.name.lower().replace(' ', '')}.png"
        files.append(plot_label_heatmap(counts[clients], png, title, labels))
        panels.append(
            {
                "case": case.name,
                "clients": clients,
                "labels": labels,
                "counts": counts[clients].tolist(),
            }
        )
    rows = [
        {"client": c, **{f"L{k}": int(v) for k, v in enumerate(r)}, "total": int(r.sum())}
        for c, r in enumerate(counts)
    ]
    files.append(_write_csv(out / "fig7_counts.csv", rows))
    if fallback is not None:
        data_cfg = dataclasses.replace(data_cfg, dataset=fallback)
    record = {
        "figure": "fig7",
        "preset": preset,
        "config": data_cfg.to_dict(),
        "data_seed": data_cfg.seed if data_cfg.data_seed is None else data_cfg.data_seed,
        "fallback_dataset": fallback,
        "cases": [c.to_dict() for c in cases],
        "panels": panels,
        "files": files,
    }
    return _finish(out, "fig7", record, start)


#: The figure functions by name (what `scripts/reproduce.py --only` selects).
FIGURES: dict[str, Callable[..., dict[str, Any]]] = {
    "fig4": fig4,
    "fig5": fig5,
    "fig6": fig6,
    "fig7": fig7,
}
