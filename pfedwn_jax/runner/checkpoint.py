"""Checkpoints of runs and sweeps: resume exactly, never lose or silently discard work.

A checkpoint directory holds:

- `state/`: numbered orbax steps (`pfedwn_jax.state_store`), the commit points. Each holds the
  state of the (program, method) in progress, every process writing its own shards, and a
  JSON meta: the fingerprint of the runs, the programs (which runs each one stacks) and the
  progress (finished (program, method) pairs, the current one and its rounds, the committed
  blocks). A step directory that exists is complete (orbax renames it at the end), so a crash
  during a save leaves the previous step; the latest two are kept.
- `blocks/`: one `.npz` per block of rounds (the program's host outputs: per-slot metrics and
  kept records of the block's real runs, and its seconds), written atomically before the step
  that lists it; on resume the listed blocks are replayed into the table.
- `job.json`: what the fingerprint is a hash of (every run's config and data SHA-256, the
  records kept, the devices on the run axis), written at the job's first commit, so that a
  refused resume can say what changed.
- `.lock`: held while a process writes the checkpoint, so two runs cannot write one directory.

An existing checkpoint is never deleted without `overwrite=True` (`--overwrite`); a resume
needs the same runs (configs, the data's content, devices on the run axis), and a refusal
names what differs (the dataset whose arrays changed, the config fields). When the newest step
cannot be read, a resume falls back to the previous one, saying in one line which step it
skipped and which it resumes from (orbax's own log lines about the damaged step are dropped),
and removes the unreadable step, which the resumed job would write again anyway.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import hashlib
import io
import json
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pfedwn_jax import state_store
from pfedwn_jax.distributed import is_writer
from pfedwn_jax.io import (
    atomic_write_json,
    atomic_write_with,
    check_writable_dir,
    read_npz,
    write_npz,
)

log = logging.getLogger("pfedwn_jax")
FORMAT = "pfedwn-checkpoint/2"
STATE, BLOCKS, LOCK, JOB = "state", "blocks", ".lock", "job.json"
#: Files of earlier versions' checkpoints (refused: their layout cannot be resumed).
OLD_FILES = ("metrics.jsonl", "rows.jsonl", "state.npz")
MODES = ("new", "resume", "overwrite")


def fingerprint(runs: Sequence[dict[str, Any]], extra: dict[str, Any]) -> str:
    """What a resumed job must share with the interrupted one: every run's config and data
    fingerprint, and `extra` (records kept, devices on the run axis)."""
    return hashlib.sha256(json.dumps(job_of(runs, extra), sort_keys=True).encode()).hexdigest()


def job_of(runs: Sequence[dict[str, Any]], extra: dict[str, Any]) -> dict[str, Any]:
    """The description `fingerprint` hashes, as JSON reads it back (tuples as lists)."""
    return json.loads(json.dumps({"runs": list(runs), **extra}, default=str))


#: How `describe_change` names the job-wide entries of a fingerprint.
EXTRA_NAMES = {"records": "records kept", "mesh_runs": "devices on the run axis"}
SHOWN = 4  # differences named in a refusal at most


def describe_change(old: Any, new: dict[str, Any]) -> str:
    """What differs between the job a checkpoint was written for (`old`, its `job.json`) and
    this one (`new`, `job_of`): changed data by dataset with their SHA-256 prefixes, config
    fields with both values, run counts, records and devices; a general phrase when `old` is
    unknown."""
    general = "was written for a different config, data or number of devices"
    if not isinstance(old, dict) or not isinstance(old.get("runs"), list):
        return general
    parts = [
        f"{EXTRA_NAMES.get(key, key)}: {old.get(key)!r} then, {new.get(key)!r} now"
        for key in sorted((set(old) | set(new)) - {"runs"})
        if old.get(key) != new.get(key)
    ]
    a, b = old["runs"], new["runs"]
    if len(a) != len(b):
        parts.append(f"it holds {len(a)} run(s), this job {len(b)}")
    data: dict[tuple, list[int]] = {}
    fields: dict[tuple, list[int]] = {}
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if not isinstance(x, dict) or not isinstance(x.get("config"), dict):
            return general
        cx, cy = x["config"], y["config"]
        if x.get("data") != y.get("data"):
            name = cy.get("dataset") or "the default dataset"
            data.setdefault((name, str(x.get("data"))[:12], str(y.get("data"))[:12]), []).append(i)
        for key in sorted(set(cx) | set(cy)):
            if cx.get(key) != cy.get(key):
                fields.setdefault((key, repr(cx.get(key)), repr(cy.get(key))), []).append(i)
    parts += [
        f"the data {name} changed since it was written{_runs(ids, len(b))}: SHA-256 of its "
        f"arrays {was}... then, {now}... now"
        for (name, was, now), ids in data.items()
    ]
    parts += [
        f"{key} {was} then, {now} now{_runs(ids, len(b))}"
        for (key, was, now), ids in fields.items()
    ]
    if not parts:
        return general
    more = f" (and {len(parts) - SHOWN} more difference(s))" if len(parts) > SHOWN else ""
    return "was written for another job: " + "; ".join(parts[:SHOWN]) + more


def _runs(ids: list[int], total: int) -> str:
    """Which of `total` runs: `` (the only one), ` (run 3)`, ` (runs 0, 1, 2)`, ` (every run)`."""
    if total <= 1:
        return ""
    if len(ids) == total:
        return " (every run)"
    if len(ids) == 1:
        return f" (run {ids[0]})"
    shown = ", ".join(map(str, ids[:5]))
    return f" (runs {shown}" + (f" and {len(ids) - 5} more)" if len(ids) > 5 else ")")


@dataclasses.dataclass
class Saved:
    """A readable step: its number and meta (`programs`, `progress`, `compile_s`)."""

    step: int
    meta: dict[str, Any]


def _error(directory: Path, what: str) -> ValueError:
    return ValueError(
        f"checkpoint {directory}: {what}; resume with the same settings, "
        "or pass overwrite=True (--overwrite) to discard it"
    )


class Checkpoint:
    """The checkpoint directory of one job (see the module docstring).

    `mode`: "new" (refuses a directory that holds a checkpoint), "resume" (continues one if
    there is one) or "overwrite" (deletes one first). `job`: what `fp` is the hash of
    (`job_of`), written to `job.json` to name the difference when a resume is refused. Use it
    as a context manager: it holds the lock and, on exit, waits for the last asynchronous save.
    """

    def __init__(
        self, directory: str | Path, fp: str, mode: str = "new", job: dict | None = None
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"checkpoint mode must be one of {list(MODES)}; got {mode!r}")
        self.dir = check_writable_dir(directory, "checkpoint")
        self.fp, self.mode, self.job = fp, mode, job
        self._job_written = False
        self.saved: Saved | None = None
        self.step = 0
        self._lock: Any = None
        self._writer: state_store.Writer | None = None

    # ------------------------------------------------------------------ open / close
    def __enter__(self) -> Checkpoint:
        if is_writer():
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock = _lock(self.dir)
        try:
            self._open()
        except BaseException:
            self._release()
            raise
        self._writer = state_store.Writer(self.dir / STATE)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
        except Exception:
            if exc[1] is None:  # else the error in flight is the one to report
                raise
        finally:
            self._release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def exists(self) -> bool:
        """Whether the directory holds a checkpoint (of any version)."""
        return holds_checkpoint(self.dir)

    def _open(self) -> None:
        with _OrbaxSilenced():
            self._open_quietly()

    def _open_quietly(self) -> None:
        if not self.exists():
            return
        if self.mode == "new":
            raise _interrupted(self.dir)
        if self.mode == "overwrite":
            self.remove()
            return
        old = [name for name in OLD_FILES if (self.dir / name).exists()]
        if old:
            raise _error(self.dir, f"was written by an earlier version ({old[0]})")
        self.saved = self._fall_back(None, [])
        if self.saved is not None:
            self.step = self.saved.step

    def _newest_readable(self, below: int | None, skipped: list[str]) -> Saved | None:
        """The newest step (below `below`) whose meta reads and is this job's; each step
        that cannot be read is appended to `skipped` (what failed)."""
        for step in sorted(self._steps(), reverse=True):
            if below is not None and step >= below:
                continue
            try:
                _, meta = state_store.restore(self.dir / STATE, None, step)
            except Exception as e:  # orbax raises what its readers raise
                skipped.append(f"step {step} cannot be read ({_short(e)})")
                continue
            if meta.get("fingerprint") != self.fp:
                raise _error(self.dir, describe_change(self._saved_job(), self.job or {}))
            return Saved(step, meta)
        return None

    def _fall_back(self, below: int | None, skipped: list[str]) -> Saved | None:
        """`_newest_readable`; when steps were skipped, one warning naming them and the step
        resumed from, and the skipped steps removed (the resumed job writes them again)."""
        saved = self._newest_readable(below, skipped)
        if skipped:
            where = f"step {saved.step}" if saved is not None else "the start"
            log.warning("checkpoint %s: %s; resuming from %s", self.dir, "; ".join(skipped), where)
            if is_writer():
                for step in self._steps():
                    if saved is None or step > saved.step:
                        shutil.rmtree(self.dir / STATE / str(step), ignore_errors=True)
        return saved

    def _saved_job(self) -> Any:
        """The `job.json` of the checkpoint (None when missing or unreadable)."""
        try:
            return json.loads((self.dir / JOB).read_text())
        except (OSError, ValueError):
            return None

    def _steps(self) -> list[int]:
        path = self.dir / STATE
        if not path.is_dir():
            return []
        return [int(p.name) for p in path.iterdir() if p.name.isdigit()]

    # ------------------------------------------------------------------ resume
    def restore(self, template: Any) -> Any:
        """The saved state of the current (program, method) onto `template`'s shapes and
        shardings; falls back to older steps (with a warning naming them) when the newest
        cannot be read. `self.saved` then names the step the state came from."""
        while self.saved is not None:
            try:
                with _OrbaxSilenced():
                    state, _ = state_store.restore(self.dir / STATE, template, self.saved.step)
                return state
            except Exception as e:
                skipped = [f"step {self.saved.step} cannot be restored ({_short(e)})"]
                with _OrbaxSilenced():
                    self.saved = self._fall_back(self.saved.step, skipped)
                if self.saved is not None:
                    self.step = self.saved.step
        return None

    def blocks(self) -> Iterator[tuple[list, dict[str, np.ndarray]]]:
        """The committed blocks of the readable step: `(entry, arrays)` in order."""
        if self.saved is None:
            return
        for entry in self.saved.meta["progress"]["blocks"]:
            path = self.dir / BLOCKS / _block_name(entry)
            try:
                arrays = read_npz(path, "block file")
            except (OSError, ValueError) as e:
                raise _error(self.dir, f"block {path.name} cannot be read ({_short(e)})") from None
            yield entry, arrays

    # ------------------------------------------------------------------ save
    def write_block(self, entry: list, arrays: dict[str, np.ndarray]) -> None:
        """Write one block's host outputs (`entry` = [program, method, start, n, seconds])."""
        if not is_writer():
            return
        buf = io.BytesIO()
        write_npz(buf, arrays)
        (self.dir / BLOCKS).mkdir(exist_ok=True)
        atomic_write_with(self.dir / BLOCKS / _block_name(entry), lambda f: f.write(buf.getvalue()))

    def commit(self, meta: dict[str, Any], state: Any) -> None:
        """A new step: `meta` (with the fingerprint added) and `state` (None when no method
        is in progress), saved asynchronously. `meta` is copied now: the driver goes on
        appending to its lists (blocks) while the step is written."""
        meta = copy.deepcopy(meta)
        self.step += 1
        assert self._writer is not None, "use the checkpoint as a context manager"
        if self.job is not None and not self._job_written and is_writer():
            atomic_write_json(self.dir / JOB, self.job)
            self._job_written = True
        self._writer.save(self.step, state, {**meta, "fingerprint": self.fp, "format": FORMAT})

    def wait(self) -> None:
        """Return when every step committed so far is complete on disk."""
        if self._writer is not None:
            self._writer.wait()

    def remove(self) -> None:
        """Delete the checkpoint's files (in the writer process), keeping the directory."""
        if not is_writer():
            return
        shutil.rmtree(self.dir / STATE, ignore_errors=True)
        shutil.rmtree(self.dir / BLOCKS, ignore_errors=True)
        for name in (*OLD_FILES, JOB):
            with contextlib.suppress(FileNotFoundError):
                (self.dir / name).unlink()


