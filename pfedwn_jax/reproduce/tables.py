"""The reproduction's tables: chosen rows as CSV/JSON and Markdown; differences paired by seed
(every method against Local, pFedWN's EM variants against its default)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.setup import load_data
from pfedwn_jax.io import atomic_write_json, atomic_write_text, csv_text
from pfedwn_jax.reproduce.runs import SPECIAL, STATS
from pfedwn_jax.results.paired import holm, is_separated, paired_t
from pfedwn_jax.results.sweep import SweepResult

TABLE_COLUMNS = (
    "dataset", "case", "method", "chosen", "seeds", "n", "n_diverged", "val_last_mean",
    *(f"{s}_{p}" for s in STATS for p in ("mean", "ci_low", "ci_high")),
    "sweep_wall_s", "config",
)  # fmt: skip


def write_table(rows: Sequence[Mapping[str, Any]], out: Path, name: str) -> dict[str, Path]:
    """`name.csv` (one line per row; chosen and config as JSON) and `name.json`."""
    lines = []
    for r in rows:
        cells = {**r, "chosen": json.dumps(r["chosen"]), "config": json.dumps(r["config"])}
        cells["seeds"] = " ".join(str(s) for s in r["seeds"])
        lines.append([cells.get(c, "") for c in TABLE_COLUMNS])
    csv_path = atomic_write_text(out / f"{name}.csv", csv_text(TABLE_COLUMNS, lines))
    doc = {"schema": "pfedwn-reproduce-table/1", "unit": "% target test accuracy",
           "rows": [{c: r.get(c) for c in TABLE_COLUMNS} for r in rows]}  # fmt: skip
    return {"csv": csv_path, "json": atomic_write_json(out / f"{name}.json", finite(doc))}


def table_rows(rows: Sequence[Mapping[str, Any]], table: str) -> list[Mapping[str, Any]]:
    """The rows of Table II ("table2": the cases), Table III ("table3": the 20-neighbor
    network) or of pFedWN's EM variants ("em", on Table II's cases)."""
    if table == "em":
        return [r for r in rows if "variant" in r]
    keep = [r for r in rows if "variant" not in r]
    if table == "table2":
        return [r for r in keep if r["case"] not in SPECIAL]
    return [r for r in keep if r["case"] == SPECIAL[0]]


def sweep_seconds(rows: Sequence[Mapping[str, Any]]) -> float:
    """Total wall time of the distinct sweeps behind `rows` (each row carries its sweep's
    `sweep_wall_s`, kept when a sweep is read back)."""
    return float(sum(t for _, t in {(r["dataset"], r["sweep_wall_s"]) for r in rows}))


def finite(obj: Any) -> Any:
    """NaN/inf floats as None, recursively (strict JSON)."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def cell(row: Mapping[str, Any], stat: str) -> str:
    """`mean +- half-width` of the 95% interval, in % (the mean alone for one seed)."""
    m, hi = row[f"{stat}_mean"], row[f"{stat}_ci_high"]
    return f"{m:.1f}" if not np.isfinite(hi) else f"{m:.1f} ± {hi - m:.1f}"


