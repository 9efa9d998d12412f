"""Numbered checkpoints of a (possibly sharded, multi-process) pytree plus a progress JSON.

`save(directory, step, tree, meta)` writes `directory/<step>/` with orbax-checkpoint: `state/`
(the arrays; each process writes the shards it holds, so nothing is gathered to one host) and
`meta/` (the JSON). Orbax writes into a temporary `<step>.orbax-checkpoint-tmp-*` directory and
renames it when every process is done, so a step directory that exists is complete: a crash
during a save leaves the previous step as `latest`. The latest `KEEP` steps are kept.

`Writer(directory).save(step, tree, meta)` does the same asynchronously: it returns once the
arrays are copied to the host and writes them in the background (the next save, `wait` or
`close` waits for it); the same atomic rename keeps it crash-safe.

`restore(directory, template)` reads a step back onto the shardings of `template` (arrays or
`jax.ShapeDtypeStruct`s with `.sharding`), so a state saved from one mesh can be restored onto
another. Shapes, dtypes and structure are checked against the template first (orbax itself
would silently return the saved shape). Every process must call `save` and `restore` (they
are collectives); `latest` only reads the directory.

Orbax logs through absl; the lines that report normal operation as warnings or errors (a
killed save's temporary directory being cleaned up on the next save, a wait interrupted by
Ctrl-C) are dropped (`BenignOrbaxLines`), every other line shows. A full disk is one
`io.DiskFullError` from `save`, `Writer` and its `wait`/`close` (orbax's logged tracebacks of
it are dropped, the caller reports it once), and the unfinished step's temporary directory
is removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from pfedwn_jax._checks import check_int
from pfedwn_jax.io import DiskFullError, disk_full_error, is_disk_full

KEEP = 2
STATE = "state"
META = "meta"


# the step metadata file of a save in progress (inside its temporary directory)
_TMP_METADATA = r"\S*\.orbax-checkpoint-tmp[^/]*/_CHECKPOINT_METADATA"


class BenignOrbaxLines(logging.Filter):
    """Drops orbax's log records that describe normal operation, keeps the rest.

    Dropped: warnings matching `BENIGN` and errors matching `BENIGN_ERRORS`, and records
    whose exception is a `KeyboardInterrupt` (orbax logs a Ctrl-C during a wait as a failed
    save; the interrupt itself is reported by the caller). Benign: a killed save's unfinished
    temporary directory, removed by the next save of that step (the crash-safety design at
    work); and a save in progress finding its own step metadata file missing or empty when it
    adds the commit time to it at the end (a race inside orbax, seen about once in ten runs
    on a loaded machine: orbax then writes the file anew, the step is complete). Errors with
    any other cause and every other warning pass.
    """

    BENIGN = (
        re.compile(
            r"^Attempted to create temporary directory .* which already exists\. "
            r"Removing existing directory since it is not finalized\."
        ),
        re.compile(rf"^Metadata file does not exist: {_TMP_METADATA}$"),
    )
    BENIGN_ERRORS = (
        re.compile(rf"^Failed to json parse Metadata file: {_TMP_METADATA}, file content: , "),
    )

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, KeyboardInterrupt) or is_disk_full(exc):
            return False  # reported once by the caller
        benign = {logging.WARNING: self.BENIGN, logging.ERROR: self.BENIGN_ERRORS}
        patterns = benign.get(record.levelno, ())
        message = record.getMessage()
        if record.levelno >= logging.ERROR and is_disk_full(Exception(message)):
            return False
        return not any(p.search(message) for p in patterns)


def _quiet_orbax() -> None:
    """Install `BenignOrbaxLines` on absl's logger (once)."""
    logger = logging.getLogger("absl")
    if not any(isinstance(f, BenignOrbaxLines) for f in logger.filters):
        logger.addFilter(BenignOrbaxLines())


_quiet_orbax()


