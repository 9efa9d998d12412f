"""Where collaboration pays (beyond the paper): target accuracy against the target's data.

One sweep per method on the preset's first dataset (`Preset.crossover`): the Table II case
targets of each criterion (`counts` and `similarity`: targets whose neighbors share few or
many of their classes), every client capped at each of `caps` samples
(`max_samples_per_client`: a data-poor network, the paper's Table III explanation; the
partition and the networks stay, the clients keep random subsets), every method at fixed
hyperparameters (one `lr`, the methods' defaults) and pFedWN at each `a` of the grid. Per
(case, cap): each method's target test accuracy (mean of the last `window` rounds, mean and
95% interval over the seeds) and its difference to Local **paired by seed**; plus
"pfedwn (a on validation)", the `a` of the grid or 1 (Local itself) with the best validation
accuracy, the choice a user of pFedWN would make.

The two axes: `train_samples`, the target's training split (after the validation split) at
that cap; `class_share`, the share of the target's samples whose class makes at least
`HOLD` of some selected neighbor's samples (uncapped partition: who holds which classes);
`best_overlap`, the label overlap of its most similar selected neighbor (`cases`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from pfedwn_jax.data.federate import client_label_counts
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.setup import load_data
from pfedwn_jax.io import atomic_write_json, atomic_write_text, csv_text
from pfedwn_jax.plotting import pyplot, save_figure
from pfedwn_jax.reproduce.cases import Case, label_overlap
from pfedwn_jax.reproduce.presets import Preset
from pfedwn_jax.reproduce.runs import Setting, dataset_base, run_settings, table_cases
from pfedwn_jax.reproduce.tables import finite, paired, seed_scores

#: A neighbor "holds" a class that makes at least this share of its samples.
HOLD = 0.05
CHOSEN = "pfedwn (a on validation)"
COLUMNS = ("case", "criterion", "target", "cap", "train_samples", "class_share",
           "best_overlap", "method", "n", "mean", "ci_low", "ci_high", "diff_mean",
           "diff_half_width", "chosen_a")  # fmt: skip


def class_share(counts: Any, target: int, neighbors: Sequence[int], hold: float = HOLD) -> float:
    """Share of the target's samples whose class makes at least `hold` of some neighbor's
    samples (`counts [N, C]` class counts)."""
    c = np.asarray(counts, np.float64)
    nb = c[list(neighbors)]
    held = (nb >= hold * np.maximum(nb.sum(1, keepdims=True), 1)).any(0) & (nb > 0).any(0)
    return float(c[target][held].sum() / max(c[target].sum(), 1.0))


def crossover_cases(preset: Preset) -> tuple[ExperimentConfig, list[tuple[str, Case]]]:
    """The study's base config (the first dataset, `crossover.rounds` and `lr`) and its
    (criterion, case) pairs: each criterion's Table II cases, a target taken once."""
    cross, spec = preset.crossover, preset.datasets[0]
    assert cross is not None  # a crossover study's preset
    base = dataset_base(preset, spec, "local").replace(rounds=cross.rounds, lr=cross.lr)
    out, seen = [], set()
    for crit in cross.criteria:
        for case in table_cases(base, crit):
            if case.target not in seen:
                seen.add(case.target)
                out.append((crit, case))
    return base, out


def _label(crit: str, case: Case) -> str:
    return f"{case.name} ({crit}), target {case.target}"


def _settings(preset: Preset, method: str, cases) -> list[Setting]:
    cross, spec = preset.crossover, preset.datasets[0]
    assert cross is not None  # a crossover study's preset
    base = dataset_base(preset, spec, method).replace(rounds=cross.rounds, lr=cross.lr)
    out = []
    for crit, case in cases:
        for cap in cross.caps:
            cfg = case.config(base).replace(max_samples_per_client=cap or spec.max_samples)
            out.append(Setting(_label(crit, case), cfg, (("cap", cap or 0),)))
    return out


def run_crossover(preset: Preset, out: Path, log=print) -> dict[str, Any]:
    """Every sweep of the study (read back from `out/sweeps/crossover_*` when saved with the
    same runs); the per-(case, cap, method) rows and the paired differences to Local."""
    cross = preset.crossover
    assert cross is not None  # a crossover study's preset
    base, cases = crossover_cases(preset)
    sweeps = {}
    for m in (*cross.methods, "pfedwn"):
        grid = {"pfedwn.a": cross.a} if m == "pfedwn" else {}
        folder = out / "sweeps" / f"crossover_{m}"
        sts = _settings(preset, m, cases)
        res, _ = run_settings(sts, grid, cross.seeds, folder, preset.max_runs)
        sweeps[m] = res
        log(f"crossover {m}: {res.num_runs} runs in {res.meta['wall_s']:.0f} s")
    sizes = _sizes(base, cases, cross.caps, preset.datasets[0].max_samples)
    rows = crossover_rows(sweeps, cases, sizes, cross, preset.window)
    wall = sum(float(r.meta["wall_s"]) for r in sweeps.values())
    return {"rows": rows, "wall_s": wall, "sweeps": sweeps}


