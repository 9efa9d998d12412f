"""The robustness experiment: target accuracy versus link quality and mobility, per method.

Four axes, each swept with every other setting at the base config's value:

- `gamma`: the SINR threshold `gamma_th` under `link_model="physical"`;
- `eps`: the selection threshold `eps` under `physical`;
- `loss`: a fixed per-round failure probability `link_failure` of every link (`bernoulli`);
- `speed`: node speed (m/s) under `physical` with random-waypoint mobility and neighbor
  re-selection every `reselect_every` rounds. Speed 0 runs the config without mobility,
  which equals the mobile run at speed 0 bit for bit (tests/test_mobility_training.py).

Every point runs every method of the base config with channel-aware selection
(`selection=True`, `P_err < eps`) and without it (`selection=False`: every neighbor in
range), for each seed. Every distinct config of every axis, mobile ones included, goes into
one job (`api.sweep` of a list of configs): runs that share shapes share a compiled program (the
static link models, the mobile ones). Identical configs (e.g. `eps` without selection) run
once.

The statistic per run and method is the target accuracy averaged over the last `window`
rounds (`last`; `final` and `max` are kept too); the summary gives its mean over seeds with
a Student-t 95% interval (`results.sweep.mean_std_ci`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pfedwn_jax import api
from pfedwn_jax._checks import check_choice, check_int
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.io import atomic_write_json, atomic_write_text, csv_text
from pfedwn_jax.plotting import pyplot, save_figure
from pfedwn_jax.reproduce.paper_numbers import METHODS
from pfedwn_jax.results.stats import mean_std_ci

AXES = ("gamma", "eps", "loss", "speed")
#: The x-axis label of each axis's panel.
AXIS_LABEL = {
    "gamma": "SINR threshold gamma_th (physical)",
    "eps": "selection threshold eps (physical)",
    "loss": "fixed link failure probability (bernoulli)",
    "speed": "node speed, m/s (physical, waypoint)",
}
#: Config fields written next to every number of the per-run CSV.
CONFIG_COLUMNS = (
    "link_model",
    "gamma_th",
    "eps",
    "link_failure",
    "selection",
    "mobility",
    "speed",
    "round_seconds",
    "reselect_every",
    "model",
    "rounds",
    "num_neighbors",
    "topology_seed",
    "partition",
)
STATS = ("last", "final", "max")
SCHEMA = "pfedwn-robustness/1"


@dataclasses.dataclass(frozen=True)
class Preset:
    """One experiment size.

    Attributes:
      base: config of every run (model, rounds, methods, ...); each point replaces its axis.
      seeds: the seeds (model init, batch order and data partition per seed).
      values: axis -> the swept values.
      round_seconds, reselect_every: mobility of the `speed` axis.
      window: rounds averaged for the `last` statistic.
    """

    base: ExperimentConfig
    seeds: tuple[int, ...]
    values: dict[str, tuple[float, ...]]
    round_seconds: float = 1.0
    reselect_every: int = 5
    window: int = 5


def _base(model: str, rounds: int) -> ExperimentConfig:
    return ExperimentConfig(model=model, rounds=rounds, algorithms=METHODS, link_model="physical")


PRESETS = {
    # a few seconds per program on a CPU: for tests and a smoke check
    "tiny": Preset(
        base=_base("logreg", 2),
        seeds=(0, 1),
        values={"gamma": (2.0, 15.0), "eps": (0.02, 0.05), "loss": (0.0, 0.5), "speed": (0.0, 5.0)},
        window=1,
    ),
    # the committed run (docs/img/robustness): a 2-core CPU, under 15 minutes
    "small": Preset(
        base=_base("logreg", 20),
        seeds=(0, 1, 2),
        values={
            "gamma": (2.0, 5.0, 15.0),
            "eps": (0.02, 0.05, 0.15),
            "loss": (0.0, 0.3, 0.6, 0.9),
            "speed": (0.0, 5.0),
        },
    ),
    # a GPU: the paper's MLP, more rounds, seeds and points (not run on the CPU)
    "gpu": Preset(
        base=_base("mlp", 50),
        seeds=tuple(range(10)),
        values={
            "gamma": (1.0, 2.0, 5.0, 10.0, 15.0, 20.0),
            "eps": (0.01, 0.02, 0.05, 0.1, 0.15, 0.3),
            "loss": (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
            "speed": (0.0, 0.5, 1.0, 2.0, 5.0, 10.0),
        },
        window=10,
    ),
}


def point_config(
    preset: Preset, axis: str, value: float, selection: bool, seed: int
) -> ExperimentConfig:
    """The config of one point: the base with `axis` set to `value`, `selection`, `seed`."""
    cfg = preset.base.replace(seed=seed, selection=selection)
    if axis == "gamma":
        return cfg.replace(link_model="physical", gamma_th=value)
    if axis == "eps":
        return cfg.replace(link_model="physical", eps=value)
    if axis == "loss":
        return cfg.replace(link_model="bernoulli", link_failure=value)
    cfg = cfg.replace(link_model="physical")
    if value == 0:  # equals the mobile run at speed 0 to the bit, and batches in a sweep
        return cfg
    return cfg.replace(
        mobility="waypoint",
        speed=value,
        round_seconds=preset.round_seconds,
        reselect_every=preset.reselect_every,
    )


def plan(preset: Preset, axes: Sequence[str] = AXES) -> list[dict[str, Any]]:
    """Every point of the experiment: `{"axis", "value", "selection", "seed", "config"}`,
    axes in `AXES` order, then values, selection (True first), seeds."""
    axes = parse_axes(axes)
    return [
        {
            "axis": a,
            "value": float(v),
            "selection": sel,
            "seed": s,
            "config": point_config(preset, a, float(v), sel, s),
        }
        for a in axes
        for v in preset.values[a]
        for sel in (True, False)
        for s in preset.seeds
    ]


def parse_axes(axes: str | Sequence[str]) -> tuple[str, ...]:
    """`"gamma,loss"` or a sequence -> the axes in `AXES` order (ValueError naming `only`)."""
    items = [a.strip() for a in axes.split(",")] if isinstance(axes, str) else list(axes)
    if not items:
        raise ValueError(f"only: no axis given; allowed: {list(AXES)}")
    chosen = {check_choice("only", a, AXES) for a in items}
    return tuple(a for a in AXES if a in chosen)


def _key(config: ExperimentConfig) -> str:
    return json.dumps(config.to_dict(), sort_keys=True, default=str)


def run_points(
    points: list[dict[str, Any]], *, progress: bool = False, **job: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(curves, meta)`: `config key -> {method: target accuracy [R]}` for every distinct
    config of `points`, all in one job (`api.sweep`; `job`: its `checkpoint`, `resume`,
    `overwrite`), and the job's meta (programs, timings)."""
    unique = {_key(p["config"]): p["config"] for p in points}
    keys = list(unique)
    res = api.sweep([unique[k] for k in keys], progress=progress, **job)
    cols = res.rows
    return {k: _curves(cols, cols["run"] == i) for i, k in enumerate(keys)}, res.meta


