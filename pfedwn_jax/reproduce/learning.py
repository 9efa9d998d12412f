"""The paper's learning results (Sec. V): Table II, Table III, Fig. 1, Fig. 8 and Fig. 9.

`reproduce(only, preset, out)` runs the sweeps the requested items need (`runs`), writes the
tables (`tables`), the figures (`figures`, and the wireless ones of `wireless_figs`) and
`REPORT.md`. Every number comes from sweeps: the tables show the test accuracy of the runs
at each method's chosen point (chosen on a validation split): final, mean of the last
`window` rounds and max over rounds, each as the mean and 95% Student-t interval over the
seeds (model initialisation and batch order; the partition is fixed by `data_seed` so a case
keeps its data, as in the paper's Fig. 7).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pfedwn_jax.reproduce.figures import fig1, fig8, fig9
from pfedwn_jax.reproduce.paper_numbers import PAPER_MAX
from pfedwn_jax.reproduce.presets import Preset, get_preset
from pfedwn_jax.reproduce.runs import SPECIAL, dataset_base, run_tables
from pfedwn_jax.reproduce.tables import (
    chosen_table,
    markdown_table,
    paired_table,
    paired_variants,
    write_pairs,
    write_table,
)

LEARNING_ITEMS = ("table2", "table3", "fig1", "fig8", "fig9")


WIRELESS_ITEMS = ("fig4", "fig5", "fig6", "fig7")


ALL_ITEMS = ("fig1", "fig4", "fig5", "fig6", "fig7", "fig8", "table2", "table3", "fig9")


def parse_items(only: str | Sequence[str] | None) -> tuple[str, ...]:
    """`"table2,fig8"` (or a list; None or "all": everything) as item names, in paper order."""
    if only is None or only == "all":
        return ALL_ITEMS
    names = [s.strip() for s in only.split(",")] if isinstance(only, str) else list(only)
    bad = [n for n in names if n not in ALL_ITEMS]
    if bad or not names:
        raise ValueError(f"only: unknown item(s) {bad or names}; allowed: {list(ALL_ITEMS)}")
    return tuple(i for i in ALL_ITEMS if i in names)


def wireless_item(item: str, out: Path, p: Preset) -> dict[str, Any]:
    """A wireless figure of `reproduce.wireless_figs`. Fig. 7 shows the partition the runs
    of Fig. 8's dataset train on (the preset's sample cap included)."""
    from pfedwn_jax.reproduce import wireless_figs

    if item != "fig7":
        return dict(wireless_figs.FIGURES[item](out, p.name))
    spec = next(s for s in p.datasets if s.label == p.fig8)
    base = dataset_base(p, spec, "local")
    return dict(wireless_figs.fig7(out, p.name, base=base))


def reproduce(
    only: str | Sequence[str] | None,
    preset: str | Preset,
    out: str | Path,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the requested paper items with a preset; write figures, tables and `REPORT.md`
    into `out`. Returns `{"items": {item: artifacts}, "wall_s": {...}, "tables": rows}`."""
    items, p = parse_items(only), get_preset(preset)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    done: dict[str, Any] = {}
    wall: dict[str, float] = {}
    for item in (i for i in items if i in WIRELESS_ITEMS):
        t0 = time.perf_counter()
        done[item] = wireless_item(item, out, p)
        wall[item] = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    pairs: list[dict[str, Any]] = []
    if any(i in LEARNING_ITEMS for i in items):
        t0 = time.perf_counter()
        rows, sweeps = run_tables(p, items, out, log)
        wall["sweeps"] = time.perf_counter() - t0
        done.update(_learning_outputs(items, rows, sweeps, p, out, wall))
        pairs = paired_variants(rows, sweeps, p.window)
        if pairs:
            done["em_variants"] = {"json": write_pairs(out, pairs, p.window)}
    report = write_report(out, p, items, done, rows, wall, pairs)
    return {"items": done, "wall_s": wall, "tables": rows, "report": report}


