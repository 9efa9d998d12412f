"""The results blocks of README.md and docs/REPRODUCTION.md, rendered from committed files.

Each block is Markdown computed from the files under ``docs/results/`` alone, and the docs
hold it verbatim, so every number there is traceable (tests/test_readme_numbers.py renders
each block again and finds it in the docs). ``python -m pfedwn_jax.reproduce.readme``
prints them.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pfedwn_jax.reproduce.fading import FADINGS
from pfedwn_jax.reproduce.fading import METHODS as FADING_METHODS
from pfedwn_jax.reproduce.paper_numbers import PAPER_MAX
from pfedwn_jax.reproduce.tables import markdown_table

#: The committed results, relative to the repository root.
RESULTS = Path("docs/results")
FULL = RESULTS / "mnist-full"
LOSSY = RESULTS / "lossy"


def _table2_rows(root: Path) -> list[dict[str, Any]]:
    with open(root / FULL / "table2.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k, v in list(r.items()):
            if k.endswith(("_mean", "_low", "_high")):
                r[k] = float(v)
    return rows


def table2_block(root: Path) -> str:
    """Table II (max over rounds, paper / ours, mean ± 95% half-width over seeds; no bold)
    and every method minus Local with the test set in the interval and Holm's correction."""
    rows = _table2_rows(root)
    pairs = json.loads((root / FULL / "paired_to_local_boot.json").read_text())["pairs"]
    lines = [markdown_table(rows, "max", PAPER_MAX, bold=False), "", pairs_table(pairs)]
    return "\n".join(lines)


def pairs_table(pairs: Sequence[Mapping[str, Any]]) -> str:
    """Method minus Local per case: mean difference of the last-5-round accuracy (points),
    its 95% interval over seeds and the test set, Holm-adjusted p (within each target);
    bold where separated after Holm."""
    cols = list(dict.fromkeys(r["case"] for r in pairs))
    at = {(r["variant"], r["case"]): r for r in pairs}
    head = "| method - Local | " + " | ".join(f"{c} (n_test {_n(pairs, c)})" for c in cols)
    lines = [head + " |", "|---" * (len(cols) + 1) + "|"]
    for m in dict.fromkeys(r["variant"] for r in pairs):
        cells = []
        for c in cols:
            r = at[(m, c)]
            text = (f"{r['diff_mean']:+.2f} [{r['boot_low']:+.2f}, {r['boot_high']:+.2f}] "
                    f"p_Holm {r['p_holm']:.2g}")  # fmt: skip
            cells.append(f"**{text}**" if r["separated"] else text)
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _n(pairs: Sequence[Mapping[str, Any]], case: str) -> int:
    return int(next(r["n_test"] for r in pairs if r["case"] == case))


def crossover_block(root: Path) -> str:
    """The crossover's counts after Holm (``crossover_holm.md``'s summary lines)."""
    pairs = json.loads((root / FULL / "crossover_holm.json").read_text())["pairs"]
    fam = sorted({r["holm_family"] for r in pairs})
    ahead = [r for r in pairs if r["separated"] and r["diff_mean"] > 0]
    behind = [r for r in pairs if r["separated"] and r["diff_mean"] < 0]
    seeds_only = sum(
        1 for r in pairs if r["diff_half_width"] and abs(r["diff_mean"]) > r["diff_half_width"]
    )
    return (
        f"{len(pairs)} comparisons with Local (3 seeds each) over "
        f"{len({r['case'] for r in pairs})} targets, {fam[0]} per target. The seeds' "
        f"Student-t interval alone excludes 0 in {seeds_only}; with the target's test set in "
        f"the interval and Holm's correction within each target, {len(behind)} are behind "
        f"Local and {len(ahead)} ahead."
    )


def lossy_block(root: Path) -> str:
    """The lossy-link study: per variant, seeds whose similar neighbor ends below 0.05,
    its mean final weight and the target's mean accuracy."""
    doc = json.loads((root / LOSSY / "lossy_pi.json").read_text())
    lines = [
        f"| pi kept by (Bernoulli {doc['failure']}, {len(doc['seeds'])} seeds, "
        f"{doc['rounds']} rounds) | similar neighbor ends with pi < 0.05 | its mean final pi "
        "| target accuracy (%) |",
        "|---|---|---|---|",
    ]
    for name, v in doc["variants"].items():
        below = sum(p < 0.05 for p in v["final_pi"])
        lines.append(
            f"| {name} | {below} of {len(v['final_pi'])} | {np.mean(v['final_pi']):.2f} | "
            f"{100 * np.mean(v['accuracy']):.1f} |"
        )
    return "\n".join(lines)