def _curves(cols: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """`method -> target accuracy [R]` of the table rows `rows` (one run), by round."""
    out = {}
    for m in dict.fromkeys(cols["method"][rows].tolist()):
        sel = rows & (cols["method"] == m)
        order = np.argsort(cols["round"][sel])
        out[m] = np.asarray(cols["target_accuracy"][sel][order], np.float64)
    return out


def run_stats(acc: np.ndarray, window: int) -> dict[str, float]:
    """`last` (mean of the last `window` rounds), `final` and `max` of `acc [R]`."""
    acc = np.asarray(acc, np.float64)
    return {"last": float(acc[-window:].mean()), "final": float(acc[-1]), "max": float(acc.max())}


def table(points: list[dict[str, Any]], curves: dict[str, Any], window: int) -> list[dict]:
    """One row per point x method: axis, value, selection, seed, method, `STATS`, rounds
    run, and the `CONFIG_COLUMNS` of the run's config."""
    rows = []
    for p in points:
        cfg = p["config"]
        for m, acc in curves[_key(cfg)].items():
            rows.append(
                {
                    **{k: p[k] for k in ("axis", "value", "selection", "seed")},
                    "method": m,
                    **run_stats(acc, window),
                    "rounds_run": len(acc),
                    **{f"config.{f}": getattr(cfg, f) for f in CONFIG_COLUMNS},
                }
            )
    return rows


def summarize(rows: list[dict[str, Any]], stat: str = "last") -> list[dict[str, Any]]:
    """Mean over seeds of `stat` with its 95% Student-t interval, per axis x value x
    selection x method (in order of appearance)."""

    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault((r["axis"], r["value"], r["selection"], r["method"]), []).append(r[stat])
    out = []
    for (axis, value, sel, m), vals in groups.items():
        mean, std, low, high = mean_std_ci(vals)
        out.append(
            {
                "axis": axis,
                "value": value,
                "selection": sel,
                "method": m,
                "stat": stat,
                "n": len(vals),
                "mean": mean,
                "std": std,
                "ci_low": low,
                "ci_high": high,
            }
        )
    return out


@dataclasses.dataclass(frozen=True)
class RobustnessResult:
    """The experiment's numbers: `rows` (per point x method, see `table`), `summary` (see
    `summarize`) and `meta` (preset, base config, seeds, values, timings, machine load)."""

    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    meta: dict[str, Any]

    def save(self, out_dir: str | Path) -> dict[str, Path]:
        """Write `runs.csv`, `summary.csv`, `robustness.json` (everything, with each run's
        full config) and `robustness.png` (without matplotlib: no PNG); returns the paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {
            "runs.csv": atomic_write_text(out / "runs.csv", _csv(self.rows)),
            "summary.csv": atomic_write_text(out / "summary.csv", _csv(self.summary)),
            "robustness.json": atomic_write_json(
                out / "robustness.json",
                {"schema": SCHEMA, "meta": self.meta, "summary": self.summary, "runs": self.rows},
                indent=None,
            ),
        }
        png = plot(self.summary, out / "robustness.png", self.meta.get("title", ""))
        if png is not None:
            paths["robustness.png"] = png
        return paths

    @classmethod
    def load(cls, path: str | Path) -> RobustnessResult:
        """The result saved in `robustness.json` at `path` (e.g. to re-plot it)."""
        doc = json.loads(Path(path).read_text())
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"{path}: schema {doc.get('schema')!r}; expected {SCHEMA!r}")
        return cls(doc["runs"], doc["summary"], doc["meta"])


def _csv(rows: list[dict[str, Any]]) -> str:
    header = list(rows[0]) if rows else []
    return csv_text(header, ([r.get(k) for k in header] for r in rows))


def run_robustness(
    preset: str | Preset = "small",
    axes: str | Sequence[str] = AXES,
    *,
    seeds: Sequence[int] | None = None,
    methods: Sequence[str] | None = None,
    progress: bool = False,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> RobustnessResult:
    """Run the experiment of `preset` (a name in `PRESETS` or a `Preset`) on `axes`;
    `seeds` / `methods` replace the preset's; `checkpoint` / `resume` / `overwrite` as in
    `run()` (an interrupted study continues where it stopped). Nothing else is written
    (`RobustnessResult.save`)."""
    name = preset if isinstance(preset, str) else "custom"
    if isinstance(preset, str):
        preset = PRESETS[check_choice("preset", preset, PRESETS)]
    if seeds is not None:
        preset = dataclasses.replace(preset, seeds=tuple(check_int("seeds", s, 0) for s in seeds))
    if len(preset.seeds) < 2:  # before any run: the summary is a 95% interval over seeds
        raise ValueError(
            f"seeds: the summary's 95% interval over seeds needs 2 at least; got "
            f"{list(preset.seeds)}"
        )
    if methods is not None:
        preset = dataclasses.replace(preset, base=preset.base.replace(algorithms=tuple(methods)))
    points = plan(preset, axes)
    load0, t0 = os.getloadavg(), time.perf_counter()
    curves, job = run_points(
        points, progress=progress, checkpoint=checkpoint, resume=resume, overwrite=overwrite
    )
    rows = table(points, curves, preset.window)
    meta = {
        "preset": name,
        "axes": list(parse_axes(axes)),
        "values": {a: list(preset.values[a]) for a in parse_axes(axes)},
        "seeds": list(preset.seeds),
        "methods": list(preset.base.method_names),
        "base_config": preset.base.to_dict(),
        "round_seconds": preset.round_seconds,
        "reselect_every": preset.reselect_every,
        "window": preset.window,
        "stat": "last: mean target accuracy over the last `window` rounds",
        "distinct_runs": len(curves),
        "programs": job["programs"],
        "wall_s": time.perf_counter() - t0,
        "loadavg_before": list(load0),
        "loadavg_after": list(os.getloadavg()),
        "cpu_count": os.cpu_count(),
        "title": f"robustness ({name}): target accuracy, last {preset.window} rounds, "
        f"mean and 95% CI over {len(preset.seeds)} seeds",
    }
    return RobustnessResult(rows, summarize(rows), meta)


def plot(summary: list[dict[str, Any]], path: str | Path, title: str = "") -> Path | None:
    """One panel per axis: mean accuracy (%) vs the axis value with 95% CI error bars, a line
    per method (solid: selection, dashed: no selection). None without matplotlib."""
    plt = pyplot()
    if plt is None or not summary:
        return None
    axes = [a for a in AXES if any(r["axis"] == a for r in summary)]
    methods = list(dict.fromkeys(r["method"] for r in summary))
    fig, panels = plt.subplots(1, len(axes), figsize=(4.6 * len(axes), 4.2), squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, axis in zip(panels[0], axes, strict=True):
        for i, m in enumerate(methods):
            for sel in (True, False):
                _plot_line(ax, summary, axis, m, sel, colors(i), i, len(methods))
        ax.set_xlabel(AXIS_LABEL[axis])
        ax.set_ylabel("target accuracy (%)")
        ax.set_ylim(top=100.5)
        ax.grid(alpha=0.3)
    handles, labels = panels[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    return save_figure(fig, path, dpi=90)


def _plot_line(
    ax: Any, summary: list[dict], axis: str, method: str, sel: bool, color: Any, i: int, n: int
) -> None:
    """One method's line on one panel, x jittered per method so the intervals stay apart."""
    pts = [
        r for r in summary if r["axis"] == axis and r["method"] == method and r["selection"] == sel
    ]
    if not pts:
        return
    x = np.array([r["value"] for r in pts])
    span = (x.max() - x.min()) or 1.0
    x = x + (i - (n - 1) / 2) * 0.012 * span + (0 if sel else 0.006 * span)
    mean = np.array([r["mean"] for r in pts]) * 100
    low = np.clip([r["ci_low"] for r in pts], 0, 1) * 100  # an accuracy's interval: [0, 1]
    high = np.clip([r["ci_high"] for r in pts], 0, 1) * 100
    err = None if np.isnan(low).all() else np.stack([mean - low, high - mean])
    ax.errorbar(
        x,
        mean,
        yerr=err,
        color=color,
        ls="-" if sel else "--",
        marker="o" if sel else "x",
        ms=3,
        lw=1.2,
        capsize=2,
        elinewidth=0.6,
        ecolor=(*color[:3], 0.35),
        label=f"{method}" + ("" if sel else " (no selection)"),
    )
