"""`REPORT.md` of a reproduction: the preset, the machine and its load, the cases per
criterion, Tables II and III beside the paper's, the differences paired by seed, the
crossover study, every method's comparison table, the chosen hyperparameters and the artifact
list."""

from __future__ import annotations

import datetime as dt
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pfedwn_jax.io import atomic_write_text
from pfedwn_jax.reproduce.cases import CRITERIA, case_rows
from pfedwn_jax.reproduce.crossover import HOLD, markdown
from pfedwn_jax.reproduce.field import field_markdown
from pfedwn_jax.reproduce.paper_numbers import PAPER_MAX
from pfedwn_jax.reproduce.presets import FIXED_A, Preset
from pfedwn_jax.reproduce.runs import dataset_base, label_counts, table_cases
from pfedwn_jax.reproduce.tables import (
    chosen_table,
    markdown_table,
    paired_table,
    sweep_seconds,
    table_rows,
)


def machine_line() -> str:
    """Date (UTC), CPU cores, JAX backend and the load averages (1, 5, 15 minutes) now."""
    import jax

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (f"{now}, {platform.machine()}, {os.cpu_count()} CPU cores, JAX backend "
            f"{jax.default_backend()}, load average {load[0]:.1f} / {load[1]:.1f} / "
            f"{load[2]:.1f} (1 / 5 / 15 min)")  # fmt: skip


def cases_section(p: Preset) -> list[str]:
    """Per dataset, the cases under each criterion (`case_rows`), the preset's marked."""
    lines = [
        "## Cases",
        "",
        f'Targets chosen by `criterion={p.criterion!r}` (`reproduce.cases`: "similarity" '
        "needs a selected neighbor with label overlap >= 0.4 and one <= 0.1 and a target of at "
        'least 100 samples; "counts": targets 0, 1, 2). The other criterion\'s cases are '
        "listed for comparison. Overlap: `sum_y min(p(y), q(y))` of the label distributions.",
        "",
        "| dataset | criterion | case (topology seed) | target (samples) | neighbor: overlap "
        "| meets similarity |",
        "|---" * 6 + "|",
    ]
    for spec in p.datasets:
        base = dataset_base(p, spec, "local")
        for crit in (p.criterion, *(c for c in CRITERIA if c != p.criterion)):
            name = f"{crit} (run)" if crit == p.criterion else crit
            for n20 in (False, True):
                lines += _case_lines(base, spec.label, crit, name, n20)
    return [*lines, ""]


def _case_lines(base, label: str, crit: str, name: str, n20: bool) -> list[str]:
    """The Markdown rows of one criterion's Table II (or, `n20`, Table III) cases."""
    try:
        cases = table_cases(base, crit, n20)
    except ValueError as e:
        why = str(e).split(";")[0]
        return [f"| {label} | {name} | {'20-neighbor' if n20 else 'Cases 1-3'} | none: {why} | | |"]
    out = []
    for r in case_rows(cases, label_counts(base, 20 if n20 else 10)):
        nb = ", ".join(
            f"{c}: {v:.2f}" for c, v in zip(r["neighbors"], r["similarity"], strict=True)
        )
        out.append(
            f"| {label} | {name} | {r['case']} ({r['topology_seed']}) | {r['target']} "
            f"({r['target_samples']}) | {nb} | {'yes' if r['meets'] else 'no'} |"
        )
    return out