def markdown_table(
    rows: Sequence[Mapping[str, Any]],
    stat: str,
    paper: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
    bold: bool = True,
) -> str:
    """Methods x (case, dataset) in the paper's layout; the best mean per column in bold
    (``bold=False``: none; a best mean is not a difference beyond noise).
    With `paper` (`paper_numbers.PAPER_MAX`) a cell reads `paper / ours` where the paper
    has the number."""
    bold_on = bold
    cols = list(dict.fromkeys((r["case"], r["dataset"]) for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    at = {(r["method"], r["case"], r["dataset"]): r for r in rows}
    best = {
        c: max((at[m, *c][f"{stat}_mean"] for m in methods if (m, *c) in at), default=np.nan)
        for c in cols
    }
    lines = ["| method | " + " | ".join(f"{c} {d}" for c, d in cols) + " |"]
    lines.append("|---" * (len(cols) + 1) + "|")
    for m in methods:
        cells = []
        for c in cols:
            r = at.get((m, *c))
            text = "" if r is None else cell(r, stat)
            bold = bold_on and r is not None and r[f"{stat}_mean"] == best[c]
            text = f"**{text}**" if bold else text
            theirs = (paper or {}).get(c, {}).get(m)
            cells.append(text if theirs is None or r is None else f"{theirs:.1f} / {text}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def chosen_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The chosen hyperparameters per row, as Markdown."""
    lines = ["| dataset | case | method | chosen | seeds | val last-5 (%) |", "|---" * 6 + "|"]
    for r in rows:
        ch = ", ".join(f"{k}={v}" for k, v in r["chosen"].items()) or "-"
        seeds = ",".join(str(s) for s in r["seeds"])
        lines.append(
            f"| {r['dataset']} | {r['case']} | {r['method']} | {ch} | {seeds} | "
            f"{r['val_last_mean']:.1f} |"
        )
    return "\n".join(lines)


def row_of(rows: Sequence[Mapping], dataset: str, case: str, method: str) -> Mapping[str, Any]:
    for r in rows:
        if (r["dataset"], r["case"], r["method"]) == (dataset, case, method):
            return r
    raise ValueError(f"no result for {dataset} / {case} / {method}")


def seed_scores(res: SweepResult, cond: Mapping[str, Any], window: int) -> dict[int, float]:
    """Per seed, the mean target test accuracy (%) of the last `window` rounds of the runs
    matching `cond` (one run per seed)."""
    rows = res.select({k: [v] for k, v in cond.items()}).rows
    last = rows["round"] > rows["round"].max() - window
    seeds = np.unique(rows["seed"])
    return {int(s): 100 * float(rows["target_accuracy"][last & (rows["seed"] == s)].mean())
            for s in seeds}  # fmt: skip


def paired(mine: Mapping[int, float], base: Mapping[int, float]) -> dict[str, Any]:
    """`mine - base` seed by seed (the seeds both have): `n`, `diff_mean`, the half-width
    `diff_half_width` of its 95% Student-t interval (NaN for one seed), `diffs`, and both
    sides' means `mean`, `base_mean`. Same seeds, so the pairing removes the seed-to-seed
    spread that the tables' intervals carry."""
    seeds = [s for s in sorted(mine) if s in base]
    a = np.asarray([mine[s] for s in seeds], np.float64)
    b = np.asarray([base[s] for s in seeds], np.float64)
    diff = a - b
    half = (stats.t.ppf(0.975, diff.size - 1) * diff.std(ddof=1) / np.sqrt(diff.size)
            if diff.size > 1 else np.nan)  # fmt: skip
    return {"n": int(diff.size), "diff_mean": float(diff.mean()), "diff_half_width": float(half),
            "diffs": diff.round(4).tolist(), "mean": float(a.mean()),
            "base_mean": float(b.mean()), "values": a.round(6).tolist(),
            "base_values": b.round(6).tolist()}  # fmt: skip


def _cond(row: Mapping[str, Any], method: str, **extra: Any) -> dict[str, Any]:
    return {"case": row["case"], "method": method, **extra, **row["chosen"]}


def paired_variants(rows, sweeps, window: int) -> list[dict[str, Any]]:
    """Each EM variant row against the default pFedWN row of its dataset and case: the
    per-seed difference of the last-`window` test accuracy (%) (`paired`). A tuned variant
    (an extra Table II row) is compared at its own chosen point with the default at its own;
    a fixed-point variant (`point`) with the default at the same lr and `a`."""
    out = []
    for v in (r for r in rows if "variant" in r):
        d, c = v["dataset"], v["case"]
        ref = row_of(rows, d, c, "pfedwn")
        extra = {"variant": v["variant"]} | ({"point": v["point"]} if "point" in v else {})
        mine = seed_scores(sweeps[(d, "pfedwn variants")][0], _cond(v, "pfedwn", **extra), window)
        at = v if "point" in v else ref
        base = seed_scores(sweeps[(d, "pfedwn")][0], _cond(at, "pfedwn"), window)
        name = v["variant"] + (f"; {v['point']}" if "point" in v else "")
        out.append({"dataset": d, "case": c, "variant": name, **paired(mine, base)})
    return out


def paired_to_local(
    rows, sweeps, window: int, reference: str = "local", n_test: Mapping | None = None
) -> list[dict]:
    """Every method's Table II/III row against `reference`'s row (Local) of the same dataset
    and case, each at its own chosen point: the per-seed difference of the last-`window`
    test accuracy (%), `paired`; rows as `paired_variants`' with `variant` = the method.
    With `n_test` (`{(dataset, case): target's test samples}`) also the paired bootstrap
    over seeds and the test set (`results.paired`) and Holm's correction over the
    comparisons of each target (`add_bootstrap`)."""
    out = []
    for r in rows:
        m, d, c = r["method"], r["dataset"], r["case"]
        refs = [x for x in rows if (x["dataset"], x["case"], x["method"]) == (d, c, reference)]
        if m == reference or "variant" in r or not refs:
            continue  # Fig. 1's all-client FedAvg has no Local row
        ref, source = refs[0], r.get("sweep_method", m)
        mine = seed_scores(sweeps[(d, source)][0], _cond(r, source), window)
        base = seed_scores(sweeps[(d, reference)][0], _cond(ref, reference), window)
        out.append({"dataset": d, "case": c, "variant": m, **paired(mine, base)})
    return out if n_test is None else add_bootstrap(out, n_test)


def target_test_counts(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    """``{(dataset, case): test samples of the case's target}``, from each row's config (the
    partition is rebuilt on the host; the same for every method of a case)."""

    out: dict[tuple[str, str], int] = {}
    for r in rows:
        key = (r["dataset"], r["case"])
        if key not in out:
            config = ExperimentConfig.from_dict(r["config"])
            data, _ = load_data(config)
            out[key] = int(np.asarray(data.test.count)[int(config.target)])
    return out


def add_bootstrap(
    pairs: Sequence[Mapping[str, Any]],
    n_test: Mapping | Callable[[Mapping[str, Any]], int],
    family: Callable[[Mapping[str, Any]], Any] = lambda r: (r["dataset"], r["case"]),
) -> list[dict]:
    """`pairs` (`paired`'s fields, points) with the interval over seeds and the target's
    test set (`results.paired.paired_t`: `boot_low`, `boot_high` in points,
    `p`, `n_test`), Holm's adjusted `p_holm` within each `family` (default: each dataset and
    case, i.e. each target; `holm_family`: how many comparisons it holds) and `separated`
    (`results.paired.is_separated`, 0.05 after Holm). `n_test`: `{(dataset, case): n}` or a
    function of the pair. A pair without per-seed `values` is rebuilt from `diffs` and
    `base_mean` (the bootstrap reads only the differences and the two means)."""

    count = n_test if callable(n_test) else lambda r: n_test[(r["dataset"], r["case"])]
    out = []
    for r in pairs:
        if "values" in r:
            a, b = np.asarray(r["values"]), np.asarray(r["base_values"])
        else:
            b = np.full(len(r["diffs"]), r["base_mean"])
            a = b + np.asarray(r["diffs"])
        boot = paired_t(np.clip(a / 100, 0, 1), np.clip(b / 100, 0, 1), count(r))
        out.append(dict(r, _boot=boot))
    for fam in dict.fromkeys(family(r) for r in out):
        members = [r for r in out if family(r) == fam]
        adj = holm([r["_boot"]["p"] for r in members])
        for r, pa in zip(members, adj, strict=True):
            b = r.pop("_boot")
            r.update(boot_low=100 * b["low"], boot_high=100 * b["high"], p=b["p"],
                     p_holm=float(pa), n_test=b["n_test"], holm_family=len(members),
                     separated=is_separated(b, pa))  # fmt: skip
    return out


def paired_table(pairs: Sequence[Mapping[str, Any]], head: str = "variant - default") -> str:
    """Markdown: variants x (case, dataset), cells `+d ± h` (points of accuracy); where the
    pairs carry the bootstrap (`add_bootstrap`), `+d [low, high]` over seeds and the test
    set, in bold where separated from 0 after Holm's correction."""
    cols = list(dict.fromkeys((r["case"], r["dataset"]) for r in pairs))
    at = {(r["variant"], r["case"], r["dataset"]): r for r in pairs}
    lines = [f"| {head} | " + " | ".join(f"{c} {d}" for c, d in cols) + " |"]
    lines.append("|---" * (len(cols) + 1) + "|")
    for name in dict.fromkeys(r["variant"] for r in pairs):
        cells = [at.get((name, *c)) for c in cols]
        text = ["" if r is None else _pair_cell(r) for r in cells]
        lines.append(f"| {name} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def _pair_cell(r: Mapping[str, Any]) -> str:
    if "boot_low" not in r:
        return f"{r['diff_mean']:+.1f} ± {r['diff_half_width']:.1f}"
    text = f"{r['diff_mean']:+.2f} [{r['boot_low']:+.2f}, {r['boot_high']:+.2f}]"
    return f"**{text}**" if r["separated"] else text


def write_pairs(
    out: Path,
    pairs: Sequence[Mapping[str, Any]],
    window: int,
    name: str = "em_pairs",
    what: str = "variant - default",
) -> Path:
    """`name.json`: the pairs (`paired`'s fields per dataset, case and variant)."""

    doc = {"schema": "pfedwn-reproduce-pairs/1", "window": window,
           "unit": f"points of % target test accuracy ({what}, per seed)",
           "pairs": list(pairs)}  # fmt: skip
    return atomic_write_json(out / f"{name}.json", finite(doc))
