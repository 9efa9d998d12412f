"""The comparison table: every registered method on a preset's Table II cases.

Each method is tuned on the validation split with the same budget, `FIELD_POINTS` grid
points (`field_grid`): its own tuning axis (`Algorithm.tune`, two values from its paper's
grid) beside two learning rates, or four learning rates where it declares none. The runs
count the cost of a round (`cost=True`: the preset's links, ideal by default), and the table
reports target test accuracy at the chosen point, each method minus Local paired by seed
with an interval over seeds and the target's test set (Holm's correction over the methods of
each target), and the mean bits, airtime, energy and duration of a round. Its sweeps are
saved under `OUT/field/sweeps/`, so an interrupted table continues where it stopped.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pfedwn_jax.algorithms import FAMILIES, Algorithm, available_algorithms, get_algorithm
from pfedwn_jax.io import atomic_write_json, atomic_write_text
from pfedwn_jax.reproduce.presets import Preset
from pfedwn_jax.reproduce.runs import pick, run_tables
from pfedwn_jax.reproduce.tables import (
    finite,
    markdown_table,
    paired_table,
    paired_to_local,
    sweep_seconds,
    table_rows,
    target_test_counts,
    write_table,
)

#: Grid points every method of the table is tuned over.
FIELD_POINTS = 4
#: The learning rates of the table: all four for a method without a tuning axis, the middle
#: two beside a method's own axis.
FIELD_LRS = (0.01, 0.03, 0.1, 0.3)
#: Per-round cost columns of a sweep (`results.metrics`; totals over the slots), their units.
COST_COLUMNS = {"bits_sent": "Mbit", "airtime_s": "s", "energy_j": "J", "round_s": "s"}
_SCALE = {"bits_sent": 1e-6}


def field_grid(alg: Algorithm, lrs: Sequence[float] = FIELD_LRS) -> dict[str, tuple[Any, ...]]:
    """The grid of `alg` in the table (`FIELD_POINTS` points): `lr` over the middle two of
    `lrs` times its `tune` axis (spelled `NAME.key`), or `lr` over all four."""
    if len(lrs) != FIELD_POINTS:
        raise ValueError(f"the table needs {FIELD_POINTS} learning rates; got {list(lrs)}")
    if alg.tune is None:
        return {"lr": tuple(lrs)}
    key, values = alg.tune
    return {"lr": tuple(lrs[1:3]), f"{alg.name}.{key}": tuple(values)}


def field_methods(methods: Sequence[str] | None = None) -> tuple[str, ...]:
    """`methods` (default: every registered one), Local first, then by family
    (`FAMILIES` order) and registration order (ValueError naming an unknown method)."""
    given = available_algorithms() if methods is None else methods
    algs = [get_algorithm(m) for m in dict.fromkeys(["local", *given])]  # unknown: raises
    order = {f: i for i, f in enumerate(FAMILIES)}
    ranked = sorted(algs, key=lambda a: (a.name != "local", order.get(a.family, len(order))))
    return tuple(a.name for a in ranked)


def field_preset(preset: Preset, methods: Sequence[str] | None = None) -> Preset:
    """`preset` running `field_methods(methods)` (Local always: the reference), each over
    `field_grid`, with the cost of a round counted, and nothing but Table II's cases."""
    names = field_methods(methods)
    grids = {m: field_grid(get_algorithm(m)) for m in names}
    return dataclasses.replace(
        preset, methods=names, grids=grids, base={**preset.base, "cost": True}, variants=()
    )


def round_cost(res: Any, row: Mapping[str, Any]) -> dict[str, float | None]:
    """The mean per round (over rounds and seeds) of each `COST_COLUMNS` total over the
    slots, for the runs of a table row (None where the sweep has no such column)."""
    picked = pick(res, row).rows
    return {k: (float(np.mean(picked[k])) * _SCALE.get(k, 1.0) if k in picked else None)
            for k in COST_COLUMNS}  # fmt: skip