def _sizes(base: ExperimentConfig, cases, caps, own_cap) -> dict[tuple[str, int], dict]:
    """Per (case label, cap): the target's training samples, its class share and the
    overlap of its most similar neighbor (the last two on the uncapped partition)."""

    out = {}
    whole = client_label_counts(load_data(base)[0], "all")
    overlap = label_overlap(whole)
    for cap in caps:
        train = client_label_counts(
            load_data(base.replace(max_samples_per_client=cap or own_cap))[0], "train"
        )
        for crit, case in cases:
            nb = case.selected_clients
            out[(_label(crit, case), cap or 0)] = {
                "criterion": crit, "target": case.target,
                "train_samples": int(train[case.target].sum()),
                "class_share": class_share(whole, case.target, nb),
                "best_overlap": float(max((overlap[case.target, c] for c in nb), default=0.0)),
            }  # fmt: skip
    return out


def _stats(scores: Mapping[int, float], local: Mapping[int, float]) -> dict[str, Any]:
    vals = np.asarray([scores[s] for s in sorted(scores)], np.float64)
    mean = float(vals.mean())
    half = (stats.t.ppf(0.975, vals.size - 1) * vals.std(ddof=1) / np.sqrt(vals.size)
            if vals.size > 1 else np.nan)  # fmt: skip
    low, high = mean - half, mean + half
    pair = paired(scores, local)
    return {"n": len(vals), "mean": mean, "ci_low": low, "ci_high": high,
            "diff_mean": pair["diff_mean"], "diff_half_width": pair["diff_half_width"],
            "diffs": pair["diffs"]}  # fmt: skip


def crossover_rows(sweeps, cases, sizes, cross, window: int) -> list[dict[str, Any]]:
    """Per (case, cap): a row per method (pFedWN once per `a`, and `CHOSEN`) with the
    seeds' mean and 95% interval (%), and the paired difference to Local (points)."""
    rows = []
    for crit, case in cases:
        label = _label(crit, case)
        for cap in (c or 0 for c in cross.caps):
            info = {"case": label, "cap": cap, **sizes[(label, cap)]}
            cond = {"case": label, "cap": cap}
            local = seed_scores(sweeps["local"], {**cond, "method": "local"}, window)
            for m in cross.methods:
                sc = seed_scores(sweeps[m], {**cond, "method": m}, window)
                rows.append({**info, "method": m, **_stats(sc, local), "chosen_a": None})
            rows += _pfedwn_rows(sweeps, cond, info, local, cross.a, window)
    return rows


def _pfedwn_rows(sweeps, cond, info, local, grid, window: int) -> list[dict[str, Any]]:
    """pFedWN at each `a` of `grid`, then at the `a` of best validation accuracy among
    `grid` and 1 (Local's own runs; ties go to the larger `a`, nearer Local)."""
    rows = []
    val = {1.0: _val(sweeps["local"], {**cond, "method": "local"}, window)}
    scores = {1.0: local}
    for a in grid:
        at = {**cond, "method": "pfedwn", "pfedwn.a": a}
        scores[a] = seed_scores(sweeps["pfedwn"], at, window)
        val[a] = _val(sweeps["pfedwn"], at, window)
        rows.append({**info, "method": f"pfedwn (a={a:g})", **_stats(scores[a], local),
                     "chosen_a": a})  # fmt: skip
    best = max(val, key=lambda a: (val[a], a))
    rows.append({**info, "method": CHOSEN, **_stats(scores[best], local), "chosen_a": best})
    return rows


def _val(res, cond: Mapping[str, Any], window: int) -> float:
    """Mean over seeds of the last-`window` target validation accuracy (the choice's score)."""
    rows = res.select({k: [v] for k, v in cond.items()}).rows
    last = rows["round"] > rows["round"].max() - window
    return float(np.nanmean(rows["target_val_accuracy"][last]))