def _drop_closed_loop_callbacks(previous: Any) -> Any:
    """An unraisable-exception hook that drops tensorstore's late read callbacks into orbax's
    closed event loop and hands every other exception to `previous`.

    When one read of a damaged step fails, orbax stops waiting and closes its asyncio loop;
    the other reads of the step finish later and their callbacks (`call_soon_threadsafe`)
    find the loop closed. Python prints each as a bare `RuntimeError: Event loop is closed`
    traceback, after the failure was already reported (`Checkpoint.restore`,
    `DiskFullError`)."""

    def hook(unraisable: Any) -> None:
        exc = unraisable.exc_value
        tb = unraisable.exc_traceback
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        closed = (
            isinstance(exc, RuntimeError)
            and str(exc) == "Event loop is closed"
            and tb is not None
            and tb.tb_frame.f_code.co_name == "_check_closed"
        )
        if not closed:
            previous(unraisable)

    hook.pfedwn_closed_loop = True  # type: ignore[attr-defined]
    return hook


if not getattr(sys.unraisablehook, "pfedwn_closed_loop", False):
    sys.unraisablehook = _drop_closed_loop_callbacks(sys.unraisablehook)


#: The `Writer`s of this process: each may have a save still being written.
_WRITERS: weakref.WeakSet[Writer] = weakref.WeakSet()


def _finish_writes() -> None:
    """Wait for every `Writer`'s save in flight. Orbax's managers share their barrier names
    across processes (`ThreadSaveMultiHostValueHolder:set_value_start`, ...): a manager
    starting a save while another's background thread waits at the same barrier fails there
    ("already ongoing") in one process and leaves the other at its next barrier until the
    coordination service ends both. So one manager works at a time."""
    for writer in list(_WRITERS):
        writer.wait()


def _manager(
    directory: str | Path, create: bool = True, asynchronous: bool = False
) -> ocp.CheckpointManager:
    """A fresh orbax manager (after the saves in flight, `_finish_writes`) of `directory` keeping
    the latest `KEEP` steps (`asynchronous`: a save returns once the arrays are copied to the host
    and is written by a background thread, and older steps are deleted by another: removing a step's
    ~20 files took ~25 ms a save). With several processes old steps are deleted in the foreground: a
    background deletion by the primary process raced the other processes' scans of the directory (a
    step listed whose metadata was already gone ended a two-process resume)."""
    _finish_writes()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=KEEP,
        enable_async_checkpointing=asynchronous,
        enable_background_delete=asynchronous and jax.process_count() == 1,
        create=create,
    )
    handlers = {STATE: ocp.StandardCheckpointHandler(), META: ocp.JsonCheckpointHandler()}
    return ocp.CheckpointManager(
        Path(directory).absolute(), options=options, item_handlers=handlers
    )


def _check_directory(directory: str | Path) -> Path:
    """`directory` as a Path; `ValueError` when it is a file."""
    path = Path(directory)
    if path.is_file():
        raise ValueError(f"checkpoint directory {path} is a file, not a directory")
    return path