def check_available(directory: str | Path, mode: str = "new") -> None:
    """Before any work: `ValueError` when another process holds the checkpoint in `directory`,
    or (`mode` "new") when it holds an interrupted job. `Checkpoint` checks both again when
    it opens; this only makes a refusal come before the job's set-up. Creates nothing."""
    directory = Path(directory)
    if not is_writer() or not directory.is_dir():
        return
    if (directory / LOCK).is_file():
        _lock(directory).close()
    if mode == "new" and holds_checkpoint(directory):
        raise _interrupted(directory)


def holds_checkpoint(directory: Path) -> bool:
    """Whether `directory` holds a checkpoint (of any version). Orbax's lines about a step it
    cannot read are dropped: the reading of the checkpoint reports that step once."""
    if any((directory / name).exists() for name in OLD_FILES):
        return True
    blocks = directory / BLOCKS
    with _OrbaxSilenced():
        newest = state_store.latest(directory / STATE)
    return newest is not None or (blocks.is_dir() and any(blocks.iterdir()))


def _lock(directory: Path) -> Any:
    """The open, exclusively locked `.lock` file of `directory`; `ValueError` when another
    process holds it."""
    f = (directory / LOCK).open("a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise ValueError(
            f"checkpoint {directory} is in use by another process (it holds {directory / LOCK}); "
            "wait for it to end or choose another output directory"
        ) from None
    return f