def _tables_section(p: Preset, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    text = []
    for title, name in (("Table II", "table2"), ("Table III", "table3")):
        sel = table_rows(rows, name)
        if not sel:
            continue
        last = f"ours, mean of the last {p.window} rounds"
        for stat, what, ref in (("max", "max over rounds: paper / ours", PAPER_MAX),
                                ("last", last, None)):  # fmt: skip
            text += [f"## {title}: {what}", "", markdown_table(sel, stat, ref), ""]
    return text


def _pairs_section(p: Preset, rows, pairs: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    text = []
    if pairs.get("local"):
        text += [f"## Every method minus Local, paired by seed (mean of the last {p.window} "
                 "rounds, points; each method at its chosen point; [95% interval over seeds "
                 "and the target's test set], bold where Holm-separated within the target: "
                 "`results/paired.py`)", "", paired_table(pairs["local"], "method - Local"),
                 ""]  # fmt: skip
    if pairs.get("em"):
        how = ("each variant tuned on validation like a method" if p.variant_points == "tuned"
               else f"each variant at a = {FIXED_A:g} and at the default's chosen a (none where "
               "that is 1: Eq. 5 then keeps the target's model whatever pi), with the default's "
               "chosen lr, against the default at the same point")  # fmt: skip
        ems = [*table_rows(rows, "em"), *(r for r in table_rows(rows, "table2")
                                          if r["method"] == "pfedwn")]  # fmt: skip
        text += [f"## pFedWN EM variants (Table II's cases, mean of the last {p.window} rounds)",
                 "", markdown_table(ems, "last"), "",
                 f"## pFedWN EM variants minus the default, paired by seed ({how}; last "
                 f"{p.window} rounds, points)", "", paired_table(pairs["em"]), ""]  # fmt: skip
    return text


def _crossover_section(cross: Mapping[str, Any] | None, p: Preset) -> list[str]:
    if cross is None:
        return []

    c = p.crossover
    assert c is not None  # the rows come from a crossover study
    return [
        "## Where collaboration pays (crossover)",
        "",
        f"Every client capped at {', '.join(str(x or 'none') for x in c.caps)} samples "
        f"(`max_samples_per_client`); targets: the Table II cases of criteria {list(c.criteria)}; "
        f"lr {c.lr}, {c.rounds} rounds, seeds {list(c.seeds)}, the methods' other "
        f"hyperparameters fixed ({_fixed(p)}), pFedWN at a = {list(c.a)} and at the a (or 1 = "
        "Local) of best "
        f"validation accuracy. Class share: the target's samples in classes that make >= "
        f"{HOLD:.0%} of some selected neighbor's data. Sweeps: {cross['wall_s']:.0f} s.",
        "",
        "![crossover](crossover.png)",
        "",
        markdown(cross["rows"]),
        "",
    ]


def _fixed(p: Preset) -> str:
    """The preset's fixed hyperparameters as `method key=value, ...`."""
    parts = [f"{m} " + ", ".join(f"{k}={v}" for k, v in hp.items()) for m, hp in p.hparams.items()]
    return "; ".join(parts) or "their defaults"


def write_report(
    out: Path,
    p: Preset,
    items,
    done,
    rows: Sequence[Mapping[str, Any]],
    wall,
    pairs: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    cross: Mapping[str, Any] | None = None,
    field: Mapping[str, Any] | None = None,
) -> Path:
    """`out/REPORT.md` (see the module docstring)."""

    models = sorted({r["config"]["model"] for r in rows}) if rows else []
    field_rows = [] if field is None else field["rows"]
    text = [
        f"# Reproduction report: preset `{p.name}`",
        "",
        f"Preset: {p.description}. Seeds {list(p.seeds)}; hyperparameters chosen per "
        "(dataset, case, method) on a validation split "
        f"(`val_fraction={p.base.get('val_fraction')}` of each client's training data), "
        "by the mean target validation accuracy of the last "
        f"{p.window} rounds; the tables show target **test** accuracy (%) at the chosen point: "
        "mean ± half-width of the 95% Student-t interval over the seeds."
        + (f" Models run: {', '.join(models)}." if models else ""),
        "",
        f"Items: {', '.join(items)}. Wall time (s): "
        + ", ".join(f"{k} {v:.0f}" for k, v in wall.items())
        + f". Machine at the end: {machine_line()}. The sweeps' own wall time, including "
        f"those read back from an earlier run: {sweep_seconds([*rows, *field_rows]):.0f} s.",
        "",
    ]
    if rows or cross is not None or field is not None:
        text += cases_section(p)
    text += _tables_section(p, rows) + _pairs_section(p, rows, pairs or {})
    text += _crossover_section(cross, p)
    text += [] if field is None else field_markdown(field)
    if rows:
        text += ["## Chosen hyperparameters", "", chosen_table(rows), ""]
    text += ["## Artifacts", "", *_artifacts(done, out), ""]
    return atomic_write_text(out / "REPORT.md", "\n".join(text))


def _artifacts(done: Mapping[str, Any], out: Path) -> list[str]:
    """One Markdown line per item: its files (`files`, else its path values) relative to
    `out`."""
    lines = []
    for item, arts in done.items():
        paths = arts.get("files") or [v for v in arts.values() if isinstance(v, str | Path)]
        files = [os.path.relpath(v, out) for v in paths]
        lines.append(f"- {item}: " + ", ".join(f"`{f}`" for f in files))
    return lines
