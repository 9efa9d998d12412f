"""Committed `mnist-full` results re-read with test-set sampling and multiplicity control.

``python -m pfedwn_jax.reproduce.reanalysis DIR`` reads ``DIR/table2.csv`` with
``DIR/paired_to_local.json`` (every method minus Local, per seed) and ``DIR/crossover.json``
(the crossover's comparisons with Local, per seed), adds to every comparison the paired
bootstrap over seeds and the target's test set (``results.paired``) and Holm's correction
within each target (every comparison of one target, over methods and caps, is one family),
and writes ``DIR/paired_to_local_boot.json``, ``DIR/crossover_holm.json`` and
``DIR/crossover_holm.md``. The test-set sizes come from the partition itself (each row's
config, rebuilt on the host).
"""

from __future__ import annotations

import csv
import functools
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.setup import load_data
from pfedwn_jax.reproduce.tables import add_bootstrap


@functools.cache
def _test_counts(config_json: str) -> np.ndarray:

    data, _ = load_data(ExperimentConfig.from_dict(json.loads(config_json)))
    return np.asarray(data.test.count)


def test_count(config: Mapping[str, Any], **changes: Any) -> int:
    """Test samples of ``config``'s target (``changes``: fields replaced first)."""
    config = {**config, **changes}
    keep = {k: v for k, v in config.items() if k not in ("target", "seed", "topology_seed")}
    return int(_test_counts(json.dumps(keep, sort_keys=True))[int(config["target"])])


def table2_configs(folder: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """``{(dataset, case): config}`` of the Local rows of ``table2.csv``."""
    with open(folder / "table2.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["method"] == "local"]
    return {(r["dataset"], r["case"]): json.loads(r["config"]) for r in rows}


def reanalyse_table2(folder: Path) -> list[dict[str, Any]]:
    configs = table2_configs(folder)
    pairs = json.loads((folder / "paired_to_local.json").read_text())["pairs"]
    counts = {key: test_count(c) for key, c in configs.items()}
    return add_bootstrap(pairs, counts)


def reanalyse_crossover(folder: Path) -> list[dict[str, Any]]:
    base = next(iter(table2_configs(folder).values()))
    rows = json.loads((folder / "crossover.json").read_text())["rows"]
    local = {(r["case"], r["cap"]): r["mean"] for r in rows if r["method"] == "local"}
    pairs = [
        {**r, "base_mean": local[(r["case"], r["cap"])]} for r in rows if r["method"] != "local"
    ]

    def n_test(r: Mapping[str, Any]) -> int:
        return test_count(base, target=r["target"], max_samples_per_client=r["cap"] or None)

    return add_bootstrap(pairs, n_test, family=lambda r: r["case"])


def crossover_markdown(pairs: Sequence[Mapping[str, Any]]) -> str:
    """The crossover's comparisons that stay separated after Holm, and the counts."""
    fams = dict.fromkeys(r["case"] for r in pairs)
    lines = [
        f"{len(pairs)} comparisons with Local (3 seeds each), {len(fams)} targets; Holm's "
        f"correction within each target ({sorted({r['holm_family'] for r in pairs})} "
        "comparisons per target: caps x methods); intervals: Student-t over seeds plus the "
        "binomial variance of the target's test set (Welch-Satterthwaite df; "
        "`results/paired.py`).",
        "",
        f"- the seeds' 95% Student-t interval alone excludes 0: "
        f"{sum(_t_separated(r) for r in pairs)}",
        f"- p < 0.05 with the test set, before correction: {sum(r['p'] < 0.05 for r in pairs)}",
        f"- separated after Holm (p_holm <= 0.05): {sum(r['separated'] for r in pairs)}, of "
        f"which ahead of Local: {sum(r['separated'] and r['diff_mean'] > 0 for r in pairs)}"
        + "".join(
            f"; {r['case']} cap {r['cap']} {r['method']} {r['diff_mean']:+.2f}"
            for r in pairs
            if r["separated"] and r["diff_mean"] > 0
        ),
        "",
        "| target | cap | method | diff (points) | 95% interval | p | p_holm |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(pairs, key=lambda r: r["p"])[:12]:
        lines.append(
            f"| {r['case']} | {r['cap']} | {r['method']} | {r['diff_mean']:+.2f} | "
            f"[{r['boot_low']:+.2f}, {r['boot_high']:+.2f}] | {r['p']:.4f} | "
            f"{r['p_holm']:.3f} |"
        )
    lines.append("")
    lines.append("(the 12 smallest p-values; every comparison in `crossover_holm.json`)")
    return "\n".join(lines) + "\n"


def _t_separated(r: Mapping[str, Any]) -> bool:
    h = r.get("diff_half_width")
    return h is not None and np.isfinite(h) and h > 0 and abs(r["diff_mean"]) > h


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    folder = Path(args[0] if args else "docs/results/mnist-full")
    command = "python -m pfedwn_jax.reproduce.reanalysis " + str(folder)
    t2 = reanalyse_table2(folder)
    doc = {"schema": "pfedwn-reanalysis/1", "command": command, "pairs": t2,
           "unit": "points of % target test accuracy (method - Local)"}  # fmt: skip
    (folder / "paired_to_local_boot.json").write_text(json.dumps(doc, indent=1) + "\n")
    cross = reanalyse_crossover(folder)
    doc = {"schema": "pfedwn-reanalysis/1", "command": command, "pairs": cross,
           "unit": "points of % target test accuracy (method - Local)"}  # fmt: skip
    (folder / "crossover_holm.json").write_text(json.dumps(doc, indent=1) + "\n")
    (folder / "crossover_holm.md").write_text(crossover_markdown(cross))
    for r in t2:
        print(r["case"], r["variant"], f"{r['diff_mean']:+.2f}",
              f"[{r['boot_low']:+.2f}, {r['boot_high']:+.2f}]", r["n_test"],
              f"p={r['p']:.4f} holm={r['p_holm']:.3f}", r["separated"])  # fmt: skip
    print(crossover_markdown(cross))


if __name__ == "__main__":
    main()