# --------------------------------------------------------------------------- save
@contextlib.contextmanager
def _disk_full_named(directory: Path) -> Iterator[None]:
    """A full disk met inside becomes one `DiskFullError` naming `directory`, after the
    unfinished steps' temporary directories there are removed (no save is running then: orbax
    reports a failed save once it has stopped)."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as e:
        if not is_disk_full(e):
            raise
        if jax.process_index() == 0:
            _remove_temporaries(directory)
        raise disk_full_error(directory) from None


def _remove_temporaries(directory: Path, tries: int = 20, pause_s: float = 0.05) -> None:
    """Remove the `*.orbax-checkpoint-tmp*` directories of failed saves in `directory`.
    Orbax reports the first failed write while tensorstore may still finish others (which
    create their directories again), so this repeats until none has reappeared."""
    for _ in range(tries):
        temporaries = list(directory.glob("*.orbax-checkpoint-tmp*"))
        if not temporaries:
            return
        for tmp in temporaries:
            shutil.rmtree(tmp, ignore_errors=True)
        time.sleep(pause_s)


def _check_meta(meta: Any) -> None:
    """`ValueError` unless `meta` is a JSON object."""
    if not isinstance(meta, dict):
        raise ValueError(f"meta must be a dict (a JSON object); got {type(meta).__name__}")
    try:
        json.dumps(meta, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"meta must be JSON-serialisable: {e}") from None


def _save(manager: ocp.CheckpointManager, where: Path, step: int, tree: Any, meta: dict) -> None:
    """Start saving `step` with `manager` (whose previous save has finished)."""
    step = check_int("step", step, 0)
    _check_meta(meta)
    items = {META: ocp.args.JsonSave(meta)}
    if tree is not None:
        items[STATE] = ocp.args.StandardSave(tree)
    last = manager.latest_step()
    if last is not None and step < last:
        raise ValueError(f"step must be >= the latest saved step {last}; got {step}")
    if step == last:
        manager.delete(step)  # `KEEP` >= 2: the step before it survives a crash here
    if not manager.save(step, args=ocp.args.Composite(**items)):
        raise RuntimeError(f"orbax did not save step {step} in {where}")


def save(directory: str | Path, step: int, tree: Any, meta: dict[str, Any]) -> None:
    """Write `tree` (a pytree of arrays, or None) and `meta` (a JSON object) as `step`.

    Steps must not decrease: saving the latest step again replaces it, an earlier one raises
    a `ValueError`. Returns when the step is complete on disk; then only the latest `KEEP`
    steps remain.
    """
    directory = _check_directory(directory)
    with _disk_full_named(directory), _manager(directory) as manager:
        _save(manager, directory, step, tree, meta)
        manager.wait_until_finished()


class Writer:
    """Asynchronous saves into one directory: `save` returns once the arrays are on the host
    (so the caller may donate or overwrite them) and the step is written in the background.

    Each `save` first waits for the previous one (of every `Writer` of this process, as every other
    orbax manager here does before it starts: `_finish_writes`); `close` (or leaving a `with` block,
    also on an exception) waits for the last. A step directory still appears only when complete
    (orbax renames its temporary directory at the end), so a crash mid-save leaves the previous
    step.
    Every process must make the same calls (collectives).
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = _check_directory(directory)
        self._manager: ocp.CheckpointManager | None = None

    def save(self, step: int, tree: Any, meta: dict[str, Any]) -> None:
        """Like `save(directory, step, tree, meta)`, but returns before the step is written."""
        with _disk_full_named(self.directory):
            _finish_writes()
            if self._manager is None:
                self._manager = _manager(self.directory, asynchronous=True)
                _WRITERS.add(self)
            if step == self._manager.latest_step():  # a replacement must not race the deleter
                self.close()
                save(self.directory, step, tree, meta)
                return
            _save(self._manager, self.directory, step, tree, meta)

    def wait(self) -> None:
        """Return when every save started so far is complete on disk."""
        if self._manager is not None:
            with _disk_full_named(self.directory):
                self._manager.wait_until_finished()

    def close(self) -> None:
        """Wait for the last save, then release orbax's threads."""
        if self._manager is not None:
            manager, self._manager = self._manager, None
            with _disk_full_named(self.directory):
                manager.wait_until_finished()
                manager.close()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- restore
def latest(directory: str | Path) -> int | None:
    """The latest complete step in `directory` (None: no checkpoint, or no directory)."""
    directory = _check_directory(directory)
    if not directory.is_dir():
        return None
    with _manager(directory, create=False) as manager:
        return manager.latest_step()


