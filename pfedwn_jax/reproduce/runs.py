"""The sweeps of a reproduction and the choice of each method's hyperparameters.

Per dataset, method and settings group (Table II's cases; the 20-neighbor network; Fig. 1's
all-client network), one `sweep` call holds every setting x grid point
(`experiment.grid.expand`) x seed, so the cases share compiled programs, and each group's sweep is
saved apart (a later reproduction reads it back); `merge_sweeps` joins a method's groups.
pFedWN's sweeps keep its per-round EM weights (`pi`, `pi_trace`: Fig. 8).
Each method's hyperparameters are chosen per setting on the validation split (`choose`: mean
of the last `window` rounds of `target_val_accuracy`), never on the test split.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from pfedwn_jax import api
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.grid import expand, run_config
from pfedwn_jax.io import atomic_write_text, read_json
from pfedwn_jax.reproduce.cases import (
    PAPER_GAMMAS,
    PAPER_WANTED,
    Case,
    config_label_counts,
    network20_case,
    paper_cases,
)
from pfedwn_jax.reproduce.presets import BELOW_ONE, FIXED_A, DataSpec, Preset
from pfedwn_jax.results.sweep import SWEEP_FILE, SweepResult

#: pFedWN's records every sweep of it keeps (Fig. 8 reads them).
PFEDWN_RECORDS = ("pi", "pi_trace")

STATS = ("final", "last", "max")


SPECIAL = ("20 neighbors", "all clients")


class Setting(NamedTuple):
    """A named network setting of one table column: "Case 1", "20 neighbors", ..."""

    name: str
    config: ExperimentConfig
    extra: tuple[tuple[str, Any], ...] = ()


def spec_model(spec: DataSpec) -> str:
    """The model of `spec` on this machine: `accel_model` where JAX's default backend is an
    accelerator (GPU/TPU), else `model` (asked at run time, after the CPU devices are set)."""
    if spec.accel_model is None:
        return spec.model
    import jax

    return spec.accel_model if jax.default_backend() != "cpu" else spec.model


def dataset_base(preset: Preset, spec: DataSpec, method: str) -> ExperimentConfig:
    """The config every run of `method` on `spec` starts from (before case, grid and seed)."""
    hp = {method: dict(preset.hparams[method])} if method in preset.hparams else {}
    return ExperimentConfig(
        dataset=spec.dataset,
        model=spec_model(spec),
        max_samples_per_client=spec.max_samples,
        algorithms=(method,),
        hparams=hp,
        **dict(preset.base),
    )


#: The config fields a partition's class counts depend on (with `seed` when `data_seed` is
#: None, and the number of clients).
_DATA_FIELDS = ("dataset", "data_dir", "partition", "alpha", "train_frac", "data_seed", "pool",
                "classes_per_client", "min_samples", "max_samples_per_client")  # fmt: skip


def label_counts(base: ExperimentConfig, neighbors: int) -> np.ndarray:
    """`[N, C]` class counts of `base`'s partition over `neighbors + 1` clients (all splits),
    loaded once per distinct data (every method's settings share them)."""
    fields = {k: getattr(base, k) for k in _DATA_FIELDS}
    if base.data_seed is None:
        fields["seed"] = base.seed
    return _counts(json.dumps(fields, sort_keys=True, default=str), neighbors)


@functools.lru_cache(maxsize=16)
def _counts(fields: str, neighbors: int) -> np.ndarray:
    cfg = ExperimentConfig(**json.loads(fields), num_neighbors=neighbors)
    return config_label_counts(cfg)


def table_cases(base: ExperimentConfig, criterion: str = "counts", n20: bool = False) -> list[Case]:
    """Table II's three cases (10 neighbors, gamma_th 5/10/15 with 4/3/2 selected) or, with
    `n20`, Table III's (20 neighbors, gamma_th 10, 3 selected), their targets chosen by
    `criterion` (`reproduce.cases`); the cases carry the neighbors' label overlaps."""
    counts = label_counts(base, 20 if n20 else 10)
    if n20:
        return [network20_case(base, criterion=criterion, label_counts=counts)]
    return paper_cases(
        base, 10, PAPER_WANTED, PAPER_GAMMAS, criterion=criterion, label_counts=counts
    )


def settings(
    base: ExperimentConfig, want: Sequence[str], criterion: str = "counts"
) -> list[Setting]:
    """The settings named in `want` among "cases" (Table II's cases), "n20" (Table III's)
    and "all" (Case 1's network with every neighbor in training, no selection: Fig. 1's FL);
    the targets chosen by `criterion`."""
    out = []
    ten = table_cases(base, criterion)
    if "cases" in want:
        out += [Setting(c.name, c.config(base)) for c in ten]
    if "n20" in want:
        (n20,) = table_cases(base, criterion, n20=True)
        out.append(Setting("20 neighbors", n20.config(base)))
    if "all" in want:
        out.append(Setting("all clients", ten[0].config(base).replace(selection=False)))
    return out


def run_settings(
    setting_list: Sequence[Setting],
    grid: Mapping[str, Sequence[Any]],
    seeds: Sequence[int],
    cache: Path | None = None,
    max_runs: int | None = None,
) -> tuple[SweepResult, list[dict[str, Any]]]:
    """Every setting x grid point x seed (`experiment.grid.expand`: grid points in product order,
    seeds innermost) as one `api.sweep` call; the `SweepResult` (swept: "case", the grid
    keys and the settings' `extra` labels; pFedWN's `PFEDWN_RECORDS` kept) and every run's
    label and full config (for the CSV/JSON). With `cache`, a sweep already saved there with
    the same runs is read back instead of run, and a new one is saved there. `max_runs`: runs
    per compiled program (None: as many as the memory plan fits)."""
    configs, labels = [], []
    for st in setting_list:
        for spec in expand(st.config, list(seeds), grid):
            configs.append(run_config(st.config, spec))
            labels.append({"seed": spec.seed, "case": st.name, **spec.values, **dict(st.extra)})
    runs = [{**lab, "config": c.to_dict()} for lab, c in zip(labels, configs, strict=True)]
    if cache is not None and (done := _cached(cache, runs)) is not None:
        return done, runs
    t0 = time.perf_counter()
    res = api.sweep(
        configs, labels=labels, progress=False, records=PFEDWN_RECORDS, max_runs=max_runs
    )
    res.meta["wall_s"] = time.perf_counter() - t0
    if cache is not None:
        save_sweep(cache, res, runs)
    return res, runs


def _cached(folder: Path, runs: Sequence[Mapping[str, Any]]) -> SweepResult | None:
    """The sweep saved in `folder` if it holds exactly these runs (same labels and configs),
    so an interrupted reproduction continues where it stopped; else None."""
    if not (folder / "runs.json").is_file() or not (folder / SWEEP_FILE).is_file():
        return None
    saved = read_json(folder / "runs.json", _CACHE_FILE)
    if saved != json.loads(json.dumps(list(runs), default=str)):
        return None
    try:
        return SweepResult.load(folder)
    except ValueError as e:
        raise ValueError(f"{e}; remove {str(folder)!r} to compute it again") from None


_CACHE_FILE = "cached reproduction file"


def save_sweep(folder: Path, res: SweepResult, runs: Sequence[Mapping[str, Any]]) -> None:
    """`res.save(folder)` without plots, then runs.json (what `_cached` checks: written
    last)."""
    res.save(folder, plots=False)
    atomic_write_text(folder / "runs.json", json.dumps(list(runs), indent=1, default=str))


def best_entry(entries: list[dict[str, Any]]) -> dict[str, Any]:
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
        best = best_entry(cands)
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


def plan(preset: Preset, items: Sequence[str]) -> dict[str, dict[str, list[str]]]:
    """Per dataset label and method, the settings the requested `items` need."""
    out: dict[str, dict[str, list[str]]] = {}
    for spec in preset.datasets:
        fig9 = "fig9" in items and spec.label == preset.fig9
        want: dict[str, list[str]] = {}
        for m in preset.methods:
            w = []
            fig8 = "fig8" in items and spec.label == preset.fig8 and m == "pfedwn"
            em = "em" in items and spec.label in preset.variants and m == "pfedwn"
            if "table2" in items or fig9 or fig8 or em:
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


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")


def variant_name(overrides: Mapping[str, Any]) -> str:
    """A variant's label from its pFedWN overrides: "em_every=1, mix_components=True"."""
    return ", ".join(f"{k}={v}" for k, v in overrides.items())


def _variant_base(preset: Preset, spec: DataSpec, overrides: Mapping[str, Any]):
    base = dataset_base(preset, spec, "pfedwn")
    hp = {**base.hparams.get("pfedwn", {}), **overrides}
    return base.replace(hparams={**base.hparams, "pfedwn": hp})


def run_variants(
    preset: Preset, spec: DataSpec, out: Path, rows: Sequence[Mapping[str, Any]] = ()
) -> tuple[list[dict[str, Any]], tuple[SweepResult, list[dict]]]:
    """pFedWN's EM variants (`preset.em_variants`) on Table II's cases. "tuned": each tuned
    on its own over pFedWN's grid on the validation split, like a method (a variant evaluated
    at the default's chosen point would favour the default); rows named "pfedwn (VARIANT)"
    (`em_variants.csv`, beside Table II).
    "fixed": each at `a = FIXED_A` and at the default's chosen `a` (`rows`: the default's
    Table II rows), both with the default's chosen lr, so that the pairing with the default
    compares the readings at the same point; rows carry `point` (`fixed_points`)."""
    if preset.variant_points == "fixed":
        return _fixed_variants(preset, spec, out, rows)
    grid = preset.grids["pfedwn"]
    sts = []
    for over in preset.em_variants:
        extra = (("variant", variant_name(over)),)
        base = _variant_base(preset, spec, over)
        sts += [st._replace(extra=extra) for st in settings(base, ("cases",), preset.criterion)]
    folder = out / "sweeps" / f"{slug(spec.label)}_pfedwn_variants"
    res, vruns = run_settings(sts, grid, preset.seeds, folder, preset.max_runs)
    label = {"dataset": spec.label, "sweep_wall_s": res.meta["wall_s"]}
    rows = choose(res, list(grid), preset.window, label)
    for r in rows:
        r["config"] = chosen_config(vruns, r)
        r["method"] = f"pfedwn ({r['variant']})"
    return rows, (res, vruns)


def fixed_points(chosen_a: float) -> list[tuple[str, float]]:
    """The (label, a) points of a "fixed" variant comparison: `a = FIXED_A` and the chosen
    `a`; one point labelled "a=0.5 (chosen)" when they coincide, and none at a chosen
    `a = 1`, where Eq. 5 keeps the target's own model whatever EM estimates."""
    if chosen_a == FIXED_A:
        return [(f"a={FIXED_A:g} (chosen)", FIXED_A)]
    if chosen_a == 1.0:
        return [(f"a={FIXED_A:g}", FIXED_A)]
    return [(f"a={FIXED_A:g}", FIXED_A), (f"chosen a={chosen_a:g}", chosen_a)]


def _fixed_variants(preset, spec, out, rows):
    ref = {r["case"]: r["chosen"] for r in rows if r["dataset"] == spec.label
           and r["method"] == "pfedwn" and r["case"] not in SPECIAL}  # fmt: skip
    sts = []
    for over in preset.em_variants:
        base = _variant_base(preset, spec, over)
        for st in settings(base, ("cases",), preset.criterion):
            lr, best = ref[st.name]["lr"], ref[st.name]["pfedwn.a"]
            for point, a in fixed_points(best):
                hp = {**st.config.hparams, "pfedwn": {**st.config.hparams["pfedwn"], "a": a}}
                cfg = st.config.replace(lr=lr, hparams=hp)
                extra = (("variant", variant_name(over)), ("point", point), ("lr", lr),
                         ("pfedwn.a", a))  # fmt: skip
                sts.append(Setting(st.name, cfg, extra))
    folder = out / "sweeps" / f"{slug(spec.label)}_pfedwn_variants"
    res, vruns = run_settings(sts, {}, preset.seeds, folder, preset.max_runs)
    label = {"dataset": spec.label, "sweep_wall_s": res.meta["wall_s"]}
    new = choose(res, [], preset.window, label)
    for r in new:
        r["chosen"] = {"lr": r["lr"], "pfedwn.a": r["pfedwn.a"]}
        r["config"] = chosen_config(vruns, r)
        r["method"] = f"pfedwn ({r['variant']}; {r['point']})"
    return new, (res, vruns)


def run_tables(
    preset: Preset, items: Sequence[str], out: Path, log: Callable[[str], None] = print
) -> tuple[list[dict[str, Any]], dict[tuple[str, str], tuple[SweepResult, list[dict]]]]:
    """Every sweep the items need; the chosen rows of every (dataset, setting, method) and
    the sweeps by (dataset label, method). A method's settings groups (Table II's cases,
    the 20-neighbor network, Fig. 1's all-client network: each its own partition or slot
    count, so its own compiled program anyway) are saved apart (`sweeps/DATASET_METHOD`,
    `..._n20`, `..._all`), so that a later run with more items reads back the groups done."""
    rows: list[dict[str, Any]] = []
    sweeps: dict[tuple[str, str], tuple[SweepResult, list[dict]]] = {}
    todo = plan(preset, items)
    for spec in preset.datasets:
        for m, want in todo.get(spec.label, {}).items():
            base, parts = dataset_base(preset, spec, m), []
            for group in want:
                sts = settings(base, (group,), preset.criterion)
                name = f"{slug(spec.label)}_{m}" + ("" if group == "cases" else f"_{group}")
                folder = out / "sweeps" / name
                grid = preset.grids[m]
                parts.append(run_settings(sts, grid, preset.seeds, folder, preset.max_runs))
            res = merge_sweeps([r for r, _ in parts])
            runs = [run for _, rs in parts for run in rs]
            label = {"dataset": spec.label, "sweep_wall_s": res.meta["wall_s"]}
            new = choose(res, list(preset.grids[m]), preset.window, label)
            for r in new:
                r["config"] = chosen_config(runs, r)
            rows += new + below_one(preset, m, res, runs, label)
            sweeps[(spec.label, m)] = (res, runs)
            log(f"{spec.label} {m}: {res.num_runs} runs in {res.meta['wall_s']:.0f} s")
        if "em" in items and spec.label in preset.variants:
            new, sweeps[(spec.label, "pfedwn variants")] = run_variants(preset, spec, out, rows)
            rows += new
            log(f"{spec.label} pFedWN EM variants done")
    return rows, sweeps


def below_one(preset: Preset, method: str, res: SweepResult, runs, label) -> list[dict]:
    """pFedWN's rows chosen on validation among its grid points with ``a < 1`` (method
    ``BELOW_ONE``; ``sweep_method`` "pfedwn"), where its grid also holds ``a = 1`` (Local):
    none otherwise."""
    grid = preset.grids.get(method, {})
    below = [a for a in grid.get("pfedwn.a", ()) if a < 1]
    if method != "pfedwn" or not below or len(below) == len(grid["pfedwn.a"]):
        return []
    rows = choose(res.select({"pfedwn.a": below}), list(grid), preset.window, label)
    for r in rows:
        r["config"] = chosen_config(runs, r)
        r.update(method=BELOW_ONE, sweep_method="pfedwn")
    return rows


def merge_sweeps(parts: Sequence[SweepResult]) -> SweepResult:
    """One `SweepResult` of several with the same columns and swept keys: the rows one after
    the other, the later parts' run ids (and their records' keys) shifted past the earlier
    ones; meta: the summed `wall_s`."""
    if len(parts) == 1:
        return parts[0]
    names = list(parts[0].rows)
    if any(list(p.rows) != names or p.swept != parts[0].swept for p in parts):
        raise ValueError("merge_sweeps: the parts need the same columns and swept keys")
    cols: dict[str, list[np.ndarray]] = {k: [] for k in names}
    records: dict[str, np.ndarray] = {}
    offset = 0
    for part in parts:
        for k in names:
            cols[k].append(part.rows[k] + offset if k == "run" else part.rows[k])
        for key, value in part.records.items():
            run, rest = key.split("/", 1)
            records[f"{int(run) + offset}/{rest}"] = value
        offset += int(part.rows["run"].max()) + 1 if len(part) else 0
    meta = {"wall_s": float(sum(p.meta.get("wall_s", 0.0) for p in parts)), "parts": len(parts)}
    merged = {k: np.concatenate(v) for k, v in cols.items()}
    return SweepResult(merged, parts[0].swept, meta, records)
