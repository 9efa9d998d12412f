"""Checkpoint directories: resume an interrupted run exactly, at a constant cost per save.

A checkpoint is a directory holding:

- `state/`, numbered orbax steps (`pfedwn_jax.state_store`), the commit points: each holds the
  progress JSON (the step's meta) and the running method's state, every process writing the
  shards it holds (nothing is gathered to one host). A step's number is the rounds done over
  all methods; a step directory that exists is complete (orbax renames its temporary directory
  when every process is done), so a crash during a save leaves the previous step. The latest
  two steps are kept; the state's size does not depend on the round.
- `metrics.jsonl`, append-only (the writer process only, `distributed.is_writer`): one JSON
  line per completed round, `{"method", "round", ...}` (`round` counts from 1). A save appends
  the rounds since the previous save, then starts the step, so a step never refers to a round
  whose line is missing.

The progress JSON must hold `rounds: {method: rounds done}`; `load` keeps, per method, the lines
of rounds `1..rounds[method]` (the last copy of a round wins). Lines past those rounds (written
just before a crash, or before a resume from an earlier save) and a torn last line are ignored.
A directory with a `state.npz` (the single-file state of earlier versions) is refused.

Storage interface: `save(directory, progress, state, rows, writer)`, `load(directory) -> Saved |
None`, `restore_state(directory, template, step)`, `remove(directory)`; `writer(directory)`
makes the saves asynchronous (see `state_store.Writer`). On top of it, what `run` stores:
`run_progress` (the progress JSON of a run) and `read_resume` (what a checkpoint says is done).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pfedwn_jax import state_store
from pfedwn_jax.distributed import is_writer
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.results import entry_header, rebuild_entry, to_jsonable

STATE = "state"
METRICS = "metrics.jsonl"
OLD_STATE = "state.npz"  # earlier versions' single-file state: refused on resume


@dataclasses.dataclass
class Saved:
    """What a checkpoint holds.

    Attributes:
      progress: the progress JSON given to the last complete `save`.
      rows: `method -> [rounds[method]]` metrics rows (dicts), in round order.
      step: the step of `state/` it was read from (`restore_state` reads the state there).
    """

    progress: dict[str, Any]
    rows: dict[str, list[dict[str, Any]]]
    step: int


def corrupt(path: Path, what: str) -> ValueError:
    """The error for a checkpoint (directory or one of its files) that cannot be resumed:
    which file, what is wrong, how to start fresh."""
    directory = path
    while directory.parent != directory and (
        directory.name in (STATE, METRICS, OLD_STATE) or directory.parent.name == STATE
    ):
        directory = directory.parent
    return ValueError(
        f"checkpoint {path}: {what}; to start fresh delete {directory} "
        "or run without resume (no --resume)"
    )


# --------------------------------------------------------------------------- save
def writer(directory: str | Path) -> state_store.Writer:
    """Asynchronous saves for `save(..., writer=)` into checkpoint `directory`; close it (or use
    it in a `with`) to wait for the last one."""
    return state_store.Writer(Path(directory) / STATE)


def step_of(progress: dict[str, Any]) -> int:
    """The step a save of `progress` gets: the rounds done over all methods."""
    return sum(int(n) for n in progress["rounds"].values())


def save(
    directory: str | Path,
    progress: dict[str, Any],
    state: Any | None,
    rows: Iterable[dict[str, Any]] = (),
    writer: state_store.Writer | None = None,
) -> int:
    """Append `rows` to `metrics.jsonl`, then save step `step_of(progress)` of `state/` (the
    state, progress as its meta).

    `writer` (from `writer(directory)`): return once the state is copied to the host and write
    it in the background; None: return when the step is on disk. Every process calls it (each
    writes its shards of the state); only the writer process appends rows. Returns the bytes
    of rows appended (0 in other processes).
    """
    directory = Path(directory)
    written = 0
    if is_writer():
        directory.mkdir(parents=True, exist_ok=True)
        written = append_rows(directory / METRICS, rows)
    step = step_of(progress)
    if writer is None:
        state_store.save(directory / STATE, step, state, progress)
    else:
        writer.save(step, state, progress)
    return written


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
    """Delete a checkpoint's files (`state/`, `metrics.jsonl`, an old `state.npz`), then the
    directory if that leaves it empty (in the writer process only, `distributed.is_writer`)."""
    directory = Path(directory)
    if directory.is_file():
        raise corrupt(directory, "is a file, not a checkpoint directory")
    if not is_writer():
        return
    shutil.rmtree(directory / STATE, ignore_errors=True)
    for name in (METRICS, OLD_STATE):
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()
    with contextlib.suppress(OSError):
        directory.rmdir()


# --------------------------------------------------------------------------- load
def load(directory: str | Path) -> Saved | None:
    """The checkpoint in `directory` (None: nothing saved yet).

    Raises a `ValueError` naming the file and what is wrong when it cannot be resumed (a file
    instead of a directory, an earlier version's `state.npz`, an unreadable or foreign
    progress record, missing metrics lines).
    """
    directory = Path(directory)
    if directory.is_file():
        raise corrupt(
            directory, "is a file, not a checkpoint directory (a single-file checkpoint?)"
        )
    if (directory / OLD_STATE).exists():
        raise corrupt(
            directory / OLD_STATE,
            "is the single-file state of an earlier version, which cannot be resumed",
        )
    try:
        step = state_store.latest(directory / STATE)
    except ValueError as e:
        raise corrupt(directory / STATE, str(e)) from None
    if step is None:
        return None
    progress = read_progress(directory / STATE, step)
    rows = read_rows(directory / METRICS, progress["rounds"])
    return Saved(progress, rows, step)


def read_progress(path: Path, step: int) -> dict[str, Any]:
    """The progress JSON (meta) of `step` in the steps directory `path`; a `ValueError` if it
    is not one of ours."""
    where = path / str(step)
    try:
        _, progress = state_store.restore(path, None, step)
    except Exception as e:  # orbax raises what its readers raise (OSError, ValueError, ...)
        raise corrupt(where, f"cannot be read ({type(e).__name__}: {e})") from None
    rounds = progress.get("rounds") if isinstance(progress, dict) else None
    if not isinstance(rounds, dict) or not all(isinstance(n, int) for n in rounds.values()):
        raise corrupt(where, "has no 'rounds' record in its progress")
    return progress


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


def restore_state(directory: str | Path, template: Any, step: int) -> Any:
    """The state of `step` onto `template`'s structure, shapes, dtypes and shardings (arrays or
    `jax.ShapeDtypeStruct`s); every process reads its shards. A `ValueError` naming the step
    when it cannot be read or does not match."""
    path = Path(directory) / STATE
    try:
        state, _ = state_store.restore(path, template, step)
    except Exception as e:  # orbax raises what its readers raise (OSError, ValueError, ...)
        raise corrupt(path / str(step), f"holds no state for this run ({e})") from None
    return state


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
      restore: `restore(template) -> state`, its state after the last saved round onto the
        template's shardings (`restore_state` of the checkpoint's step).
    """

    done: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    current: str | None = None
    entry: dict[str, Any] | None = None
    restore: Callable[[Any], Any] | None = None


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
        raise corrupt(Path(checkpoint) / STATE / str(saved.step), what) from None
    if current is None:
        return Resume(methods)
    restore = functools.partial(restore_state, checkpoint, step=saved.step)
    return Resume(methods, current, entry, restore)
