"""The trained models of a job, kept: every slot's final personalised parameters.

`save_models=DIR` (`run`, `runs`, `sweep`; `pfedwn run/sweep --save-models`) writes, when a
method ends for the runs of a program, what each slot of each run is evaluated with
(`Algorithm.eval_params` of the final state) as one orbax step (`state_store`): each process
writes the shards it holds, as for the checkpoint, so nothing is gathered to one host. The
layout:

- `DIR/models.json`: the format, the methods, and per run its labels, config, model (name,
  classes, input shape and dtype), slot -> data client mapping, target slots, and where its
  models are (program, index); `saved` lists the (program, method) pairs written.
- `DIR/p<program>_m<method index>/0/`: the models `[R, S, ...]` of the program's runs
  (padded runs and slots included; `models.json` says which are real).

A resumed job keeps the pairs saved before the interruption (they were written before the
commit that marked the method done); any other job starts the directory afresh (its own files
only). The directory is separate from the checkpoint, so the CLI's removal of its checkpoint
after the results are written leaves the models.

`load_models(DIR)` reads them back as a `SavedModels`: `params(method, run)`, the `model` to
apply them, the slot -> client mapping, the config (so `setup` rebuilds the exact data split)
and `evaluate(method, run)`.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from pfedwn_jax import state_store
from pfedwn_jax.distributed import is_writer
from pfedwn_jax.engine import evaluate
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.setup import setup
from pfedwn_jax.io import atomic_write_json, check_writable_dir
from pfedwn_jax.models import available_models, get_model

log = logging.getLogger("pfedwn_jax")
FORMAT = "pfedwn-models/1"
INDEX = "models.json"
_FILES = re.compile(r"^p\d+_m\d+$")


def _run_entry(exp: Any, labels: dict[str, Any], program: int, index: int) -> dict[str, Any]:
    """What `models.json` says of one run."""
    model = exp.ctx.model
    return {
        "labels": dict(labels),
        "config": exp.config.to_dict(),
        "model": {
            "name": model.name,
            "num_classes": int(model.num_classes),
            "input_shape": [int(s) for s in model.input_shape],
            "input_dtype": str(model.input_dtype),
        },
        "slot_client": np.asarray(exp.federation.data_client).tolist(),
        "is_target": np.asarray(exp.federation.is_target, bool).tolist(),
        "data": exp.data_fingerprint,
        "program": program,
        "index": index,
    }


class ModelSaver:
    """Writes a job's final models into `directory` (see the module docstring).

    `exps`, `labels`: the job's runs; `programs`: the real runs of each program; `methods`:
    the job's methods; `fresh`: a new job (the directory's previous models are removed) or
    a resumed one (the pairs saved before are kept)."""

    def __init__(
        self,
        directory: str | Path,
        exps: Sequence[Any],
        labels: Sequence[dict[str, Any]],
        programs: Sequence[Sequence[int]],
        methods: Sequence[str],
        *,
        fresh: bool,
    ) -> None:
        self.dir = check_writable_dir(directory, "save_models")
        where = {run: (gi, r) for gi, ids in enumerate(programs) for r, run in enumerate(ids)}
        self.index: dict[str, Any] = {
            "format": FORMAT,
            "methods": list(methods),
            "runs": [_run_entry(e, labels[i], *where[i]) for i, e in enumerate(exps)],
            "saved": [],
        }
        if is_writer():
            self.dir.mkdir(parents=True, exist_ok=True)
            if fresh:
                _clear(self.dir)
            else:
                self.index["saved"] = _saved_pairs(self.dir)

    def check_resumed(self, finished: Sequence[Sequence[Any]]) -> None:
        """Warn, naming them, about (program, method) pairs a resumed job finished before
        the interruption whose models were not saved then (the job ran without
        `save_models`): they stay missing."""
        missing = [list(p) for p in finished if list(p) not in self.index["saved"]]
        if missing:
            log.warning(
                "save_models %s: %s finished before the interruption without saving models; "
                "their models are not kept (rerun without resume to keep every method's)",
                self.dir,
                ", ".join(f"{m} (program {g})" for g, m in missing),
            )

    def add(self, block: Any, out: Any) -> None:
        """A sink of the driver (`runner.sinks`): a method's models at its last block."""
        if block.finished:
            self.save(block.gi, block.name, block.params())

    def close(self) -> None:
        pass

    def save(self, program: int, method: str, params: Any) -> None:
        """The final models `[R, S, ...]` of `method` for program `program` (every process
        calls it: the save is a collective); `models.json` then lists the pair."""
        mi = self.index["methods"].index(method)
        state_store.save(self.dir / f"p{program}_m{mi}", 0, params, {"method": method})
        pair = [program, method]
        if pair not in self.index["saved"]:
            self.index["saved"].append(pair)
        if is_writer():
            atomic_write_json(self.dir / INDEX, self.index)