def _abstract(leaf: Any) -> Any:
    """What orbax restores a template leaf as: a `jax.ShapeDtypeStruct` with a sharding for
    JAX arrays and sharded structs (a struct without one goes to the first local device), a
    numpy array for anything else."""
    if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct):
        sharding = getattr(leaf, "sharding", None) or jax.sharding.SingleDeviceSharding(
            jax.local_devices()[0]
        )
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
    return np.zeros(np.shape(leaf), np.asarray(leaf).dtype)


def _key(entry: Any) -> str:
    """One step of a key path as text: orbax stores named tuples and dataclasses as dicts."""
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def _by_path(tree: Any) -> dict[str, Any]:
    """`{"a/0/b": leaf}` for every leaf of `tree`."""
    return {"/".join(_key(k) for k in path): leaf for path, leaf in jax.tree.leaves_with_path(tree)}


def _tree(metadata: Any) -> Any:
    """The tree of orbax's item metadata (a `TreeMetadata` in recent orbax, a tree before)."""
    return getattr(metadata, "tree", metadata)


def _check_against(saved: Any, template: Any, where: Path) -> None:
    """`ValueError` unless the saved tree metadata has the template's leaves (by path), shapes
    and dtypes."""
    got, want = _by_path(saved), _by_path(template)
    if set(got) != set(want):
        raise ValueError(
            f"checkpoint {where} does not match the template: saved leaves "
            f"{sorted(got)[:6]}, template leaves {sorted(want)[:6]}"
        )
    for name, w in want.items():
        g = got[name]
        if tuple(g.shape) != tuple(w.shape) or np.dtype(g.dtype) != np.dtype(w.dtype):
            raise ValueError(
                f"checkpoint {where}: leaf {name!r} is {tuple(g.shape)} {np.dtype(g.dtype)}, "
                f"the template wants {tuple(w.shape)} {np.dtype(w.dtype)}"
            )


def restore(directory: str | Path, template: Any, step: int | None = None) -> tuple[Any, dict]:
    """`(tree, meta)` of `step` (default: the latest) in `directory`.

    `template`: a pytree like the saved one, of arrays or `jax.ShapeDtypeStruct`s; JAX leaves
    come back as `jax.Array`s on their `.sharding`, numpy leaves as numpy arrays. `None`:
    read only `meta` (tree None), e.g. to learn what a resume needs before building the
    template. `ValueError` when there is no such step or it does not match the template.
    """
    directory = _check_directory(directory)
    step = latest(directory) if step is None else check_int("step", step, 0)
    if step is None:
        raise ValueError(f"no checkpoint in {directory}")
    with _manager(directory, create=False) as manager:
        if step not in manager.all_steps():
            raise ValueError(f"no step {step} in {directory}; saved: {manager.all_steps()}")
        if template is not None and not (directory / str(step) / STATE).is_dir():
            raise ValueError(f"checkpoint {directory / str(step)} holds no state, only meta")
        items = {META: ocp.args.JsonRestore()}
        if template is not None:
            abstract = jax.tree.map(_abstract, template)
            _check_against(
                _tree(manager.item_metadata(step)[STATE]), abstract, directory / str(step)
            )
            items[STATE] = ocp.args.StandardRestore(abstract)
        out = manager.restore(step, args=ocp.args.Composite(**items))
    return (out[STATE] if template is not None else None), out[META]


def saved_tree(directory: str | Path, step: int | None = None) -> Any:
    """The tree saved as `step` (default: the latest) in `directory` as
    `jax.ShapeDtypeStruct`s, read from orbax's metadata (no array is loaded): a `restore`
    template for a reader that does not know the saved shapes. `ValueError` when there is no
    such step or it holds no state."""
    directory = _check_directory(directory)
    step = latest(directory) if step is None else check_int("step", step, 0)
    if step is None or not (directory / str(step) / STATE).is_dir():
        raise ValueError(f"no saved state in {directory} (step {step})")
    with _manager(directory, create=False) as manager:
        tree = _tree(manager.item_metadata(step)[STATE])
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), tree)
