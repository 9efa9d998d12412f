"""Checkpoint directories: resume an interrupted run exactly, at a constant cost per save.

A checkpoint is a directory holding two files:

- `state.npz`, the commit point, replaced atomically (`pfedwn_jax.io`) at every save: the
  progress JSON (`progress`) and the leaves of the running method's state (`leaf_00000`, ...).
  Its size does not depend on the round.
- `metrics.jsonl`, append-only: one JSON line per completed round, `{"method", "round", ...}`
  (`round` counts from 1). A save appends the rounds since the previous save, then replaces
  `state.npz`, so the state never refers to a round whose line is missing.

The progress JSON must hold `rounds: {method: rounds done}`; `load` keeps, per method, the lines
of rounds `1..rounds[method]` (the last copy of a round wins). Lines past those rounds (written
just before a crash, or before a resume from an earlier save) and a torn last line are ignored.

Storage interface: `save(directory, progress, state, rows)`, `load(directory) -> Saved | None`,
`restore_state(template, leaves)`, `remove(directory)`; another backend (orbax) only needs to
provide these. On top of it, what `run` stores: `run_progress` (the progress JSON of a run) and
`read_resume` (what a checkpoint says is done).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax.distributed import gather_to_host, is_writer
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.results import entry_header, rebuild_entry, to_jsonable
from pfedwn_jax.io import atomic_write_with

STATE = "state.npz"
METRICS = "metrics.jsonl"
# what np.load / zipfile / json raise on an empty, truncated, foreign or pickled file
_UNREADABLE = (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile)


@dataclasses.dataclass
class Saved:
    """What a checkpoint holds.

    Attributes:
      progress: the progress JSON given to the last `save`.
      rows: `method -> [rounds[method]]` metrics rows (dicts), in round order.
      leaves: the state's leaves (empty when the last save had no state).
    """

    progress: dict[str, Any]
    rows: dict[str, list[dict[str, Any]]]
    leaves: list[np.ndarray]


def corrupt(path: Path, what: str) -> ValueError:
    """The error for a checkpoint (directory or one of its files) that cannot be resumed:
    which file, what is wrong, how to start fresh."""
    directory = path.parent if path.name in (STATE, METRICS) else path
    return ValueError(
        f"checkpoint {path}: {what}; to start fresh delete {directory} "
        "or run without resume (no --resume)"
    )


# --------------------------------------------------------------------------- save
def save(
    directory: str | Path,
    progress: dict[str, Any],
    state: Any | None,
    rows: Iterable[dict[str, Any]] = (),
) -> int:
    """Append `rows` to `metrics.jsonl`, then replace `state.npz` (progress + state leaves).

    Returns the bytes written: the rows plus one state file, independent of the round count.
    Several processes: every process calls it (the state's slots are gathered from all of
    them, a collective); only the writer (`distributed.is_writer`) writes, the others return 0.
    """
    leaves = gather_to_host(jax.tree_util.tree_leaves(state)) if state is not None else []
    if not is_writer():
        return 0
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = append_rows(directory / METRICS, rows)
    arrays = {"progress": np.array(json.dumps(progress))}
    for i, leaf in enumerate(leaves):
        arrays[f"leaf_{i:05d}"] = leaf
    atomic_write_with(directory / STATE, lambda f: np.savez(f, **arrays))
    return written + (directory / STATE).stat().st_size


def append_rows(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    """Append one JSON line per row and fsync; a torn last line is closed first. Bytes written."""
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    if not data:
        return 0
    with path.open("a+b") as f:
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                data = b"\n" + data
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return len(data)


def remove(directory: str | Path) -> None:
    """Delete a checkpoint's files, then the directory if that leaves it empty (in the writer
    process only, `distributed.is_writer`)."""
    directory = Path(directory)
    if directory.is_file():
        raise corrupt(directory, "is a file, not a checkpoint directory")
    if not is_writer():
        return
    for name in (STATE, METRICS):
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()
    with contextlib.suppress(OSError):
        directory.rmdir()


# --------------------------------------------------------------------------- load
def load(directory: str | Path) -> Saved | None:
    """The checkpoint in `directory` (None: nothing saved yet).

    Raises a `ValueError` naming the file and what is wrong when it cannot be resumed (a file
    instead of a directory, an unreadable or foreign `state.npz`, missing metrics lines).
    """
    directory = Path(directory)
    if directory.is_file():
        raise corrupt(
            directory, "is a file, not a checkpoint directory (a single-file checkpoint?)"
        )
    if not (directory / STATE).exists():
        return None
    progress, leaves = read_state(directory / STATE)
    rows = read_rows(directory / METRICS, progress["rounds"])
    return Saved(progress, rows, leaves)


def read_state(path: Path) -> tuple[dict[str, Any], list[np.ndarray]]:
    """`(progress, leaves)` of a `state.npz`; a `ValueError` if it is not one of ours."""
    try:
        entries = _read_npz(path)
    except _UNREADABLE as e:
        raise corrupt(path, f"cannot be read ({type(e).__name__}: {e})") from None
    if entries is None:
        raise corrupt(path, "is a single array, not a checkpoint archive")
    if "progress" not in entries:
        raise corrupt(path, f"has no 'progress' entry (entries: {sorted(entries)[:5]})")
    try:
        progress = json.loads(str(entries.pop("progress")))
    except ValueError as e:
        raise corrupt(path, f"has an unreadable progress record ({e})") from None
    names = sorted(entries)
    if names != [f"leaf_{i:05d}" for i in range(len(names))]:
        raise corrupt(path, f"has entries other than its state arrays ({names[:5]})")
    rounds = progress.get("rounds") if isinstance(progress, dict) else None
    if not isinstance(rounds, dict) or not all(isinstance(n, int) for n in rounds.values()):
        raise corrupt(path, "has no 'rounds' record in its progress")
    return progress, [entries[k] for k in names]


def _read_npz(path: Path) -> dict[str, np.ndarray] | None:
    """Every entry of an `.npz` (None: the file is a single `.npy` array); never unpickles."""
    z = np.load(path, allow_pickle=False)
    if not isinstance(z, np.lib.npyio.NpzFile):
        return None
    with z:
        return {k: z[k] for k in z.files}


def read_rows(path: Path, rounds: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
    """Rows `1..rounds[method]` of every method from `metrics.jsonl` (the last copy wins)."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        text = path.read_text() if path.exists() else ""
    except (OSError, UnicodeDecodeError) as e:
        raise corrupt(path, f"cannot be read ({type(e).__name__}: {e})") from None
    for line in text.splitlines():
        try:
            row = json.loads(line)
            key = (row["method"], row["round"])
        except (ValueError, TypeError, KeyError):
            continue  # a torn line (crash while appending)
        if key[0] in rounds and 1 <= key[1] <= rounds[key[0]]:
            found[key] = row
    out = {}
    for method, n in rounds.items():
        missing = [r for r in range(1, n + 1) if (method, r) not in found]
        if missing:
            raise corrupt(path, f"lacks {method!r} round(s) {missing[:5]} of its {n} saved")
        out[method] = [found[method, r] for r in range(1, n + 1)]
    return out


