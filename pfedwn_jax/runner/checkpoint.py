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
- `.lock`: held while a process writes the checkpoint, so two runs cannot write one directory.

An existing checkpoint is never deleted without `overwrite=True` (`--overwrite`); a resume
needs the same runs (configs, the data's content, devices on the run axis) and falls back to
the previous step when the newest one cannot be read, saying which.
"""

from __future__ import annotations

import contextlib
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
from pfedwn_jax.io import atomic_write_with, check_writable_dir

log = logging.getLogger("pfedwn_jax")
FORMAT = "pfedwn-checkpoint/2"
STATE, BLOCKS, LOCK = "state", "blocks", ".lock"
#: Files of earlier versions' checkpoints (refused: their layout cannot be resumed).
OLD_FILES = ("metrics.jsonl", "rows.jsonl", "state.npz")
MODES = ("new", "resume", "overwrite")


def fingerprint(runs: Sequence[dict[str, Any]], extra: dict[str, Any]) -> str:
    """What a resumed job must share with the interrupted one: every run's config and data
    fingerprint, and `extra` (records kept, devices on the run axis)."""
    text = json.dumps({"runs": list(runs), **extra}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


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
    there is one) or "overwrite" (deletes one first). Use it as a context manager: it holds the
    lock and, on exit, waits for the last asynchronous save.
    """

    def __init__(self, directory: str | Path, fp: str, mode: str = "new") -> None:
        if mode not in MODES:
            raise ValueError(f"checkpoint mode must be one of {list(MODES)}; got {mode!r}")
        self.dir = check_writable_dir(directory, "checkpoint")
        self.fp, self.mode = fp, mode
        self.saved: Saved | None = None
        self.step = 0
        self._lock: Any = None
        self._writer: state_store.Writer | None = None

    # ------------------------------------------------------------------ open / close
    def __enter__(self) -> Checkpoint:
        if is_writer():
            self.dir.mkdir(parents=True, exist_ok=True)
            self._take_lock()
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
        finally:
            self._release()

    def _take_lock(self) -> None:
        f = (self.dir / LOCK).open("a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise ValueError(
                f"checkpoint {self.dir} is in use by another process; wait for it to end or "
                "choose another output directory"
            ) from None
        self._lock = f

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def exists(self) -> bool:
        """Whether the directory holds a checkpoint (of any version)."""
        if any((self.dir / name).exists() for name in OLD_FILES):
            return True
        blocks = self.dir / BLOCKS
        return state_store.latest(self.dir / STATE) is not None or (
            blocks.is_dir() and any(blocks.iterdir())
        )

    def _open(self) -> None:
        if not self.exists():
            return
        if self.mode == "new":
            raise ValueError(
                f"checkpoint {self.dir} holds an interrupted run: pass resume=True (--resume) "
                "to continue it, or overwrite=True (--overwrite) to discard it"
            )
        if self.mode == "overwrite":
            self.remove()
            return
        old = [name for name in OLD_FILES if (self.dir / name).exists()]
        if old:
            raise _error(self.dir, f"was written by an earlier version ({old[0]})")
        self.saved = self._newest_readable(None)
        if self.saved is not None:
            self.step = self.saved.step

    def _newest_readable(self, below: int | None) -> Saved | None:
        """The newest step (below `below`) whose meta reads and is this job's."""
        steps = sorted(self._steps(), reverse=True)
        for step in steps:
            if below is not None and step >= below:
                continue
            try:
                _, meta = state_store.restore(self.dir / STATE, None, step)
            except Exception as e:  # orbax raises what its readers raise
                log.warning("checkpoint %s: step %d cannot be read (%s)", self.dir, step, _short(e))
                continue
            if meta.get("fingerprint") != self.fp:
                raise _error(
                    self.dir, "was written for a different config, data or number of devices"
                )
            return Saved(step, meta)
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
                state, _ = state_store.restore(self.dir / STATE, template, self.saved.step)
                return state
            except Exception as e:
                bad = self.saved.step
                self.saved = self._newest_readable(bad)
                where = f"step {self.saved.step}" if self.saved else "the start"
                log.warning(
                    "checkpoint %s: step %d cannot be restored (%s); resuming from %s",
                    self.dir,
                    bad,
                    _short(e),
                    where,
                )
        return None

    def blocks(self) -> Iterator[tuple[list, dict[str, np.ndarray]]]:
        """The committed blocks of the readable step: `(entry, arrays)` in order."""
        if self.saved is None:
            return
        for entry in self.saved.meta["progress"]["blocks"]:
            path = self.dir / BLOCKS / _block_name(entry)
            try:
                with np.load(path, allow_pickle=False) as f:
                    arrays = {k: f[k] for k in f.files}
            except (OSError, ValueError) as e:
                raise _error(self.dir, f"block {path.name} cannot be read ({_short(e)})") from None
            yield entry, arrays

    # ------------------------------------------------------------------ save
    def write_block(self, entry: list, arrays: dict[str, np.ndarray]) -> None:
        """Write one block's host outputs (`entry` = [program, method, start, n, seconds])."""
        if not is_writer():
            return
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        (self.dir / BLOCKS).mkdir(exist_ok=True)
        atomic_write_with(self.dir / BLOCKS / _block_name(entry), lambda f: f.write(buf.getvalue()))

    def commit(self, meta: dict[str, Any], state: Any) -> None:
        """A new step: `meta` (with the fingerprint added) and `state` (None when no method
        is in progress), saved asynchronously."""
        self.step += 1
        assert self._writer is not None, "use the checkpoint as a context manager"
        self._writer.save(self.step, state, {**meta, "fingerprint": self.fp, "format": FORMAT})

    def remove(self) -> None:
        """Delete the checkpoint's files (in the writer process), keeping the directory."""
        if not is_writer():
            return
        shutil.rmtree(self.dir / STATE, ignore_errors=True)
        shutil.rmtree(self.dir / BLOCKS, ignore_errors=True)
        for name in OLD_FILES:
            with contextlib.suppress(FileNotFoundError):
                (self.dir / name).unlink()


def _block_name(entry: Sequence[Any]) -> str:
    program, method, start, n = entry[:4]
    return f"{int(program)}.{method}.{int(start)}.{int(n)}.npz"


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
    for name in (*OLD_FILES, LOCK):
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()
    with contextlib.suppress(OSError):
        os.rmdir(directory)
