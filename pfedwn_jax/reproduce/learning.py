"""The paper's learning results (Sec. V): Table II, Table III, Fig. 1, Fig. 8 and Fig. 9.

Every number comes from sweeps (`pfedwn_jax.sweeps.run_configs`): per dataset and method, one
call holds every case x grid point x seed, so the cases share one compiled program. Each
method's hyperparameters are chosen per case on a validation split carved from the clients'
training data (`val_fraction`; `summary(metric="target_val_accuracy")`, mean of the last
`window` rounds), never on the test split; the tables then show the test accuracy of the runs
at the chosen point: final, mean of the last `window` rounds and max over rounds, each as the
mean and 95% Student-t interval over the seeds (model initialisation and batch order; the
partition is fixed by `data_seed` so a case keeps its data, as in the paper's Fig. 7).

Presets (`PRESETS`): `tiny` (the test, seconds), `quick` (2 CPU cores, minutes, real data from
the shared data folder, MLPs) and `paper` (TFDS full datasets, the paper's models, 100 rounds;
for a GPU). Nothing downloads in `tiny` or `quick`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.reproduce.cases import PAPER_GAMMAS, PAPER_WANTED, network20_case, paper_cases
from pfedwn_jax.reproduce.paper_numbers import PAPER_MAX
from pfedwn_jax.sweeps.result import SweepResult

METHODS = ("local", "fedavg", "fedprox", "perfedavg", "fedamp", "pfedwn")
LEARNING_ITEMS = ("table2", "table3", "fig1", "fig8", "fig9")
WIRELESS_ITEMS = ("fig4", "fig5", "fig6", "fig7")
ALL_ITEMS = ("fig1", "fig4", "fig5", "fig6", "fig7", "fig8", "table2", "table3", "fig9")
STATS = ("final", "last", "max")
#: pFedWN's EM read both ways the paper allows: (em_every, mix_components), i.e. estimate
#: once and freeze or re-estimate every round, mixing the neighbors' received models or
#: M-step 2's fine-tuned components; the first is the default.
EM_VARIANTS = ((0, False), (1, False), (0, True), (1, True))
DATA_ENV = "PFEDWN_SHARED_DATA"


# ---------------------------------------------------------------------------- presets
class DataSpec(NamedTuple):
    """One dataset of a preset: table label, `ExperimentConfig.dataset`, model, sample cap."""

    label: str
    dataset: str | None
    model: str
    max_samples: int | None


@dataclasses.dataclass(frozen=True)
class Preset:
    """What one preset runs (see the module docstring).

    Attributes:
      datasets: the datasets, in table order; `fig1`/`fig8`/`fig9` name the label used.
      base: `ExperimentConfig` fields shared by every run (rounds, batch size, ...).
      seeds: the seeds of every grid point.
      grids: per method, the swept keys and values (chosen on the validation split).
      hparams: per method, fixed hyperparameters (e.g. FedAMP's `sigma_mode`).
      variants: datasets whose pFedWN EM variants run as extra Table II rows.
      window: rounds of the "last" statistic (and of the validation score).
      methods: the methods run (default all six).
    """

    name: str
    datasets: tuple[DataSpec, ...]
    base: Mapping[str, Any]
    seeds: tuple[int, ...]
    grids: Mapping[str, Mapping[str, tuple[Any, ...]]]
    hparams: Mapping[str, Mapping[str, Any]]
    fig1: str
    fig8: str
    fig9: str
    variants: tuple[str, ...] = ()
    window: int = 5
    methods: tuple[str, ...] = METHODS
    description: str = ""


def shared_data_dir() -> Path:
    """The shared real-data folder: `$PFEDWN_SHARED_DATA` or `$PFEDWN_DATA_DIR` (the data
    modules' variable), else `../shared/data` next to the repository (or its worktree folder)."""
    for name in (DATA_ENV, "PFEDWN_DATA_DIR"):
        if os.environ.get(name):
            return Path(os.environ[name])
    repo = Path(__file__).resolve().parents[2]
    for cand in (repo.parent / "shared" / "data", repo.parents[1] / "shared" / "data"):
        if cand.is_dir():
            return cand
    return repo.parent / "shared" / "data"


def _npz(name: str) -> str:
    return f"npz:{shared_data_dir() / name}"


QUICK_GRID = {
    "local": {"lr": (0.02, 0.1)},
    "fedavg": {"lr": (0.02, 0.1)},
    "fedprox": {"lr": (0.02, 0.1), "fedprox.mu": (0.01, 0.1)},
    "perfedavg": {"lr": (0.02, 0.1), "perfedavg.alpha": (0.005, 0.02)},
    "fedamp": {"lr": (0.02, 0.1), "fedamp.sigma_scale": (0.5, 2.0)},
    "pfedwn": {"lr": (0.02, 0.1), "pfedwn.a": (0.3, 0.6, 0.9)},
}
_FIXED = {"fedamp": {"sigma_mode": "auto"}, "perfedavg": {"variant": "fo"}}


def _tiny() -> Preset:
    return Preset(
        name="tiny",
        datasets=(DataSpec("MNIST", None, "logreg", 40),),
        base={"rounds": 2, "batch_size": 16, "val_fraction": 0.2, "data_seed": 0},
        seeds=(0, 1),
        grids={m: {"lr": (0.05, 0.1)} for m in METHODS},
        hparams=_FIXED,
        fig1="MNIST",
        fig8="MNIST",
        fig9="MNIST",
        variants=("MNIST",),
        window=2,
        description="embedded MNIST subset, logistic regression, 2 rounds, 2 seeds (a test)",
    )


def _quick() -> Preset:
    return Preset(
        name="quick",
        datasets=(
            DataSpec("MNIST", _npz("mnist_10k_2k.npz"), "mlp", 300),
            DataSpec("CIFAR-10", _npz("cifar10_exact_subset.npz"), "mlp", 150),
            DataSpec("CIFAR-100", _npz("cifar100_exact_subset.npz"), "mlp", 150),
        ),
        base={"rounds": 10, "batch_size": 32, "val_fraction": 0.2, "data_seed": 0},
        seeds=(0, 1, 2, 3, 4),
        grids=QUICK_GRID,
        hparams=_FIXED,
        fig1="CIFAR-10",
        fig8="CIFAR-10",
        fig9="CIFAR-100",
        variants=("MNIST",),
        description=(
            "shared real-data subsets (MNIST 12k, CIFAR-10 6.2k, CIFAR-100 2.0k images), "
            "at most 300 (MNIST) / 150 (CIFAR) samples per client, the MLP for every dataset "
            "(the CNN costs ~2 s per run-round on this CPU), 10 rounds of 1 local epoch, "
            "5 seeds, a 2-6 point grid per method"
        ),
    )


_PAPER_LR = (0.005, 0.01, 0.05)
PAPER_GRID = {
    "local": {"lr": _PAPER_LR},
    "fedavg": {"lr": _PAPER_LR},
    "fedprox": {"lr": _PAPER_LR, "fedprox.mu": (0.001, 0.01, 0.1)},
    "perfedavg": {"lr": _PAPER_LR, "perfedavg.alpha": (0.001, 0.01)},
    "fedamp": {"lr": _PAPER_LR, "fedamp.sigma_scale": (0.5, 1.0, 2.0)},
    "pfedwn": {"lr": _PAPER_LR, "pfedwn.a": (0.1, 0.3, 0.5, 0.7, 0.9)},
}


def _paper() -> Preset:
    return Preset(
        name="paper",
        datasets=(
            DataSpec("MNIST", "mnist", "cnn", None),
            DataSpec("CIFAR-10", "cifar10", "resnet18", None),
            DataSpec("CIFAR-100", "cifar100", "resnet18", None),
        ),
        base={"rounds": 100, "batch_size": 32, "val_fraction": 0.2, "data_seed": 0},
        seeds=(0, 1, 2, 3, 4),
        grids=PAPER_GRID,
        hparams=_FIXED,
        fig1="CIFAR-10",
        fig8="CIFAR-10",
        fig9="CIFAR-100",
        variants=("MNIST", "CIFAR-10", "CIFAR-100"),
        description="TFDS full datasets, CNN (MNIST) / ResNet18 (CIFAR), 100 rounds, 5 seeds",
    )


PRESETS = {p.name: p for p in (_tiny(), _quick(), _paper())}


def get_preset(name: str | Preset) -> Preset:
    """A preset by name (ValueError naming the allowed ones)."""
    if isinstance(name, Preset):
        return name
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}; got {name!r}")
    return PRESETS[name]


# ---------------------------------------------------------------------------- sweeps
class Setting(NamedTuple):
    """A named network setting of one table column: "Case 1", "20 neighbors", ..."""

    name: str
    config: ExperimentConfig
    extra: tuple[tuple[str, Any], ...] = ()


def dataset_base(preset: Preset, spec: DataSpec, method: str) -> ExperimentConfig:
    """The config every run of `method` on `spec` starts from (before case, grid and seed)."""
    hp = {method: dict(preset.hparams[method])} if method in preset.hparams else {}
    return ExperimentConfig(
        dataset=spec.dataset,
        model=spec.model,
        max_samples_per_client=spec.max_samples,
        algorithms=(method,),
        hparams=hp,
        **dict(preset.base),
    )


def settings(base: ExperimentConfig, want: Sequence[str]) -> list[Setting]:
    """The settings named in `want` among "cases" (Cases 1-3, 10 neighbors, gamma_th
    5/10/15 with 4/3/2 selected), "n20" (20 neighbors, gamma_th 10, 3 selected) and "all"
    (Case 1's network with every neighbor in training, no selection: Fig. 1's FL)."""
    out = []
    ten = paper_cases(base, 10, PAPER_WANTED, PAPER_GAMMAS)
    if "cases" in want:
        out += [Setting(c.name, c.config(base)) for c in ten]
    if "n20" in want:
        out.append(Setting("20 neighbors", network20_case(base).config(base)))
    if "all" in want:
        out.append(Setting("all clients", ten[0].config(base).replace(selection=False)))
    return out


def _points(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """The grid's points: the product of its lists, first key outermost."""
    points: list[dict[str, Any]] = [{}]
    for key, values in grid.items():
        points = [{**p, key: v} for p in points for v in values]
    return points


def run_settings(
    setting_list: Sequence[Setting],
    grid: Mapping[str, Sequence[Any]],
    seeds: Sequence[int],
    cache: Path | None = None,
) -> tuple[SweepResult, list[dict[str, Any]]]:
    """Every setting x grid point x seed as one `run_configs` call; the `SweepResult` (swept:
    "case", the grid keys and the settings' `extra` labels) and every run's label and full
    config (for the CSV/JSON). With `cache`, a sweep already saved there with the same runs is
    read back instead of run, and a new one is saved there."""
    from pfedwn_jax.runner.api import run_configs
    from pfedwn_jax.sweeps.grid import RunSpec, run_config

    configs, labels = [], []
    for st in setting_list:
        for point in _points(grid):
            for seed in seeds:
                configs.append(run_config(st.config, RunSpec(len(configs), seed, point)))
                labels.append({"seed": int(seed), "case": st.name, **point, **dict(st.extra)})
    swept = ("case", *grid, *dict(setting_list[0].extra))
    runs = [{**lab, "config": c.to_dict()} for lab, c in zip(labels, configs, strict=True)]
    if cache is not None and (done := _cached(cache, runs)) is not None:
        return done, runs
    t0 = time.perf_counter()
    columns, meta, kept = run_configs(configs, labels, progress=False)
    meta["wall_s"] = time.perf_counter() - t0
    res = SweepResult(columns, swept, meta, kept)
    if cache is not None:
        save_sweep(cache, res, runs)
    return res, runs


def _cached(folder: Path, runs: Sequence[Mapping[str, Any]]) -> SweepResult | None:
    """The sweep saved in `folder` if it holds exactly these runs (same labels and configs),
    so an interrupted reproduction continues where it stopped; else None."""
    if not (folder / "runs.json").is_file() or not (folder / "sweep.json").is_file():
        return None
    saved = json.loads((folder / "runs.json").read_text())
    if saved != json.loads(json.dumps(list(runs), default=str)):
        return None
    return SweepResult.from_json(folder / "sweep.json")


# ---------------------------------------------------------------------------- choosing
def _best(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The entry of highest validation `last_mean` (NaN ranks lowest; ties: first)."""
    scores = [e["last_mean"] if np.isfinite(e["last_mean"]) else -np.inf for e in entries]
    return entries[int(np.argmax(scores))]


def choose(
    res: SweepResult, grid_keys: Sequence[str], window: int, label: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Per case and method (and extra label): the grid point of best validation accuracy
    (mean of the last `window` rounds of `target_val_accuracy`) and the test statistics of
    its runs. Each row: `label`, case, method, `chosen` values, seeds, val score, and for S in
    final/last/max `S_mean`, `S_ci_low`, `S_ci_high` (test accuracy in %)."""
    val = res.summary(window, metric="target_val_accuracy")
    test = {_key(e, res.swept): e for e in res.summary(window)}
    other = [k for k in res.swept if k not in grid_keys]
    rows = []
    for group in dict.fromkeys(tuple(e[k] for k in (*other, "method")) for e in val):
        cands = [e for e in val if tuple(e[k] for k in (*other, "method")) == group]
        best = _best(cands)
        t = test[_key(best, res.swept)]
        chosen = {k: best[k] for k in grid_keys}
        picked = res.select({**{k: [best[k]] for k in res.swept}, "method": [best["method"]]})
        row = {**label, **{k: best[k] for k in other}, "method": best["method"]}
        row.update(chosen=chosen, seeds=sorted(set(picked.rows["seed"].tolist())), n=t["n"])
        row.update(n_diverged=t["n_diverged"], val_last_mean=100 * best["last_mean"])
        for s in STATS:
            for part in ("mean", "ci_low", "ci_high"):
                row[f"{s}_{part}"] = 100 * t[f"{s}_{part}"]
        rows.append(row)
    return rows


def _key(entry: Mapping[str, Any], swept: Sequence[str]) -> tuple:
    return (*(entry[k] for k in swept), entry["method"])


def pick(res: SweepResult, row: Mapping[str, Any]) -> SweepResult:
    """The runs of a table row (its case, extra labels and chosen grid point)."""
    cond = {k: [row[k]] for k in res.swept if k in row}
    cond.update({k: [v] for k, v in row["chosen"].items()})
    return res.select({**cond, "method": [row["method"]]})


def chosen_config(runs: Sequence[Mapping[str, Any]], row: Mapping[str, Any]) -> dict:
    """The full config of the row's first-seed run (every run's config is in runs.json)."""
    labels = {**row, **row["chosen"]}
    for r in runs:
        if r["seed"] == row["seeds"][0] and all(
            labels.get(k) == v for k, v in r.items() if k not in ("seed", "config")
        ):
            return r["config"]
    raise ValueError(f"no run matches table row {row['case']!r} / {row['method']!r}")


# ---------------------------------------------------------------------------- running
SPECIAL = ("20 neighbors", "all clients")


def plan(preset: Preset, items: Sequence[str]) -> dict[str, dict[str, list[str]]]:
    """Per dataset label and method, the settings the requested `items` need."""
    out: dict[str, dict[str, list[str]]] = {}
    for spec in preset.datasets:
        fig9 = "fig9" in items and spec.label == preset.fig9
        want: dict[str, list[str]] = {}
        for m in preset.methods:
            w = []
            fig8 = "fig8" in items and spec.label == preset.fig8 and m == "pfedwn"
            if "table2" in items or fig9 or fig8:
                w.append("cases")
            if "table3" in items or fig9:
                w.append("n20")
            if "fig1" in items and spec.label == preset.fig1 and m == "fedavg":
                w.append("all")
            if w:
                want[m] = w
        if want:
            out[spec.label] = want
    return out


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")


def save_sweep(folder: Path, res: SweepResult, runs: Sequence[Mapping[str, Any]]) -> None:
    """rows.csv (every round of every run, with seed and labels), sweep.json, runs.json."""
    from pfedwn_jax.io import atomic_write_text

    folder.mkdir(parents=True, exist_ok=True)
    res.to_csv(folder / "rows.csv")
    res.to_json(folder / "sweep.json")
    atomic_write_text(folder / "runs.json", json.dumps(list(runs), indent=1, default=str))


def variant_name(em_every: int, mix_components: bool) -> str:
    return f"em_every={em_every}, mix {'components' if mix_components else 'received'}"


def run_variants(
    preset: Preset, spec: DataSpec, out: Path
) -> tuple[list[dict[str, Any]], tuple[SweepResult, list[dict]]]:
    """pFedWN's non-default EM variants as extra Table II rows, each tuned on its own over
    pFedWN's grid on the validation split, like every method (a variant evaluated at the
    default's chosen point would favour the default)."""
    grid = preset.grids["pfedwn"]
    sts = []
    for every, mix in EM_VARIANTS[1:]:
        base = dataset_base(preset, spec, "pfedwn")
        hp = {**base.hparams.get("pfedwn", {}), "em_every": every, "mix_components": mix}
        base = base.replace(hparams={**base.hparams, "pfedwn": hp})
        extra = (("variant", variant_name(every, mix)),)
        sts += [st._replace(extra=extra) for st in settings(base, ("cases",))]
    folder = out / "sweeps" / f"{_slug(spec.label)}_pfedwn_variants"
    res, vruns = run_settings(sts, grid, preset.seeds, cache=folder)
    label = {"dataset": spec.label, "sweep_wall_s": res.meta["wall_s"]}
    rows = choose(res, list(grid), preset.window, label)
    for r in rows:
        r["config"] = chosen_config(vruns, r)
        r["method"] = f"pfedwn ({r['variant']})"
    return rows, (res, vruns)


def _seed_scores(res: SweepResult, cond: Mapping[str, Any], window: int) -> dict[int, float]:
    """Per seed, the mean target test accuracy (%) of the last `window` rounds of the runs
    matching `cond` (one run per seed)."""
    rows = res.select({k: [v] for k, v in cond.items()}).rows
    last = rows["round"] > rows["round"].max() - window
    seeds = np.unique(rows["seed"])
    return {int(s): 100 * float(rows["target_accuracy"][last & (rows["seed"] == s)].mean())
            for s in seeds}  # fmt: skip


def paired_variants(rows, sweeps, window: int) -> list[dict[str, Any]]:
    """Each EM variant row against the default pFedWN row of its dataset and case: the mean
    and 95% Student-t half-width over seeds of the per-seed difference of the last-`window`
    test accuracy (%), each at its own chosen point. Same seeds, so the pairing removes the
    seed-to-seed spread that the tables' intervals carry."""
    from pfedwn_jax.sweeps.result import student_t_ppf

    out = []
    for v in (r for r in rows if "variant" in r):
        d, c = v["dataset"], v["case"]
        ref = _row(rows, d, c, "pfedwn")
        mine = _seed_scores(sweeps[(d, "pfedwn variants")][0],
                            {"case": c, "variant": v["variant"], "method": "pfedwn",
                             **v["chosen"]}, window)  # fmt: skip
        base = _seed_scores(sweeps[(d, "pfedwn")][0],
                            {"case": c, "method": "pfedwn", **ref["chosen"]}, window)  # fmt: skip
        diff = np.asarray([mine[s] - base[s] for s in sorted(mine) if s in base])
        half = (student_t_ppf(0.975, diff.size - 1) * diff.std(ddof=1) / np.sqrt(diff.size)
                if diff.size > 1 else np.nan)  # fmt: skip
        out.append({"dataset": d, "case": c, "variant": v["variant"], "n": int(diff.size),
                    "diff_mean": float(diff.mean()), "diff_half_width": float(half),
                    "diffs": diff.round(4).tolist()})  # fmt: skip
    return out


def paired_table(pairs: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: variants x (case, dataset), cells `+d ± h` (points of accuracy)."""
    cols = list(dict.fromkeys((r["case"], r["dataset"]) for r in pairs))
    at = {(r["variant"], r["case"], r["dataset"]): r for r in pairs}
    lines = ["| variant - default | " + " | ".join(f"{c} {d}" for c, d in cols) + " |"]
    lines.append("|---" * (len(cols) + 1) + "|")
    for name in dict.fromkeys(r["variant"] for r in pairs):
        cells = [at.get((name, *c)) for c in cols]
        text = [("" if r is None else f"{r['diff_mean']:+.1f} ± {r['diff_half_width']:.1f}")
                for r in cells]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def run_tables(
    preset: Preset, items: Sequence[str], out: Path, log: Callable[[str], None] = print
) -> tuple[list[dict[str, Any]], dict[tuple[str, str], tuple[SweepResult, list[dict]]]]:
    """Every sweep the items need; the chosen rows of every (dataset, setting, method) and
    the sweeps by (dataset label, method)."""
    rows: list[dict[str, Any]] = []
    sweeps: dict[tuple[str, str], tuple[SweepResult, list[dict]]] = {}
    todo = plan(preset, items)
    for spec in preset.datasets:
        for m, want in todo.get(spec.label, {}).items():
            sts = settings(dataset_base(preset, spec, m), want)
            folder = out / "sweeps" / f"{_slug(spec.label)}_{m}"
            res, runs = run_settings(sts, preset.grids[m], preset.seeds, cache=folder)
            label = {"dataset": spec.label, "sweep_wall_s": res.meta["wall_s"]}
            new = choose(res, list(preset.grids[m]), preset.window, label)
            for r in new:
                r["config"] = chosen_config(runs, r)
            rows += new
            sweeps[(spec.label, m)] = (res, runs)
            log(f"{spec.label} {m}: {res.num_runs} runs in {res.meta['wall_s']:.0f} s")
        if "table2" in items and spec.label in preset.variants:
            new, sweeps[(spec.label, "pfedwn variants")] = run_variants(preset, spec, out)
            rows += new
            log(f"{spec.label} pFedWN EM variants done")
    return rows, sweeps


# ---------------------------------------------------------------------------- tables
TABLE_COLUMNS = (
    "dataset", "case", "method", "chosen", "seeds", "n", "n_diverged", "val_last_mean",
    *(f"{s}_{p}" for s in STATS for p in ("mean", "ci_low", "ci_high")),
    "sweep_wall_s", "config",
)  # fmt: skip


def write_table(rows: Sequence[Mapping[str, Any]], out: Path, name: str) -> dict[str, Path]:
    """`name.csv` (one line per row; chosen and config as JSON) and `name.json`."""
    import csv
    import io

    from pfedwn_jax.io import atomic_write_json, atomic_write_text

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(TABLE_COLUMNS)
    for r in rows:
        cells = {**r, "chosen": json.dumps(r["chosen"]), "config": json.dumps(r["config"])}
        cells["seeds"] = " ".join(str(s) for s in r["seeds"])
        w.writerow([cells.get(c, "") for c in TABLE_COLUMNS])
    csv_path = atomic_write_text(out / f"{name}.csv", buf.getvalue())
    doc = {"schema": "pfedwn-reproduce-table/1", "unit": "% target test accuracy",
           "rows": [{c: r.get(c) for c in TABLE_COLUMNS} for r in rows]}  # fmt: skip
    return {"csv": csv_path, "json": atomic_write_json(out / f"{name}.json", _finite(doc))}


def _finite(obj: Any) -> Any:
    """NaN/inf floats as None, recursively (strict JSON)."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def cell(row: Mapping[str, Any], stat: str) -> str:
    """`mean +- half-width` of the 95% interval, in % (the mean alone for one seed)."""
    m, hi = row[f"{stat}_mean"], row[f"{stat}_ci_high"]
    return f"{m:.1f}" if not np.isfinite(hi) else f"{m:.1f} ± {hi - m:.1f}"


def markdown_table(
    rows: Sequence[Mapping[str, Any]],
    stat: str,
    paper: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
) -> str:
    """Methods x (case, dataset) in the paper's layout; the best mean per column in bold.
    With `paper` (`paper_numbers.PAPER_MAX`) a cell reads `paper / ours` where the paper
    has the number."""
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
            bold = r is not None and r[f"{stat}_mean"] == best[c]
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


# ---------------------------------------------------------------------------- figures
def _row(rows: Sequence[Mapping], dataset: str, case: str, method: str) -> Mapping[str, Any]:
    for r in rows:
        if (r["dataset"], r["case"], r["method"]) == (dataset, case, method):
            return r
    raise ValueError(f"no result for {dataset} / {case} / {method}")


def _curve(res: SweepResult, row: Mapping[str, Any], metric: str) -> dict[str, np.ndarray]:
    (c,) = pick(res, row).curves(metric)
    return c


def _band(ax: Any, c: Mapping[str, np.ndarray], label: str) -> None:
    x = c["round"]
    ax.plot(x, 100 * c["mean"], lw=1.5, label=label)
    if np.isfinite(c["ci_low"]).any():
        low, high = (np.clip(100 * c[k], 0.0, 100.0) for k in ("ci_low", "ci_high"))
        ax.fill_between(x, low, high, alpha=0.2)  # an accuracy's interval, cut to [0, 100]


def _curves_csv(path: Path, named: Mapping[str, Mapping[str, np.ndarray]]) -> Path:
    from pfedwn_jax.io import atomic_write_text

    lines = ["curve,round,n,mean,ci_low,ci_high"]
    for name, c in named.items():
        for i in range(len(c["round"])):
            vals = (c["n"][i], c["mean"][i], c["ci_low"][i], c["ci_high"][i])
            lines.append(f"{name},{c['round'][i]}," + ",".join(f"{v:.6g}" for v in vals))
    return atomic_write_text(path, "\n".join(lines) + "\n")


def fig1(rows, sweeps, preset: Preset, out: Path) -> dict[str, Path]:
    """Fig. 1: FedAvg over all 11 clients (no selection): target client's test accuracy vs
    the global model's mean test accuracy over the clients, mean and 95% band over seeds."""
    from pfedwn_jax.plotting import pyplot, save_figure

    row = _row(rows, preset.fig1, "all clients", "fedavg")
    res = sweeps[(preset.fig1, "fedavg")][0]
    named = {
        "target client": _curve(res, row, "target_accuracy"),
        "global model (mean over clients)": _curve(res, row, "mean_client_accuracy"),
    }
    paths = {"csv": _curves_csv(out / "fig1.csv", named)}
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(5, 3.4), dpi=120)
        for name, c in named.items():
            _band(ax, c, name)
        ax.set(xlabel="communication round", ylabel="test accuracy (%)")
        ax.set_title(f"Fig. 1: FedAvg, {preset.fig1}, 11 clients", fontsize=9)
        ax.legend(fontsize=8)
        paths["png"] = save_figure(fig, out / "fig1_target_vs_global.png")
    return paths


def fig9(rows, sweeps, preset: Preset, out: Path) -> dict[str, Path]:
    """Fig. 9: every method's target test accuracy per round, 10-neighbor (Case 2, gamma_th
    10) vs 20-neighbor network, at the chosen hyperparameters, mean and 95% band."""
    from pfedwn_jax.plotting import pyplot, save_figure

    label = preset.fig9
    cases = [r["case"] for r in rows if r["dataset"] == label and r["case"] not in SPECIAL]
    ten = list(dict.fromkeys(cases))[1]  # Case 2: gamma_th = 10, as the 20-neighbor network
    panels = {ten: {}, "20 neighbors": {}}
    for (lab, m), (res, _) in sweeps.items():
        if lab == label and m in METHODS:
            for case in panels:
                panels[case][m] = _curve(res, _row(rows, label, case, m), "target_accuracy")
    flat = {f"{case}|{m}": c for case, p in panels.items() for m, c in p.items()}
    paths = {"csv": _curves_csv(out / "fig9.csv", flat)}
    plt = pyplot()
    if plt is not None:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), dpi=120, sharey=True)
        for ax, (case, p) in zip(axes, panels.items(), strict=True):
            for m, c in p.items():
                _band(ax, c, m)
            ax.set(xlabel="communication round", title=f"{label}: {case}")
        axes[0].set_ylabel("target test accuracy (%)")
        axes[1].legend(fontsize=7)
        paths["png"] = save_figure(fig, out / "fig9_10_vs_20_neighbors.png")
    return paths


def fig8(rows, preset: Preset, out: Path) -> dict[str, Path]:
    """Fig. 8: pFedWN's EM weights of the Case 1 target (fig8 dataset) at its chosen point,
    re-estimated every round (`em_every=1`) to show them settle; one run of the first seed."""
    from pfedwn_jax.experiment import run
    from pfedwn_jax.experiment.report import plot_pi_history
    from pfedwn_jax.experiment.results import to_jsonable
    from pfedwn_jax.io import atomic_write_json

    cases = [r for r in rows if r["dataset"] == preset.fig8 and r["method"] == "pfedwn"]
    row = next(r for r in cases if r["case"] not in SPECIAL)
    cfg = ExperimentConfig.from_dict(row["config"])
    hp = {**cfg.hparams.get("pfedwn", {}), "em_every": 1}
    cfg = cfg.replace(hparams={**cfg.hparams, "pfedwn": hp}, algorithms=("pfedwn",))
    result = run(cfg, progress=False)
    pi = result.records("pfedwn", "pi")  # [R, S, K]
    doc = {"config": cfg.to_dict(), "seed": cfg.seed, "case": row["case"],
           "network": result.network, "pi_target": pi[:, 0].tolist()}  # fmt: skip
    paths = {"json": atomic_write_json(out / "fig8_pi.json", _finite(to_jsonable(doc)))}
    png = plot_pi_history(result, out / "fig8_em_weights.png", max_targets=1)
    if png is not None:
        paths["png"] = Path(png)
    return paths


# ---------------------------------------------------------------------------- entry point
def parse_items(only: str | Sequence[str] | None) -> tuple[str, ...]:
    """`"table2,fig8"` (or a list; None or "all": everything) as item names, in paper order."""
    if only is None or only == "all":
        return ALL_ITEMS
    names = [s.strip() for s in only.split(",")] if isinstance(only, str) else list(only)
    bad = [n for n in names if n not in ALL_ITEMS]
    if bad or not names:
        raise ValueError(f"only: unknown item(s) {bad or names}; allowed: {list(ALL_ITEMS)}")
    return tuple(i for i in ALL_ITEMS if i in names)


def _wireless(item: str, out: Path, p: Preset) -> dict[str, Any]:
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
        done[item] = _wireless(item, out, p)
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
            done["em_variants"] = {"json": _write_pairs(out, pairs, p.window)}
    report = write_report(out, p, items, done, rows, wall, pairs)
    return {"items": done, "wall_s": wall, "tables": rows, "report": report}


def _write_pairs(out: Path, pairs: Sequence[Mapping[str, Any]], window: int) -> Path:
    from pfedwn_jax.io import atomic_write_json

    doc = {"schema": "pfedwn-reproduce-em-variants/1", "window": window,
           "unit": "points of % target test accuracy (variant - default, per seed)",
           "pairs": list(pairs)}  # fmt: skip
    return atomic_write_json(out / "em_variants.json", _finite(doc))


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
        done["fig8"] = fig8(rows, p, out)
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
