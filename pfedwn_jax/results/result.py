"""`Result`: what `run()` returns and what `pfedwn run` writes as `results.json`.

The JSON layout is a stable schema documented in `docs/experiments.md`; tools read it.
Accuracies are fractions in [0, 1]; non-finite numbers (a diverged loss) are stored as null.

Two layouts on disk (`Result.save`):

- `SCHEMA` (single mode, small S): everything inline in the JSON, lists of lists.
- `COMPACT_SCHEMA` (network mode): the JSON keeps what does not grow with the network (config,
  per-round target accuracy and loss, per-round mean and 10/50/90 % quantiles of client
  accuracy, scalar records, timings); every per-slot array (`client_accuracy [R', S]`,
  `client_loss`, records such as pFedWN's `pi [R', S, K]`, the neighbor lists, P_err,
  positions, per-client sample counts) goes to an `.npz` beside it (`arrays_path`), floats as
  `config.record_dtype`, rows every `config.record_every` rounds. The JSON names the `.npz`
  and its SHA-256, so a stale or foreign archive is refused on load.

In memory (`run()`'s `Result`, `to_dict`) both modes keep the inline layout.

Versions: `/3` (inline) and `/4` (compact) hold every registered per-round metric
(`results.metrics`: `target_accuracy`, `target_loss`, `mean_client_accuracy`,
`target_val_accuracy`, ...) as a per-round list of each method, and the validation accuracy
per slot as `client_val_accuracy`. Files of `/1` and `/2` still load: their validation
records (`records.val_acc`, `records.target_val_acc`) are read under those names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import math
from pathlib import Path
from typing import Any

import numpy as np

from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.io import atomic_write_json, atomic_write_with, read_json, write_npz
from pfedwn_jax.results import frames
from pfedwn_jax.results.cost_curves import to_accuracy
from pfedwn_jax.results.metrics import accuracy_stats, slot_rows

SCHEMA = "pfedwn-results/3"  # every array inline
COMPACT_SCHEMA = "pfedwn-results/4"  # summaries inline, per-slot arrays in the .npz
#: Earlier versions, read (and migrated) by `Result.load` / `from_dict`.
OLD_SCHEMA, OLD_COMPACT_SCHEMA = "pfedwn-results/1", "pfedwn-results/2"
SCHEMAS = (SCHEMA, COMPACT_SCHEMA, OLD_SCHEMA, OLD_COMPACT_SCHEMA)
COMPACT_SCHEMAS = (COMPACT_SCHEMA, OLD_COMPACT_SCHEMA)
DATA_ARRAYS = ("train_counts", "test_counts")  # per-client entries of `Result.data`
SEP = "/"  # npz key = path in the results dict: "methods/pfedwn/records/pi"


def to_jsonable(value: Any) -> Any:
    """Nested lists/dicts of Python scalars; NaN and infinities become None."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return to_jsonable(np.asarray(value).tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    raise TypeError(f"cannot store {type(value).__name__} in results JSON")