def restore_state(template: Any, leaves: list[np.ndarray]) -> Any:
    """`template`'s structure with the checkpoint's leaves (shapes and dtypes checked)."""
    flat, treedef = jax.tree_util.tree_flatten(template)
    if len(flat) != len(leaves):
        raise ValueError(f"checkpoint state has {len(leaves)} arrays, expected {len(flat)}")
    out = []
    for t, leaf in zip(flat, leaves, strict=True):
        if tuple(t.shape) != tuple(leaf.shape) or jnp.dtype(t.dtype) != leaf.dtype:
            raise ValueError(
                f"checkpoint state array {leaf.shape} {leaf.dtype} does not match "
                f"{tuple(t.shape)} {t.dtype}"
            )
        out.append(jnp.asarray(leaf))
    return jax.tree_util.tree_unflatten(treedef, out)


# --------------------------------------------------------------------------- a run's progress
def run_progress(
    config: ExperimentConfig,
    done: dict[str, dict[str, Any]],
    current: str | None = None,
    entry: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The progress JSON of `run`: config, every method's `entry_header` and rounds done.

    `done` are the finished methods' entries; `current` (with `entry`) is the running one,
    whose state the same save holds.
    """
    methods = {**done, current: entry} if current is not None else dict(done)
    return to_jsonable(
        {
            "config": config.to_dict(),
            "methods": {name: entry_header(e) for name, e in methods.items()},
            "rounds": {name: len(e["target_accuracy"]) for name, e in methods.items()},
            "current": current,
        }
    )


@dataclasses.dataclass
class Resume:
    """What a checkpoint says is done.

    Attributes:
      done: finished methods' entries, by name.
      current: the method that was running (None: none).
      entry: its entry so far.
      leaves: its state's leaves after the last saved round.
    """

    done: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    current: str | None = None
    entry: dict[str, Any] | None = None
    leaves: list[np.ndarray] | None = None


def read_resume(checkpoint: str | Path | None, config: ExperimentConfig) -> Resume:
    """The progress in `checkpoint` (nothing done if there is none); it must be `config`'s."""
    saved = load(checkpoint) if checkpoint is not None else None
    if saved is None:
        return Resume()
    progress = saved.progress
    if progress.get("config") != to_jsonable(config.to_dict()):
        raise corrupt(Path(checkpoint), "was written for a different config")
    try:
        methods = {
            name: rebuild_entry(head, saved.rows[name])
            for name, head in progress["methods"].items()
        }
        current = progress["current"]
        entry = methods.pop(current) if current is not None else None
    except (KeyError, TypeError, AttributeError) as e:
        what = f"has an incomplete progress record ({e!r})"
        raise corrupt(Path(checkpoint) / STATE, what) from None
    if current is None:
        return Resume(methods)
    return Resume(methods, current, entry, saved.leaves)