def _learning_outputs(items, rows, sweeps, p: Preset, out: Path, wall) -> dict[str, Any]:
    done: dict[str, Any] = {}
    if "table2" in items:
        done["table2"] = write_table([r for r in rows if r["case"] not in SPECIAL], out, "table2")
    if "table3" in items:
        done["table3"] = write_table([r for r in rows if r["case"] == SPECIAL[0]], out, "table3")
    for name, fn in (("fig1", fig1), ("fig9", fig9)):
        if name in items:
            done[name] = fn(rows, sweeps, p, out)
    if "fig8" in items:
        t0 = time.perf_counter()
        done["fig8"] = fig8(rows, sweeps, p, out)
        wall["fig8"] = time.perf_counter() - t0
    return done


def _artifacts(done: Mapping[str, Any], out: Path) -> list[str]:
    """One Markdown line per item: its files (`files`, else its path values) relative to
    `out`."""
    lines = []
    for item, arts in done.items():
        paths = arts.get("files") or [v for v in arts.values() if isinstance(v, str | Path)]
        files = [os.path.relpath(v, out) for v in paths]
        lines.append(f"- {item}: " + ", ".join(f"`{f}`" for f in files))
    return lines


def _sweep_seconds(rows: Sequence[Mapping[str, Any]]) -> float:
    """Total wall time of the distinct sweeps behind `rows` (each row carries its sweep's)."""
    return float(sum(t for _, t in {(r["dataset"], r["sweep_wall_s"]) for r in rows}))


def write_report(
    out: Path,
    p: Preset,
    items,
    done,
    rows: Sequence[Mapping[str, Any]],
    wall,
    pairs: Sequence[Mapping[str, Any]] = (),
) -> Path:
    """`out/REPORT.md`: preset, wall times, the tables (max and last-5 with 95% intervals),
    the chosen hyperparameters and the artifact list."""
    from pfedwn_jax.io import atomic_write_text

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    text = [
        f"# Reproduction report: preset `{p.name}`",
        "",
        f"Preset: {p.description}. Seeds {list(p.seeds)}; hyperparameters chosen per "
        "(dataset, case, method) on a validation split "
        f"(`val_fraction={p.base.get('val_fraction')}` of each client's training data), "
        "by the mean target validation accuracy of the last "
        f"{p.window} rounds; the tables show target **test** accuracy (%) at the chosen point: "
        "mean ± half-width of the 95% Student-t interval over the seeds.",
        "",
        f"Items: {', '.join(items)}. Wall time (s): "
        + ", ".join(f"{k} {v:.0f}" for k, v in wall.items())
        + f"; {os.cpu_count()} CPU cores, load average {load:.1f} at the end. The sweeps' own "
        f"wall time, including those read back from an earlier run: {_sweep_seconds(rows):.0f} s.",
        "",
    ]
    tables = (("Table II", [r for r in rows if r["case"] not in SPECIAL]),
              ("Table III", [r for r in rows if r["case"] == SPECIAL[0]]))  # fmt: skip
    for title, sel in tables:
        if not sel:
            continue
        last = f"ours, mean of the last {p.window} rounds"
        for stat, what, ref in (("max", "max over rounds: paper / ours", PAPER_MAX),
                                ("last", last, None)):  # fmt: skip
            text += [f"## {title}: {what}", "", markdown_table(sel, stat, ref), ""]
    if pairs:
        text += [f"## pFedWN EM variants: paired difference to the default (last {p.window} "
                 "rounds, points; mean ± 95% half-width over seeds)", "",
                 paired_table(pairs), ""]  # fmt: skip
    if rows:
        text += ["## Chosen hyperparameters", "", chosen_table(rows), ""]
    text += ["## Artifacts", "", *_artifacts(done, out), ""]
    return atomic_write_text(out / "REPORT.md", "\n".join(text))