@dataclasses.dataclass
class Result:
    """Results of one experiment (all methods on the same network and partition).

    Attributes:
      config: the `ExperimentConfig` that produced it.
      network: the federation: mode, target, `slot_client [S]`, `is_target [S]`,
        `adjacency [S][S]` (small networks), neighbor lists, their P_err, selection, positions.
      data: dataset name, classes, per-client train/test sample counts.
      methods: `name -> dict` with `target_accuracy [R]`, `target_loss [R]`,
        `client_accuracy [R'][S]`, `client_loss [R'][S]`, `records {key: [R'][...]}` (R' the
        `recorded_rounds`, every round unless `config.record_every > 1`; records of one number
        per round are kept every round), `client_accuracy_stats {mean, q10, q50, q90: [R]}`,
        `max_target_accuracy`, `final_target_accuracy`, `hparams`, `timings` and `diverged`
        (None, or `{"round", "slots", "clients"}`: the first diverged round, counted from 1;
        a method stopped there has fewer than `config.rounds` rounds). Loaded from a compact
        file, the per-slot entries are NumPy arrays (`record_dtype`), not lists.
      environment: jax version, backend, devices, and `provenance` (package version, git
        commit, library versions, device kind).
      timings: `setup_s` (data + network), `total_s`.
    """

    config: ExperimentConfig
    network: dict[str, Any]
    data: dict[str, Any]
    methods: dict[str, dict[str, Any]]
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    timings: dict[str, Any] = dataclasses.field(default_factory=dict)

    # ------------------------------------------------------------------ accessors
    def target_accuracy(self, method: str) -> np.ndarray:
        """`[rounds]` target test accuracy after each round (NaN where not finite)."""
        return _array(self.methods[method]["target_accuracy"])

    def client_accuracy(self, method: str) -> np.ndarray:
        """`[R', S]` test accuracy of every slot after each of the `recorded_rounds`."""
        return _array(self.methods[method]["client_accuracy"])

    def recorded_rounds(self, method: str) -> np.ndarray:
        """`[R']` rounds (from 1) of the rows of `client_accuracy` and per-slot records."""
        entry = self.methods[method]
        if "recorded_rounds" in entry:
            return np.asarray(entry["recorded_rounds"], np.int64)
        # written before `record_every`: every round has its row
        rows = entry.get("client_accuracy")
        if rows is None:  # no per-slot metrics: the records' rows
            rows = max(entry.get("records", {}).values(), key=len, default=[])
        return np.arange(1, len(rows) + 1)

    def client_accuracy_stats(self, method: str) -> dict[str, np.ndarray]:
        """`{"mean", "q10", "q50", "q90"} -> [rounds]` client accuracy over the slots, every
        round (also with `record_every > 1`); computed from the rows for older files."""
        entry = self.methods[method]
        if "client_accuracy_stats" in entry:
            return {k: _array(v) for k, v in entry["client_accuracy_stats"].items()}
        return {k: _array(v) for k, v in accuracy_stats(self.client_accuracy(method)).items()}

    def metric(self, method: str, name: str) -> np.ndarray:
        """`[rounds]` per-round metric `name` of `method` (`target_accuracy`, `target_loss`,
        `mean_client_accuracy`, `target_val_accuracy`, any registered metric)."""
        entry = self.methods[method]
        if name not in entry or np.ndim(entry[name]) != 1:
            raise ValueError(f"{method!r} has no per-round metric {name!r}")
        return _array(entry[name])

    def records(self, method: str, key: str) -> np.ndarray:
        """`[R', ...]` record `key` of `method` (e.g. pFedWN's `pi`); `[rounds]` for a record
        of one number per round."""
        return _array(self.methods[method]["records"][key])

    def summary(self) -> dict[str, dict[str, float]]:
        """`method -> {"max": ..., "final": ...}` target accuracy (fractions); with the cost
        counted (`clock_s`) also `"time_to_90"` and `"energy_to_90"`, the simulated seconds
        and the joules spent to 90% of the final accuracy (`results.cost_curves`)."""
        out = {}
        for name, m in self.methods.items():
            out[name] = {"max": m["max_target_accuracy"], "final": m["final_target_accuracy"]}
            for key, spent in to_accuracy(m["target_accuracy"], m).items():
                out[name][key] = float(spent)
        return out

    def to_pandas(self) -> Any:
        """A tidy `pandas.DataFrame`, one row per method x round: target accuracy and loss,
        client-accuracy mean and quantiles, per-round scalar records
        (`pfedwn_jax.results.frames.result_columns`). Needs pandas (the `analysis` extra)."""
        return frames.pandas_module("Result.to_pandas()").DataFrame(frames.result_columns(self))

    @property
    def compact(self) -> bool:
        """Whether `save` writes the compact layout (network mode: every client a target)."""
        return self.config.mode == "network"

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The inline layout (`SCHEMA`): every array as nested lists."""
        return self._doc(SCHEMA, self.network, self.data, self.methods)

    def _doc(self, schema: str, network: Any, data: Any, methods: Any) -> dict[str, Any]:
        """A layout's JSON (`to_jsonable`): schema, config, parts and run facts, in this order."""
        doc = {"schema": schema, "config": self.config.to_dict(), "network": network}
        doc |= {"data": data, "methods": methods, "environment": self.environment}
        return to_jsonable({**doc, "timings": self.timings})

    def to_compact(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """`(JSON dict, arrays)` of the compact layout (`COMPACT_SCHEMA`); the arrays' keys are
        their paths in `to_dict()` (`"methods/pfedwn/records/pi"`), `"methods/NAME/rounds"`
        the recorded rounds. The JSON's `arrays` entry is filled in by `save`."""
        dtype = np.dtype(self.config.record_dtype)
        arrays: dict[str, np.ndarray] = {}
        network = dict(self.network)
        if "slot_neighbors" in network:  # the lists say the same as the dense [S, S] view
            network.pop("adjacency", None)
        network = _split_off(network, list(network), "network", arrays, dtype)
        data = _split_off(self.data, DATA_ARRAYS, "data", arrays, dtype)
        methods = {}
        for name, entry in self.methods.items():
            where = SEP.join(("methods", name))
            arrays[where + SEP + "rounds"] = self.recorded_rounds(name).astype(np.int32)
            head = _split_off(entry, list(slot_rows().values()), where, arrays, dtype)
            head.pop("recorded_rounds", None)
            records = entry.get("records", {})
            keys = [k for k, v in records.items() if not _per_round_scalar(v)]
            head["records"] = _split_off(records, keys, where + "/records", arrays, dtype)
            methods[name] = head
        return self._doc(COMPACT_SCHEMA, network, data, methods), arrays

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        schema = data.get("schema")
        if schema not in SCHEMAS:
            raise ValueError(f"results schema must be one of {list(SCHEMAS)}; got {schema!r}")
        config = ExperimentConfig.from_dict(data["config"])
        methods = _checked_methods(data["methods"])
        if schema in (OLD_SCHEMA, OLD_COMPACT_SCHEMA):
            methods = {name: _migrated(entry) for name, entry in methods.items()}
        return cls(
            config=config,
            network=data["network"],
            data=data["data"],
            methods=methods,
            environment=data.get("environment", {}),
            timings=data.get("timings", {}),
        )

    def save(self, path: str | Path) -> Path:
        """Write the JSON atomically (temp file + rename); returns the path.

        Compact layout (`compact`): the `.npz` (`arrays_path(path)`) first, then the JSON that
        names it and its SHA-256; the JSON is the commit point. The dense `adjacency` of a small
        network is left out there (the neighbor lists `slot_neighbors` hold the same links).
        """
        path = Path(path)
        if not self.compact:
            atomic_write_json(path, self.to_dict())
            return path
        doc, arrays = self.to_compact()
        buf = io.BytesIO()
        write_npz(buf, arrays)
        blob = buf.getvalue()
        npz = arrays_path(path)
        atomic_write_with(npz, lambda f: f.write(blob))
        doc["arrays"] = {"file": npz.name, "sha256": hashlib.sha256(blob).hexdigest()}
        atomic_write_json(path, doc)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Result:
        """Read a results JSON of either layout (a compact one with its `.npz`, whose arrays
        are put back in place as NumPy arrays)."""
        doc = _read_json(Path(path))
        try:
            if doc.get("schema") in COMPACT_SCHEMAS:
                for key, value in load_arrays(path).items():
                    _put(doc, key.split(SEP), value)
                for entry in _checked_methods(doc["methods"]).values():
                    entry["recorded_rounds"] = entry.pop("rounds")
            return cls.from_dict(doc)
        except KeyError as e:  # a JSON object, but not a results file
            raise ValueError(f"results file {str(path)!r} has no {e} entry") from None
        except ValueError as e:
            if str(path) in str(e):
                raise
            raise ValueError(f"results file {str(path)!r}: {e}") from None


# what every method entry of a results file holds (the summary and the curves read them)
METHOD_KEYS = ("target_accuracy", "max_target_accuracy", "final_target_accuracy")


def _checked_methods(methods: Any) -> dict[str, Any]:
    """`methods` if it maps names to entries holding `METHOD_KEYS`; else a `ValueError`
    naming the damaged entry (so a damaged file is refused when read, not at `summary()`)."""
    if not isinstance(methods, dict):
        raise ValueError(f"results: 'methods' must map method names to entries; got {methods!r}")
    for name, entry in methods.items():
        if not isinstance(entry, dict):
            got = f"{type(entry).__name__} {entry!r}"[:80]
            raise ValueError(f"results: methods[{name!r}] is damaged: not an entry but {got}")
        missing = [k for k in METHOD_KEYS if k not in entry]
        if missing:
            raise ValueError(f"results: methods[{name!r}] is damaged: it has no {missing}")
    return methods


def _migrated(entry: dict[str, Any]) -> dict[str, Any]:
    """A method entry of an earlier version with today's names: the validation records
    `val_acc [R'][S]` / `target_val_acc [R]` as `client_val_accuracy` / `target_val_accuracy`."""
    entry = dict(entry)
    records = dict(entry.get("records", {}))
    for old, new in (("val_acc", "client_val_accuracy"), ("target_val_acc", "target_val_accuracy")):
        if old in records:
            entry[new] = records.pop(old)
    entry["records"] = records
    return entry


def arrays_path(path: str | Path) -> Path:
    """The `.npz` of a compact results JSON `path`: same name, suffix `.npz`."""
    return Path(path).with_suffix(".npz")


def load_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """The per-slot arrays of the compact results JSON `path`, keyed by their place in the
    results (`"methods/pfedwn/client_accuracy"` `[R', S]`, `".../records/pi"` `[R', S, K]`,
    `"methods/NAME/rounds"` `[R']`, `"network/positions"` ...).

    Raises `ValueError` when `path` is not a compact results file, or its `.npz` is missing
    or is not the one written with it (checksum).
    """
    path = Path(path)
    doc = _read_json(path)
    if doc.get("schema") not in COMPACT_SCHEMAS:
        raise ValueError(
            f"{str(path)!r} has schema {doc.get('schema')!r}: its arrays are inline in the JSON "
            f"(Result.load reads them); only {list(COMPACT_SCHEMAS)} files have an .npz"
        )
    info = doc.get("arrays") or {}
    npz = path.with_name(str(info.get("file", arrays_path(path).name)))
    try:
        blob = npz.read_bytes()
    except OSError as e:
        raise ValueError(
            f"results {str(path)!r}: cannot read its arrays {str(npz)!r}: {e}"
        ) from None
    if hashlib.sha256(blob).hexdigest() != info.get("sha256"):
        raise ValueError(
            f"results {str(path)!r}: {str(npz)!r} is not the archive written with it "
            "(SHA-256 differs: overwritten or damaged)"
        )
    with np.load(io.BytesIO(blob), allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def _read_json(path: Path) -> dict[str, Any]:
    doc = read_json(path, "results file")
    if not isinstance(doc, dict):
        raise ValueError(f"{str(path)!r} is not a results JSON (top level {type(doc).__name__})")
    if doc.get("schema") not in SCHEMAS:
        raise ValueError(
            f"{str(path)!r} is not a results JSON: results schema must be one of "
            f"{list(SCHEMAS)}; got {doc.get('schema')!r}"
        )
    return doc


def _split_off(
    table: dict[str, Any], keys: Any, where: str, arrays: dict[str, np.ndarray], dtype: np.dtype
) -> dict[str, Any]:
    """`table` without its array-valued `keys`, which go to `arrays[where/key]` (compact)."""
    out = dict(table)
    for key in keys:
        if key in table and isinstance(table[key], (list, tuple, np.ndarray)):
            value = _compact_array(table[key], dtype)
            if value is not None:
                arrays[SEP.join((where, key))] = value
                del out[key]
    return out


def _compact_array(value: Any, dtype: np.dtype) -> np.ndarray | None:
    """`value` as a compact array: floats as `dtype`, integers as int32 where they fit,
    bools as they are; None for a ragged value (kept inline)."""
    try:
        arr = np.asarray(value)
        if arr.dtype == object:
            arr = np.asarray(value, np.float64)  # None (JSON's NaN) -> NaN
    except (ValueError, TypeError):
        return None
    if arr.dtype.kind == "f":
        return arr.astype(dtype)
    if arr.dtype.kind in "iu" and (arr.size == 0 or np.abs(arr).max() < 2**31):
        return arr.astype(np.int32)
    return arr if arr.dtype.kind in "biu" else None


def _put(doc: dict[str, Any], keys: list[str], value: np.ndarray) -> None:
    """`doc[k0][k1]...[kn] = value`, creating the tables on the way."""
    for k in keys[:-1]:
        doc = doc.setdefault(k, {})
    doc[keys[-1]] = value


def _per_round_scalar(values: Any) -> bool:
    """Whether a record `[R]` holds one number per round (kept inline, every round)."""
    if isinstance(values, np.ndarray):
        return values.ndim <= 1
    return all(v is None or np.ndim(v) == 0 for v in values)


def _array(nested: Any) -> np.ndarray:
    return np.array(nested, dtype=float)  # None (stored for NaN) becomes NaN
