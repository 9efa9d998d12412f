"""The paper's learning results (Sec. V): Table II, Table III, Fig. 1, Fig. 8 and Fig. 9.

`reproduce(only, preset, out)` runs the sweeps the requested items need (`runs`), writes the
tables (`tables`), the figures (`figures`, and the wireless ones of `wireless_figs`), the
crossover study beyond the paper (`crossover`) and `REPORT.md` (`report`). Every number comes
from sweeps: the tables show the test accuracy of the runs at each method's chosen point
(chosen on a validation split): final, mean of the last `window` rounds and max over rounds,
each as the mean and 95% Student-t interval over the seeds (model initialisation and batch
order; the partition is fixed by `data_seed` so a case keeps its data, as in the paper's
Fig. 7).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pfedwn_jax.reproduce import wireless_figs
from pfedwn_jax.reproduce.crossover import run_crossover, write_crossover
from pfedwn_jax.reproduce.field import run_field, write_field
from pfedwn_jax.reproduce.figures import fig1, fig8, fig9
from pfedwn_jax.reproduce.presets import Preset, get_preset
from pfedwn_jax.reproduce.report import write_report
from pfedwn_jax.reproduce.runs import dataset_base, run_tables, table_cases
from pfedwn_jax.reproduce.tables import (
    paired_to_local,
    paired_variants,
    table_rows,
    target_test_counts,
    write_pairs,
    write_table,
)

LEARNING_ITEMS = ("table2", "em", "table3", "fig1", "fig8", "fig9")


WIRELESS_ITEMS = ("fig4", "fig5", "fig6", "fig7")


ALL_ITEMS = ("fig1", "fig4", "fig5", "fig6", "fig7", "fig8", "table2", "em", "table3", "fig9",
             "crossover")  # fmt: skip
#: Items beyond "all": the comparison table of every registered method (`reproduce.field`).
EXTRA_ITEMS = ("field",)


def parse_items(only: str | Sequence[str] | None) -> tuple[str, ...]:
    """`"table2,fig8"` (or a list; None or "all": every paper item and the crossover) as
    item names, in paper order, then `EXTRA_ITEMS` named."""
    if only is None or only == "all":
        return ALL_ITEMS
    names = [s.strip() for s in only.split(",")] if isinstance(only, str) else list(only)
    known = (*ALL_ITEMS, *EXTRA_ITEMS)
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ValueError(f"only: unknown item(s) {bad or names}; allowed: {list(known)}")
    return tuple(i for i in known if i in names)


def wireless_item(item: str, out: Path, p: Preset) -> dict[str, Any]:
    """A wireless figure of `reproduce.wireless_figs`. Figs. 4 and 7 show the cases the runs
    use (the preset's criterion); Fig. 7 the partition the runs of Fig. 8's dataset train on
    (the preset's sample cap included)."""

    if item not in ("fig4", "fig7"):
        return dict(wireless_figs.FIGURES[item](out, p.name))
    spec = next(s for s in p.datasets if s.label == p.fig8)
    base = dataset_base(p, spec, "local")
    cases = table_cases(base, p.criterion)
    return dict(wireless_figs.FIGURES[item](out, p.name, base=base, cases=cases))


def reproduce(
    only: str | Sequence[str] | None,
    preset: str | Preset,
    out: str | Path,
    log: Callable[[str], None] = print,
    methods: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run the requested paper items with a preset; write figures, tables and `REPORT.md`
    into `out`. `methods`: those of the "field" table (default: every registered one).
    Returns `{"items": {item: artifacts}, "wall_s": {...}, "tables": rows, "pairs": {...},
    "crossover": rows, "field": rows, "report": path}`."""
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
    pairs: dict[str, list[dict[str, Any]]] = {}
    if any(i in LEARNING_ITEMS for i in items):
        t0 = time.perf_counter()
        rows, sweeps = run_tables(p, items, out, log)
        wall["sweeps"] = time.perf_counter() - t0
        done.update(_learning_outputs(items, rows, sweeps, p, out, wall))
        pairs = _pairs(rows, sweeps, p, out, done)
    cross = None
    if "crossover" in items:
        cross = _crossover(p, out, done, wall, log)
    field = None
    if "field" in items:
        field = run_field(p, out, methods, log)
        title = f"Every method on Table II's cases, preset {p.name}"
        done["field"] = write_field(out, field, title)
        wall["field"] = field["command_s"]
    report = write_report(out, p, items, done, rows, wall, pairs, cross, field)
    return {"items": done, "wall_s": wall, "tables": rows, "pairs": pairs,
            "crossover": None if cross is None else cross["rows"],
            "field": None if field is None else field["rows"], "report": report}  # fmt: skip


def _pairs(rows, sweeps, p: Preset, out: Path, done) -> dict[str, list[dict[str, Any]]]:
    """Every method against Local and pFedWN's EM variants against the default, paired by
    seed; each written as JSON."""
    counts = target_test_counts([r for r in rows if "variant" not in r])
    pairs = {"local": paired_to_local(rows, sweeps, p.window, n_test=counts),
             "em": paired_variants(rows, sweeps, p.window)}  # fmt: skip
    if pairs["local"]:
        path = write_pairs(out, pairs["local"], p.window, "paired_to_local", "method - Local")
        done["paired_to_local"] = {"json": path}
    if pairs["em"]:
        done["em"]["pairs"] = write_pairs(out, pairs["em"], p.window, "em_pairs")
    return pairs


def _crossover(p: Preset, out: Path, done, wall, log) -> dict[str, Any] | None:

    if p.crossover is None:
        log(f"crossover: preset {p.name!r} has none; skipped")
        return None
    t0 = time.perf_counter()
    result = run_crossover(p, out, log)
    title = f"Where collaboration pays: {p.datasets[0].label}, preset {p.name}"
    done["crossover"] = write_crossover(out, result, title)
    wall["crossover"] = time.perf_counter() - t0
    return result


def _learning_outputs(items, rows, sweeps, p: Preset, out: Path, wall) -> dict[str, Any]:
    done: dict[str, Any] = {}
    for table in ("table2", "table3", "em"):
        if table in items:
            name = "em_variants" if table == "em" else table
            done[table] = write_table(table_rows(rows, table), out, name)
    for name, fn in (("fig1", fig1), ("fig9", fig9)):
        if name in items:
            done[name] = fn(rows, sweeps, p, out)
    if "fig8" in items:
        t0 = time.perf_counter()
        done["fig8"] = fig8(rows, sweeps, p, out)
        wall["fig8"] = time.perf_counter() - t0
    return done