def write_crossover(out: Path, result: Mapping[str, Any], title: str) -> dict[str, Path]:
    """`crossover.csv` (one line per case, cap and method), `crossover.json` and, where
    matplotlib is installed, `crossover.png`."""
    rows = result["rows"]
    cells = [{**r, "cap": r["cap"] or "none"} for r in rows]
    text = csv_text(COLUMNS, ([c.get(k) for k in COLUMNS] for c in cells))
    paths = {"csv": atomic_write_text(out / "crossover.csv", text)}
    doc = {"schema": "pfedwn-reproduce-crossover/1", "hold": HOLD, "rows": rows,
           "unit": "% target test accuracy; diff: points against Local, paired by seed",
           "wall_s": result["wall_s"]}  # fmt: skip
    paths["json"] = atomic_write_json(out / "crossover.json", finite(doc))
    png = plot_crossover(rows, out / "crossover.png", title)
    if png is not None:
        paths["png"] = png
    return paths


def by_cap(rows: Sequence[Mapping[str, Any]], method: str) -> dict[int, tuple[float, float]]:
    """Per cap, the mean over cases and seeds of `method - Local` and the half-width of the
    95% interval over seeds of the per-seed mean over the cases (pairs by seed and case)."""
    out = {}
    for cap in dict.fromkeys(r["cap"] for r in rows):
        sel = [r for r in rows if r["cap"] == cap and r["method"] == method]
        per_seed = np.mean([r["diffs"] for r in sel], axis=0)  # [seeds]
        pair = paired(dict(enumerate(per_seed)), dict.fromkeys(range(per_seed.size), 0.0))
        out[cap] = (pair["diff_mean"], pair["diff_half_width"])
    return out


def plot_crossover(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path | None:
    """Left: every method minus Local against the cap (mean over the cases, 95% interval over
    seeds); right: pFedWN minus Local per case against its class share, one line per cap."""

    plt = pyplot()
    if plt is None:
        return None
    caps = list(dict.fromkeys(r["cap"] for r in rows))
    xs = np.arange(len(caps))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 3.8), dpi=120)
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != "local"]
    for i, m in enumerate(methods):
        d = by_cap(rows, m)
        mean = np.array([d[c][0] for c in caps])
        half = np.nan_to_num(np.array([d[c][1] for c in caps]))
        left.errorbar(xs + 0.04 * (i - len(methods) / 2), mean, yerr=half, marker="o", ms=3,
                      lw=1.3, capsize=2, label=m)  # fmt: skip
    left.axhline(0.0, color="k", lw=0.8)
    left.set_xticks(xs, [str(c) if c else "none" for c in caps])
    left.set(xlabel="samples per client (cap)", ylabel="target accuracy - Local (points)")
    left.set_title("every method, mean over the targets", fontsize=9)
    left.legend(fontsize=6.5)
    cmap = plt.get_cmap("viridis")
    for j, cap in enumerate(caps):
        sel = sorted((r for r in rows if r["cap"] == cap and r["method"] == CHOSEN),
                     key=lambda r: r["class_share"])  # fmt: skip
        right.errorbar([r["class_share"] for r in sel], [r["diff_mean"] for r in sel],
                       yerr=np.nan_to_num([r["diff_half_width"] for r in sel]), marker="o",
                       ms=3, lw=1.2, capsize=2, color=cmap(j / max(len(caps) - 1, 1)),
                       label=f"cap {cap or 'none'}")  # fmt: skip
    right.axhline(0.0, color="k", lw=0.8)
    right.set(xlabel=f"share of the target's samples in classes its neighbors hold (>= {HOLD:.0%})",
              ylabel=f"{CHOSEN} - Local (points)")  # fmt: skip
    right.set_title("per target", fontsize=9)
    right.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: per case and cap, each method's `mean ± h` and `diff ± h` to Local."""
    lines = ["| case | cap | train samples | class share | method | accuracy (%) | - Local |",
             "|---" * 7 + "|"]  # fmt: skip
    for r in rows:
        acc = f"{r['mean']:.1f} ± {r['ci_high'] - r['mean']:.1f}"
        diff = "" if r["method"] == "local" else (
            f"{r['diff_mean']:+.1f} ± {r['diff_half_width']:.1f}")  # fmt: skip
        name = r["method"] + (f" ({r['chosen_a']:g})" if r["method"] == CHOSEN else "")
        lines.append(f"| {r['case']} | {r['cap'] or 'none'} | {r['train_samples']} | "
                     f"{r['class_share']:.2f} | {name} | {acc} | {diff} |")  # fmt: skip
    return "\n".join(lines)