def _interrupted(directory: Path) -> ValueError:
    return ValueError(
        f"checkpoint {directory} holds an interrupted run: pass resume=True (--resume) to "
        "continue it, or overwrite=True (--overwrite) to discard it"
    )


def _block_name(entry: Sequence[Any]) -> str:
    program, method, start, n = entry[:4]
    return f"{int(program)}.{method}.{int(start)}.{int(n)}.npz"


class _OrbaxSilenced(logging.Filter):
    """While reading a checkpoint: drops orbax's (absl's) log lines. A step it cannot read is
    reported once, by the caller, naming the step; orbax logs the same failure several times
    (a JSON file's whole content each time)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return False

    def __enter__(self) -> None:
        logging.getLogger("absl").addFilter(self)

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("absl").removeFilter(self)


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".splitlines()[0]
    return text if len(text) <= 200 else text[:197] + "..."


def remove(directory: str | Path) -> None:
    """Delete the checkpoint in `directory` (its files, then the directory if empty)."""
    directory = Path(directory)
    if not directory.is_dir() or not is_writer():
        return
    shutil.rmtree(directory / STATE, ignore_errors=True)
    shutil.rmtree(directory / BLOCKS, ignore_errors=True)
    for name in (*OLD_FILES, JOB, LOCK):
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()
    with contextlib.suppress(OSError):
        os.rmdir(directory)