def run_field(
    preset: Preset,
    out: Path,
    methods: Sequence[str] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the table's sweeps into `out/field/` and return `{"rows", "pairs", "wall_s",
    "command_s", "preset"}`: the chosen rows (with `family` and the `cost` of a round), every
    method minus Local (`tables.paired_to_local`, with the bootstrap and Holm's correction),
    the summed wall time of the sweeps (each its own, whether run now or read back from an
    earlier command) and this command's."""
    fp = field_preset(preset, methods)
    t0 = time.perf_counter()
    rows, sweeps = run_tables(fp, ("table2",), out / "field", log)
    rows = [dict(r) for r in table_rows(rows, "table2")]
    for r in rows:
        r["family"] = get_algorithm(r["method"]).family
        r["cost"] = round_cost(sweeps[(r["dataset"], r["method"])][0], r)
    pairs = paired_to_local(rows, sweeps, fp.window, n_test=target_test_counts(rows))
    return {"rows": rows, "pairs": pairs, "wall_s": sweep_seconds(rows),
            "command_s": time.perf_counter() - t0, "preset": fp}  # fmt: skip


def cost_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: per method, its family and the mean cost of a round over its rows."""
    heads = [f"{k} ({u})" for k, u in COST_COLUMNS.items()]
    lines = ["| method | family | " + " | ".join(heads) + " |", "|---" * (len(heads) + 2) + "|"]
    for m in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == m]
        cells = []
        for k in COST_COLUMNS:
            vals = [r["cost"][k] for r in mine if r["cost"][k] is not None]
            cells.append(f"{np.mean(vals):.4g}" if vals else "")
        lines.append(f"| {m} | {mine[0]['family']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def field_markdown(result: Mapping[str, Any]) -> list[str]:
    """The table's Markdown section: accuracy, the paired differences, the cost, the grids."""
    fp, rows, pairs = result["preset"], result["rows"], result["pairs"]
    n = len({r["method"] for r in rows})
    holm = max((p["holm_family"] for p in pairs), default=0)
    grids = "; ".join(f"{m}: " + ", ".join(f"{k} {list(v)}" for k, v in g.items())
                      for m, g in fp.grids.items())  # fmt: skip
    return [
        "## Every method, tuned with the same budget",
        "",
        f"{n} methods on Table II's cases, seeds {list(fp.seeds)}, each tuned over "
        f"{FIELD_POINTS} grid points on validation (the mean target validation accuracy of "
        f"the last {fp.window} rounds); target test accuracy (%) at the chosen point, mean of "
        f"the last {fp.window} rounds ± the 95% interval over seeds. Sweeps: "
        f"{result['wall_s']:.0f} s, each its own wall time (this command: "
        f"{result['command_s']:.0f} s; less where it read sweeps back). The cost of a round "
        "counted with `cost=True` on the preset's links.",
        "",
        markdown_table(rows, "last", bold=False),
        "",
        f"### Minus Local, paired by seed ({holm} comparison{'s' * (holm != 1)} per target, "
        "Holm-corrected; "
        "[95% interval over seeds and the target's test set], bold where separated)",
        "",
        paired_table(pairs, "method - Local"),
        "",
        "### Cost of a round (mean over the cases, rounds and seeds; totals over the group)",
        "",
        cost_table(rows),
        "",
        f"Grids: {grids}.",
        "",
    ]


def write_field(out: Path, result: Mapping[str, Any], title: str) -> dict[str, Any]:
    """`field.csv`/`field.json` (the chosen rows), `field_pairs.json` (minus Local, with
    the cost per row) and `FIELD.md`; returns the paths (`files`)."""
    rows, fp = result["rows"], result["preset"]
    paths = write_table(rows, out, "field")
    doc = {"schema": "pfedwn-field/1", "window": fp.window,
           "unit": "points of % target test accuracy (method - Local, per seed)",
           "wall_s": result["wall_s"], "command_s": result["command_s"],
           "grids": {m: {k: list(v) for k, v in g.items()} for m, g in fp.grids.items()},
           "cost_units": COST_COLUMNS,
           "cost": [{k: r[k] for k in ("dataset", "case", "method", "family", "cost")}
                    for r in rows],
           "pairs": list(result["pairs"])}  # fmt: skip
    pairs = atomic_write_json(out / "field_pairs.json", finite(doc))
    md = atomic_write_text(out / "FIELD.md", "\n".join([f"# {title}", "", *field_markdown(result)]))
    return {"files": [paths["csv"], paths["json"], pairs, md], "md": md}
