"""`SweepResult`: the tidy table a sweep returns, its statistics over seeds, files and plots.

One row per run x method x round (columns in `COLUMNS`, plus one per swept key). Everything
else is computed from the rows on the host with numpy: `summary()` (per grid point and method:
mean, standard deviation and Student-t 95% interval over seeds of the final, last-`window`-round
mean and maximum target accuracy; intervals in `results.stats`), `curves()` (the same per
round), CSV/JSON files, and plots (`results.plots`). The statistics live in `results.sweep_stats`.

A swept key that does not concern a method (`"pfedwn.a"` for local: `owned_columns`) is
missing in that method's rows: NaN in a numeric column (an int or bool column becomes float
there), "" in a text column; the summary and its table show such a method once, with "-"
for the key, and the plots draw it once (a flat line against the key).
See `docs/sweeps.md` ("Outputs").
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pfedwn_jax._checks import check_choice
from pfedwn_jax.io import (
    atomic_write_json,
    atomic_write_text,
    atomic_write_with,
    check_writable_dir,
    csv_text,
    read_npz,
    write_npz,
)
from pfedwn_jax.plotting import pyplot
from pfedwn_jax.results import plots, sweep_stats
from pfedwn_jax.results.frames import pandas_module
from pfedwn_jax.results.result import to_jsonable
from pfedwn_jax.results.stats import LEVEL
from pfedwn_jax.results.sweep_stats import STATS
from pfedwn_jax.results.sweep_stats import codes as _codes
from pfedwn_jax.results.sweep_stats import scalar as _scalar

SCHEMA = "pfedwn-sweep/1"
SUMMARY_SCHEMA = "pfedwn-sweep-summary/1"
SWEEP_FILE = "sweep.json"  # the file of `save` that `load` reads back
RECORDS_FILE = "records.npz"  # the kept records, read back with it
METRICS = ("target_accuracy", "target_loss", "mean_client_accuracy")
# column -> kind; swept columns sit between "seed" and "method"
RUN_COLUMNS = {"run": "int", "seed": "int"}
ROUND_COLUMNS = {"method": "str", "round": "int", **dict.fromkeys(METRICS, "float")}
ROUND_COLUMNS["diverged"] = "bool"
COLUMNS = (*RUN_COLUMNS, *ROUND_COLUMNS)
_NUMPY_KINDS = {"int": "iu", "float": "fiu", "bool": "b", "str": "U"}
_SWEPT_KINDS = "biufU"


# --------------------------------------------------------------------------- column checks
def _column(name: str, values: Any, kinds: str) -> np.ndarray:
    """`values` as a read-only 1-D copy whose dtype kind is in `kinds` (str objects -> `U`)."""
    arr = np.array(values)
    if arr.dtype == object and all(isinstance(v, str) for v in arr.ravel()):
        arr = arr.astype(str) if arr.size else np.array([], dtype="<U1")
    if arr.ndim != 1:
        raise ValueError(f"column {name!r} must be 1-D; got shape {arr.shape}")
    if arr.dtype.kind not in kinds:
        allowed = {"i": "int", "u": "uint", "f": "float", "b": "bool", "U": "str"}
        names = sorted({allowed[k] for k in kinds})
        raise ValueError(f"column {name!r} must hold {'/'.join(names)} values; got {arr.dtype}")
    if kinds == "fiu" and arr.dtype.kind != "f":
        arr = arr.astype(np.float64)
    arr.setflags(write=False)
    return arr


def missing(column: np.ndarray) -> np.ndarray:
    """`[L]` bool: the rows where a swept column has no value (NaN, or "" in text)."""
    if column.dtype.kind == "f":
        return np.isnan(column)
    if column.dtype.kind == "U":
        return column == ""
    return np.zeros(column.shape, bool)


def owned_columns(rows: Mapping[str, np.ndarray], owners: Mapping[str, str]) -> dict:
    """`rows` with each column `key` of `owners` (`key -> method`, e.g. `"pfedwn.a" ->
    "pfedwn"`) missing in the rows of the other methods: NaN (int and bool columns become
    float) or "" (text)."""
    out = dict(rows)
    if "method" not in rows:  # no rows
        return out
    for key, method in owners.items():
        col, other = np.asarray(rows[key]), np.asarray(rows["method"]) != method
        if not other.any():
            continue
        if col.dtype.kind == "U":
            out[key] = np.where(other, "", col)
        else:
            out[key] = np.where(other, np.nan, col.astype(np.float64))
    return out


# --------------------------------------------------------------------------- the result
@dataclasses.dataclass(frozen=True, eq=False)
class SweepResult:
    """The tidy table of a sweep: one row per run x method x round.

    Attributes:
      rows: column name -> `[L]` array, columns in this order: "run" int (0..R-1), "seed" int,
        one column per swept key (float, int, bool or str), "method" str, "round" int (from
        1), "target_accuracy", "target_loss", "mean_client_accuracy" float, "diverged" bool
        (the run's method diverged at or before this round), then any extra columns. Stored
        as read-only copies.
      swept: the grid keys, e.g. `("lr", "pfedwn.a")`, each also a column.
      meta: JSON-friendly description (base config, seeds, grid, zip, timings, environment);
        normalised by `to_jsonable` (tuples become lists, NaN becomes None).
      records: the per-round records a sweep kept (`sweep(records=...)`), `"run/method/key"
        -> [rounds, ...]` (`record(key, run, method)`); saved to `records.npz`.

    Raises `ValueError` (naming the columns) for missing columns, unequal lengths, wrong
    dtypes, a repeated (run, method, round) or a seed or swept value that changes within a run.
    """

    rows: dict[str, np.ndarray]
    swept: tuple[str, ...]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    records: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        swept = self._checked_swept()
        if not isinstance(self.rows, Mapping):
            raise ValueError(f"rows must be a dict of columns; got {type(self.rows).__name__}")
        kinds = {**RUN_COLUMNS, **dict.fromkeys(swept, "swept"), **ROUND_COLUMNS}
        missing = [name for name in kinds if name not in self.rows]
        if missing:
            raise ValueError(f"rows is missing column(s) {missing}; required: {list(kinds)}")
        names = [*kinds, *(k for k in self.rows if k not in kinds)]
        kinds.update({k: "swept" for k in names if k not in kinds})  # extras: any plain dtype
        rows = {
            k: _column(k, self.rows[k], _NUMPY_KINDS.get(kinds[k], _SWEPT_KINDS)) for k in names
        }
        lengths = {k: len(v) for k, v in rows.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"columns must have equal lengths; got {lengths}")
        if not isinstance(self.meta, Mapping):
            raise ValueError(f"meta must be a dict; got {type(self.meta).__name__}")
        try:
            meta = to_jsonable(dict(self.meta))
        except TypeError as e:
            raise ValueError(f"meta must be JSON-friendly: {e}") from None
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "swept", swept)
        object.__setattr__(self, "meta", meta)
        object.__setattr__(self, "records", {k: np.asarray(v) for k, v in self.records.items()})
        self._check_consistent()

    def _checked_swept(self) -> tuple[str, ...]:
        """`swept` as a tuple of distinct strings that are not fixed column names."""
        swept = (self.swept,) if isinstance(self.swept, str) else tuple(self.swept)
        bad = [k for k in swept if not isinstance(k, str) or k in COLUMNS]
        if bad or len(set(swept)) != len(swept):
            raise ValueError(
                f"swept must be distinct key names other than {list(COLUMNS)}; got {list(swept)}"
            )
        return swept

    def _check_consistent(self) -> None:
        """One row per (run, method, round); rounds >= 1; the seed fixed per run, swept values
        per run and method (a key missing for one method: `owned_columns`)."""
        r = self.rows
        for name, low in (("run", 0), ("round", 1)):
            if len(self) and r[name].min() < low:
                raise ValueError(f"column {name!r} must be >= {low}; got {r[name].min()}")
        _, codes = _codes([r["run"], r["method"], r["round"]], len(self))
        if len(self) and np.bincount(codes).max() > 1:
            dup = np.flatnonzero(np.bincount(codes) > 1)[0]
            i = int(np.flatnonzero(codes == dup)[0])
            key = tuple(_scalar(r[k][i]) for k in ("run", "method", "round"))
            raise ValueError(f"rows repeat (run, method, round) = {key}")
        per_run = _codes([r["run"]], len(self))
        per_pair = _codes([r["run"], r["method"]], len(self)) if self.swept else per_run
        for name in ("seed", *self.swept):
            first, run_code = per_run if name == "seed" else per_pair
            changed = r[name] != r[name][first][run_code]
            if r[name].dtype.kind == "f":
                changed &= ~(np.isnan(r[name]) & np.isnan(r[name][first][run_code]))
            if changed.any():
                run = _scalar(r["run"][np.flatnonzero(changed)[0]])
                raise ValueError(f"column {name!r} must be constant within a run; run {run} varies")

    # ------------------------------------------------------------------ accessors
    def record(self, key: str, run: int, method: str) -> np.ndarray:
        """`[rounds, ...]` record `key` (e.g. pFedWN's `pi [rounds, S, K]`) of one run and
        method; a ValueError naming what was kept otherwise."""
        name = f"{run}/{method}/{key}"
        if name not in self.records:
            kept = sorted({k.split("/", 2)[2] for k in self.records})
            raise ValueError(
                f"no record {key!r} of run {run}, method {method!r}; kept records: {kept} "
                "(sweep(records=[...]) names what a sweep keeps)"
            )
        return self.records[name]

    def __len__(self) -> int:
        return len(self.rows["run"])

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.rows)

    @property
    def methods(self) -> tuple[str, ...]:
        """Methods in order of first appearance."""
        first, _ = _codes([self.rows["method"]], len(self))
        return tuple(self.rows["method"][first].tolist()) if len(self) else ()

    @property
    def varying(self) -> tuple[str, ...]:
        """The swept keys that take more than one value in the rows (a grid list of one value
        is swept but does not vary; a missing value is none)."""
        return tuple(k for k in self.swept if self.values_of(k).size > 1)

    def values_of(self, key: str, method: str | None = None) -> np.ndarray:
        """The sorted distinct values of swept `key` (in the rows of `method`), missing
        ones left out."""
        col = self.rows[key]
        if method is not None:
            col = col[self.rows["method"] == method]
        return np.unique(col[~missing(col)])

    @property
    def num_runs(self) -> int:
        return len(np.unique(self.rows["run"]))

    def select(self, conditions: Mapping[str, Any] | None = None, /, **kw: Any) -> SweepResult:
        """The rows where every column equals its value (or one of a list of values).

        `select(method="pfedwn", lr=0.05)`, `select({"pfedwn.a": [0.3, 0.5]})` (keys that are
        not Python names go in the dict). A value absent from its column is a `ValueError`
        listing the values present; `meta["selected"]` records the conditions.
        """
        conditions = {**(conditions or {}), **kw}
        keep = np.ones(len(self), dtype=bool)
        for key, value in conditions.items():
            col = self.rows[check_choice("select: column", key, self.columns)]
            wanted = np.atleast_1d(np.asarray(list(value) if isinstance(value, set) else value))
            if col.dtype.kind == "f" and wanted.dtype.kind in "fiu":
                wanted = wanted.astype(col.dtype)  # 0.05 matches a float32 column's 0.05
            absent = [v for v in wanted.tolist() if not np.isin(v, col)]
            if absent:
                present = [_scalar(v) for v in np.unique(col)[:20]]
                raise ValueError(f"select: no rows with {key}={absent[0]!r}; present: {present}")
            keep &= np.isin(col, wanted)
        meta = {**self.meta, "selected": {**self.meta.get("selected", {}), **conditions}}
        return SweepResult(
            {k: v[keep] for k, v in self.rows.items()}, self.swept, meta, self.records
        )

    # ------------------------------------------------------------------ statistics
    def summary(self, window: int = 5, metric: str = "target_accuracy") -> list[dict[str, Any]]:
        """Per grid point and method: statistics over its runs (seeds) of target accuracy or
        another per-round `metric` (`results.sweep_stats.summary`: "n", "n_diverged" and the
        mean, std and 95% interval of each statistic in `STATS`)."""
        return sweep_stats.summary(self, window, metric)

    def curves(self, metric: str = "target_accuracy") -> list[dict[str, Any]]:
        """Per grid point and method, per round: the mean over runs with its band
        (`results.sweep_stats.curves`)."""
        return sweep_stats.curves(self, metric)

    def heatmap_values(
        self, method: str, stat: str = "final", window: int = 5
    ) -> tuple[list[Any], list[Any], np.ndarray]:
        """(values of swept[0], values of swept[1], mean `stat` `[len0, len1]`) of `method`:
        the heatmap's cells, sorted values, NaN where a combination was not run. A key that
        does not concern `method` (missing in its rows) has the one value None."""
        if len(self.swept) != 2:
            raise ValueError(
                f"a heatmap needs a 2-D grid (two swept keys); this sweep sweeps {list(self.swept)}"
            )
        method = check_choice("method", method, self.methods)
        stat = check_choice("stat", stat, STATS)
        axes = [self.values_of(k, method).tolist() or [None] for k in self.swept]
        cells = np.full((len(axes[0]), len(axes[1])), np.nan)
        for entry in self.select(method=method).summary(window):
            i, j = (_position(axes[a], entry[k]) for a, k in enumerate(self.swept))
            cells[i, j] = entry[f"{stat}_mean"]
        return axes[0], axes[1], cells

    def summary_table(self, window: int = 5) -> str:
        """`summary(window)` as aligned text: mean +- 95% CI half-width of target accuracy (%)."""
        return sweep_stats.summary_table(self, window)

    # ------------------------------------------------------------------ files
    def to_csv(self, path: str | Path | None = None) -> str:
        """The table as CSV: a header of the column names, then one line per row.

        Floats in the shortest form that reads back to the same value of their dtype, NaN as
        an empty field, infinities as `inf`/`-inf`, booleans as `True`/`False`. With `path`
        the text is also written there atomically.
        """
        text = csv_text(
            self.columns, zip(*(_csv_cells(v) for v in self.rows.values()), strict=True)
        )
        if path is not None:
            atomic_write_text(path, text)
        return text

    def to_json(self, path: str | Path | None = None) -> str:
        """The result as JSON (schema `SCHEMA`): `from_json` restores it exactly, dtypes too.

        `{"schema", "swept", "meta", "rows": {column: {"dtype", "values"}}}`, one line per
        column; NaN is stored as null and infinities as the strings "inf"/"-inf". With `path`
        the text is also written there atomically.
        """
        nl = "\n"  # JSON text holds no raw newline inside a string: indenting lines is safe
        columns = ",\n".join(
            f"  {json.dumps(k)}: {json.dumps(_json_column(v), allow_nan=False)}"
            for k, v in self.rows.items()
        )
        text = (
            f'{{\n "schema": {json.dumps(SCHEMA)},\n "swept": {json.dumps(list(self.swept))},\n'
            f' "meta": {json.dumps(self.meta, indent=1, allow_nan=False).replace(nl, nl + " ")},\n'
            f' "rows": {{\n{columns}\n }}\n}}\n'
        )
        if path is not None:
            atomic_write_text(path, text)
        return text

    @classmethod
    def from_json(cls, source: str | Path) -> SweepResult:
        """The `SweepResult` of `to_json` text, or of a file holding it (a path; a directory
        that `save` wrote is read with `load`)."""
        if not isinstance(source, str) or not source.lstrip().startswith("{"):
            if Path(source).is_dir():
                raise ValueError(
                    f"{str(source)!r} is a directory; SweepResult.load(directory) reads the "
                    f"{SWEEP_FILE} that save(directory) wrote there"
                )
            where = f"sweep file {str(source)!r}"
            source = Path(source).read_text(errors="replace")
        else:
            where = "sweep JSON text"
        try:
            data = json.loads(source)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where} is not valid JSON (truncated or damaged?): {e}") from None
        schema = data.get("schema") if isinstance(data, dict) else None
        if schema != SCHEMA:
            raise ValueError(f"sweep JSON schema must be {SCHEMA!r}; got {schema!r}")
        try:
            rows = {k: _from_json_column(v) for k, v in data["rows"].items()}
            swept, meta = tuple(data["swept"]), data.get("meta", {})
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"sweep JSON is malformed: {type(e).__name__}: {e}") from None
        return cls(rows, swept, meta)

    @classmethod
    def load(cls, directory: str | Path) -> SweepResult:
        """The `SweepResult` that `save(directory)` wrote: its `sweep.json` and, where the sweep
        kept records, `records.npz` (the other files are derived from them). `ValueError`
        naming the path for a file, a missing directory or a directory without `sweep.json`."""
        path = Path(directory).expanduser()
        if path.is_file():
            raise ValueError(
                f"SweepResult.load takes the directory save() wrote; {str(path)!r} is a file "
                "(SweepResult.from_json reads a sweep.json file)"
            )
        if not path.is_dir():
            raise ValueError(f"SweepResult.load: directory {str(path)!r} does not exist")
        if not (path / SWEEP_FILE).is_file():
            found = sorted(p.name for p in path.iterdir())[:10]
            raise ValueError(
                f"SweepResult.load: {str(path)!r} holds no {SWEEP_FILE} (not a directory "
                f"SweepResult.save or `pfedwn sweep --out` wrote); found {found}"
            )
        res = cls.from_json(path / SWEEP_FILE)
        if not (path / RECORDS_FILE).is_file():
            return res
        records = read_npz(path / RECORDS_FILE, "sweep records file")
        return cls(res.rows, res.swept, res.meta, records)

    def to_pandas(self) -> Any:
        """The table as a `pandas.DataFrame` (a copy). Needs pandas (the `analysis` extra)."""
        pd = pandas_module("SweepResult.to_pandas()")
        return pd.DataFrame({k: np.array(v) for k, v in self.rows.items()}, columns=self.columns)

    def save(self, out_dir: str | Path, window: int = 5, plots: bool = True) -> dict[str, Path]:
        """Write `rows.csv`, `sweep.json`, `summary.json`, `records.npz` (kept records) and,
        with matplotlib and `plots`, `curves.png` and (2-D grid) `heatmap_METHOD.png` per
        method that both keys concern into `out_dir`; returns name -> path. With exactly one
        varying key (`varying`) also `vs_KEY.png` (`plot_vs_key`). `SweepResult.load(out_dir)`
        reads it back."""
        out = check_writable_dir(out_dir)
        summary = {"schema": SUMMARY_SCHEMA, "window": window, "level": LEVEL}
        summary |= {"swept": list(self.swept), "groups": self.summary(window)}
        paths = {"rows": out / "rows.csv", "sweep": out / SWEEP_FILE}
        self.to_csv(paths["rows"])
        self.to_json(paths["sweep"])
        paths["summary"] = atomic_write_json(out / "summary.json", to_jsonable(summary))
        if self.records:
            paths["records"] = out / RECORDS_FILE
            buf = io.BytesIO()
            write_npz(buf, self.records)
            atomic_write_with(paths["records"], lambda f: f.write(buf.getvalue()))
        if not plots or pyplot() is None or len(self) == 0:
            return paths

        def plotted(name: str, path: Path | None) -> None:
            if path is not None:  # a plot is None only without matplotlib (checked above)
                paths[name] = path

        plotted("curves", self.plot_curves(out / "curves.png"))
        if len(self.varying) == 1:
            key = self.varying[0]
            name = "vs_" + re.sub(r"[^A-Za-z0-9._-]", "_", key)
            plotted(name, self.plot_vs_key(out / f"{name}.png", window=window))
        if len(self.swept) == 2:  # the methods that vary over both keys
            both = [m for m in self.methods if all(self.values_of(k, m).size for k in self.swept)]
            for m in both:
                heatmap = out / f"heatmap_{m}.png"
                plotted(f"heatmap_{m}", self.plot_heatmap(heatmap, m, window=window))
        return paths

    # ------------------------------------------------------------------ plots
    def plot_curves(self, path: str | Path, metric: str = "target_accuracy") -> Path | None:
        """Learning curves per method and grid point with 95% bands (`results.plots`)."""
        return plots.plot_curves(self, path, metric)

    def plot_vs_key(self, path: str | Path, stat: str = "final", window: int = 5) -> Path | None:
        """`stat` target accuracy against the one varying key (`results.plots`)."""
        return plots.plot_vs_key(self, path, stat, window)

    def plot_heatmap(
        self, path: str | Path, method: str, stat: str = "final", window: int = 5
    ) -> Path | None:
        """A 2-D grid's mean `stat` target accuracy of `method` (`results.plots`)."""
        return plots.plot_heatmap(self, path, method, stat, window)


# --------------------------------------------------------------------------- helpers
def _position(values: list[Any], value: Any) -> int:
    """The index of `value` in `values`; a missing value (NaN or "") is at None."""
    gone = value == "" or (isinstance(value, float) and math.isnan(value))
    return values.index(None if gone else value)


def _csv_cells(column: np.ndarray) -> list[Any]:
    """The CSV fields of a column: `str` of numpy floats is the shortest exact form of their
    dtype; NaN becomes an empty field."""
    if column.dtype.kind == "f":
        return ["" if x != x else str(x) for x in column]
    return column.tolist()


def _json_column(column: np.ndarray) -> dict[str, Any]:
    """`{"dtype", "values"}`; non-finite floats as null ("nan") or "inf"/"-inf"."""
    values = column.tolist()
    if column.dtype.kind == "f":
        values = [
            v if math.isfinite(v) else None if math.isnan(v) else "inf" if v > 0 else "-inf"
            for v in values
        ]
    return {"dtype": column.dtype.str, "values": values}


def _from_json_column(entry: dict[str, Any]) -> np.ndarray:
    """The column `_json_column` stored."""
    dtype = np.dtype(entry["dtype"])
    values = entry["values"]
    if dtype.kind == "f":
        values = [math.nan if v is None else float(v) for v in values]
    return np.array(values, dtype=dtype)