def _clear(directory: Path) -> None:
    """Remove a previous job's models from `directory` (only the files this module writes)."""
    for path in directory.iterdir():
        if path.is_dir() and _FILES.match(path.name):
            shutil.rmtree(path, ignore_errors=True)
    (directory / INDEX).unlink(missing_ok=True)


def _saved_pairs(directory: Path) -> list[list[Any]]:
    """The (program, method) pairs an interrupted job saved (none without `models.json`)."""
    try:
        return list(json.loads((directory / INDEX).read_text())["saved"])
    except (OSError, ValueError, KeyError):
        return []


# --------------------------------------------------------------------------- reading back
class SavedModels:
    """A job's saved models (`load_models`).

    Attributes:
      path: the directory. methods: the methods saved for every run that ran them.
      num_runs: runs of the job (`run()`: 1; a sweep: one per grid point and seed, in the
        order of `SweepResult`'s `run` column; the CLI's cases in their table order).
    """

    def __init__(self, path: Path, index: dict[str, Any]) -> None:
        self.path = path
        self._runs = index["runs"]
        saved = {(int(p), m) for p, m in index["saved"]}
        self._files = {m: i for i, m in enumerate(index["methods"])}
        self.methods = tuple(
            m
            for m in index["methods"]
            if all((r["program"], m) in saved for r in self._runs if _runs_method(r, m))
        )
        self.num_runs = len(self._runs)
        self._cache: dict[tuple[int, str], Any] = {}

    def _run(self, run: int) -> dict[str, Any]:
        if not isinstance(run, int | np.integer) or not 0 <= run < self.num_runs:
            raise ValueError(f"run must be an integer in [0, {self.num_runs}); got {run!r}")
        return self._runs[int(run)]

    def labels(self, run: int = 0) -> dict[str, Any]:
        """The run's labels (`{"seed": 0}`, with a sweep's grid values)."""
        return dict(self._run(run)["labels"])

    def config(self, run: int = 0) -> Any:
        """The run's `ExperimentConfig` (`setup(config)` rebuilds its data and federation)."""

        return ExperimentConfig.from_dict(self._run(run)["config"])

    def slot_client(self, run: int = 0) -> np.ndarray:
        """`[S]` the data client each slot of the run trained and is evaluated on."""
        return np.asarray(self._run(run)["slot_client"], np.int32)

    def is_target(self, run: int = 0) -> np.ndarray:
        """`[S]` bool: the run's slots reported as targets (slot 0 in single-target mode)."""
        return np.asarray(self._run(run)["is_target"], bool)

    def model(self, run: int = 0) -> Any:
        """The engine `Model` that applies the run's parameters (`model.apply(params_s, x)`);
        a model registered by the user's code needs that code imported first."""

        spec = self._run(run)["model"]
        if spec["name"] not in available_models():
            raise ValueError(
                f"model {spec['name']!r} of {self.path} is not registered in this process; "
                f"import the module that registers it first (registered: {available_models()})"
            )
        return get_model(
            spec["name"],
            spec["num_classes"],
            tuple(spec["input_shape"]),
            input_dtype=spec["input_dtype"],
        )

    def params(self, method: str, run: int = 0) -> Any:
        """The run's final personalised models of `method`: a parameter pytree with leading
        axis `[S]` (slot `s`'s model is `jax.tree.map(lambda a: a[s], params)`), numpy."""
        entry = self._run(run)
        if method not in self.methods:
            raise ValueError(
                f"method {method!r} has no saved models in {self.path}; saved: {list(self.methods)}"
            )
        if not _runs_method(entry, method):
            raise ValueError(
                f"run {run} did not run {method!r} (a grid key of another method varies there); "
                f"it ran {list(entry['config']['algorithms'])}"
            )
        program = int(entry["program"])
        stacked = self._program(program, method)
        s, r = len(entry["slot_client"]), int(entry["index"])
        return jax.tree.map(lambda a: np.asarray(a[r, :s]), stacked)

    def _program(self, program: int, method: str) -> Any:
        key = (program, method)
        if key not in self._cache:
            where = self.path / f"p{program}_m{self._files[method]}"
            try:
                tree, _ = state_store.restore(where, state_store.saved_tree(where))
            except Exception as e:  # orbax and tensorstore raise what their readers raise
                text = " ".join(f"{type(e).__name__}: {e}".split())[:200]
                raise ValueError(
                    f"saved models {str(self.path)!r}: the {method!r} models in {str(where)!r} "
                    f"cannot be read (damaged?): {text}"
                ) from None
            self._cache[key] = tree
        return self._cache[key]

    def evaluate(self, method: str, run: int = 0, split: str = "test") -> dict[str, np.ndarray]:
        """Every slot's accuracy and loss `[S]` on its data client's `split` ("test" or
        "val") of the run's data, rebuilt by `setup(config)` (an in-memory dataset must be
        registered again under its name); a ValueError when the data's arrays differ from
        those the run trained on (SHA-256)."""

        if split not in ("test", "val"):
            raise ValueError(f"split must be 'test' or 'val'; got {split!r}")
        exp = setup(self.config(run))
        saved = self._run(run).get("data")
        if saved and exp.data_fingerprint != saved:
            raise ValueError(
                f"run {run}: the data {exp.config.dataset or 'default'!r} changed since the "
                f"models were saved (SHA-256 {saved[:12]}... then, "
                f"{exp.data_fingerprint[:12]}... now)"
            )
        data = exp.test if split == "test" else exp.val
        if data is None:
            raise ValueError(f"run {run} has no validation split (config val_fraction is 0)")
        params = self.params(method, run)
        out = evaluate(self.model(run), params, data, self.slot_client(run))
        return {k: np.asarray(v) for k, v in out.items()}


def load_models(path: str | Path) -> SavedModels:
    """The models a job saved into `path` (`save_models=path`, `--save-models`): see
    `SavedModels`; a run's or sweep's out dir (holding `models/`) is read too. A ValueError
    names a path that holds no saved models."""
    path = Path(path)
    if not (path / INDEX).is_file() and (path / "models" / INDEX).is_file():
        path = path / "models"  # `--out OUT --save-models` writes OUT/models
    index_file = path / INDEX
    if not index_file.is_file():
        hint = " (pfedwn run --save-models writes OUT/models/)" if path.is_dir() else ""
        raise ValueError(f"{path} holds no saved models: no {INDEX}{hint}")
    try:
        index = json.loads(index_file.read_text())
    except ValueError as e:
        raise ValueError(f"{index_file} cannot be read: {e}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        got = index.get("format") if isinstance(index, dict) else type(index).__name__
        raise ValueError(f"{index_file}: format must be {FORMAT!r}; got {got!r}")
    return SavedModels(path, index)


def _runs_method(entry: dict[str, Any], method: str) -> bool:
    """Whether the run of `entry` ran `method` (its config's `algorithms`; empty: all)."""
    algorithms = entry["config"].get("algorithms") or []
    return not algorithms or method in algorithms