def small_block(root: Path) -> str:
    """The small-neighbor study: the tiny neighbor's final weight and the accuracy."""
    doc = json.loads((root / LOSSY / "small_neighbor.json").read_text())
    lines = [
        f"| {len(doc['seeds'])} seeds, {doc['rounds']} rounds | 15-sample neighbor's final pi "
        "| target accuracy (%) |",
        "|---|---|---|",
    ]
    for name, v in doc["variants"].items():
        pis = ", ".join(f"{p:.2f}" for p in v["tiny_final_pi"])
        lines.append(f"| {name} | {pis} | {100 * np.mean(v['accuracy']):.1f} |")
    return "\n".join(lines)


#: The robustness table's settings: (axis, value, selection, label).
ROBUSTNESS_POINTS = (
    ("gamma", 5.0, True, "physical, gamma_th 5, eps 0.05"),
    ("gamma", 5.0, False, "same, no selection"),
    ("loss", 0.0, True, "bernoulli, loss 0"),
    ("loss", 0.6, True, "bernoulli, loss 0.6"),
    ("loss", 0.9, True, "bernoulli, loss 0.9"),
    ("speed", 5.0, True, "physical, speed 5 m/s"),
    ("speed", 5.0, False, "same, no selection"),
)


def robustness_block(root: Path) -> str:
    """pFedWN with the current default on the robustness study's `small` preset: mean
    [95% interval, clipped to 0-100] of the last-5-round target accuracy over 3 seeds."""
    with open(root / RESULTS / "robustness-pfedwn" / "summary.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["stat"] == "last"]
    at = {(r["axis"], float(r["value"]), r["selection"] == "True"): r for r in rows}
    lines = ['| setting | pFedWN, `refresh="arrival"` |', "|---|---|"]
    for axis, value, sel, label in ROBUSTNESS_POINTS:
        r = at[(axis, value, sel)]
        lo, hi = (100 * min(max(float(r[k]), 0.0), 1.0) for k in ("ci_low", "ci_high"))
        lines.append(f"| {label} | {100 * float(r['mean']):.1f} [{lo:.1f}, {hi:.1f}] |")
    return "\n".join(lines)


def _diff(t: Mapping[str, Any]) -> str:
    """A paired difference in points with its interval and Holm's p; bold where separated."""
    text = (f"{100 * t['diff']:+.2f} [{100 * t['low']:+.2f}, {100 * t['high']:+.2f}] "
            f"p_Holm {t['p_holm']:.2g}")  # fmt: skip
    return f"**{text}**" if t["separated"] else text


def decentralized_block(root: Path) -> str:
    """The decentralized study: per cell each method's accuracy (consensus distance), and
    each method minus Local paired by seed."""
    doc = json.loads((root / RESULTS / "decentralized" / "summary.json").read_text())
    methods = list(doc["cells"][0]["accuracy"])
    rivals = [m for m in methods if m != "local"]
    head = "| nodes | link failure | seeds | " + " | ".join(methods) + " |"
    lines = [head, "|---" * (3 + len(methods)) + "|"]
    for c in doc["cells"]:
        cells = [f"{100 * c['accuracy'][m]:.1f} ({c['consensus'][m]:.3g})" for m in methods]
        lines.append(f"| {c['nodes']:,} | {c['failure']:g} | {len(c['seeds'])} | " +
                     " | ".join(cells) + " |")  # fmt: skip
    lines += ["", "| nodes | link failure | " + " | ".join(f"{m} - local" for m in rivals) + " |"]
    lines.append("|---" * (2 + len(rivals)) + "|")
    for c in doc["cells"]:
        cells = [_diff(c["vs_local"][m]) if m in c["vs_local"] else "–" for m in rivals]
        lines.append(f"| {c['nodes']:,} | {c['failure']:g} | " + " | ".join(cells) + " |")
    wall = sum(c["wall_s"] for c in doc["cells"])
    lines += ["", f"{doc['comparisons']} comparisons, Holm-adjusted together; the runs took "
              f"{wall / 60:.0f} min on this CPU (`{doc['command']}`)."]  # fmt: skip
    return "\n".join(lines)


def comm_block(root: Path) -> str:
    """The communication-efficiency study: means per case, variant and method, and the
    selection against every neighbor paired by seed (accuracy; time and energy ratios)."""
    doc = json.loads((root / RESULTS / "comm-efficiency" / "summary.json").read_text())
    lines = ["| case | variant | method | accuracy % | clock s | energy J | s to 90% | J to 90% |",
             "|---|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in doc["means"]:
        lines.append(f"| {r['case']} | {r['variant']} | {r['method']} | "
                     f"{100 * r['accuracy']:.1f} | {r['clock_s']:.3g} | {r['energy_j']:.3g} | "
                     f"{r['time_to_90']:.3g} | {r['energy_to_90']:.3g} |")  # fmt: skip
    lines += ["", "| case | method | selection - every neighbor | accuracy | time ratio | "
              "energy ratio |", "|---|---|---|---|---:|---:|"]  # fmt: skip
    for t in doc["tests"]:
        if t["kind"] == "selection":
            ratio = {k: float(np.mean(t[k])) for k in ("clock_s", "energy_j")}
            lines.append(f"| {t['case']} | {t['method']} | {t['a']} | {_diff(t)} | "
                         f"{ratio['clock_s']:.2f} | {ratio['energy_j']:.2f} |")  # fmt: skip
    lines += ["", f"{doc['comparisons']} comparisons (these and every method against Local), "
              f"Holm-adjusted together; the sweep took {doc['sweep_wall_s'] / 60:.0f} min on "
              f"this CPU (`{doc['command']}`).", "", *_arrival_lines(doc["arrivals"])]  # fmt: skip
    return "\n".join(lines)


def _arrival_lines(arrivals: Sequence[Mapping[str, Any]]) -> list[str]:
    """Under the deadline, the target's neighbors whose model arrived in most rounds and
    the rest, each as its training samples and the share of the target's classes it holds
    (with the share of rounds where that is not all or none)."""
    lines = ["| case | variant | arrived by the deadline: samples (target's classes held) | cut |",
             "|---|---|---|---|"]  # fmt: skip
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for a in arrivals:
        groups.setdefault((a["case"], a["variant"]), []).append(a)

    def show(a: Mapping[str, Any]) -> str:
        share = a["arrived"] if a["arrived"] >= 0.5 else 1 - a["arrived"]
        often = "" if share == 1 else f" in {share:.0%} of rounds"
        return f"{a['samples']:,} ({a['target_classes_held']:.0%}){often}"

    for (case, variant), rows in groups.items():
        got = ", ".join(show(a) for a in rows if a["arrived"] >= 0.5) or "none"
        cut = ", ".join(show(a) for a in rows if a["arrived"] < 0.5) or "none"
        lines.append(f"| {case} | {variant} | {got} | {cut} |")
    return lines


def fading_block(root: Path) -> str:
    """The fading study: per case and fading model the target's selected neighbors, the
    share of its listed links that delivered (the same draws for every method), each
    method's accuracy, and the paired differences against Rayleigh and between pFedWN and
    each baseline."""
    doc = json.loads((root / RESULTS / "fading" / "summary.json").read_text())
    methods = list(FADING_METHODS)
    cells = {(r["case"], r["fading"], r["method"]): r for r in doc["means"]}
    pairs = sorted({(r["case"], r["fading"]) for r in doc["means"]},
                   key=lambda cf: (cf[0], list(FADINGS).index(cf[1])))  # fmt: skip
    lines = ["| case | fading | selected | delivered | " + " | ".join(methods) + " |",
             "|---|---|---:|---:|" + "---:|" * len(methods)]  # fmt: skip
    for case, fading in pairs:
        row = [cells[(case, fading, m)] for m in methods]
        shown = [f"{100 * r['accuracy']:.1f}" for r in row]
        lines.append(f"| {case} | {fading} | {row[0]['selected']} | {row[0]['delivered']:.2f} | "
                     + " | ".join(shown) + " |")  # fmt: skip
    tests = {(t["kind"], t["case"], t["fading"], t["method"]): t for t in doc["tests"]}
    keys = [("vs Rayleigh", m) for m in methods] + [("pfedwn vs", m) for m in methods[1:]]
    heads = [f"{m} - Rayleigh" for m in methods] + [f"pfedwn - {m}" for m in methods[1:]]
    lines += [
        "",
        "| case | fading | " + " | ".join(heads) + " |",
        "|---|---|" + "---|" * len(heads),
    ]
    for case, fading in pairs:
        shown = [_diff(tests[(k, case, fading, m)]) if (k, case, fading, m) in tests else "–"
                 for k, m in keys]  # fmt: skip
        lines.append(f"| {case} | {fading} | " + " | ".join(shown) + " |")
    lines += ["", f"{doc['comparisons']} comparisons, Holm-adjusted together; the sweep took "
              f"{doc['sweep_wall_s'] / 60:.0f} min on this CPU (`{doc['command']}`)."]  # fmt: skip
    return "\n".join(lines)


BLOCKS = {
    "fading": fading_block,
    "decentralized": decentralized_block,
    "comm": comm_block,
    "robustness": robustness_block,
    "table2": table2_block,
    "crossover": crossover_block,
    "lossy": lossy_block,
    "small": small_block,
}


def main() -> None:
    root = Path(__file__).resolve().parents[2]
    for name, block in BLOCKS.items():
        print(f"<!-- {name} -->\n{block(root)}\n")


if __name__ == "__main__":
    main()
