"""Atomic file writes: a reader never sees a half-written file, even after a crash.

The one place every package writes files through (results, checkpoints, tables, plots): each
writes a temp file `.NAME.XXXXXXXX.tmp` beside the target, fsyncs it and `os.replace`s it onto
the target. Files get the usual permissions for the user's umask (not `mkstemp`'s 0600).

A write killed half way leaves its temp file behind; the next write into the same directory
removes such leftovers (`remove_stale_temps`). While a write is in progress its temp file is
locked (`flock`), so a leftover is told apart from a write that is still running.

`check_writable_dir` / `check_writable_file` check an output path before any work, so a bad
path fails at once with a `ValueError` naming it instead of after a long computation;
`read_json` reads a file back, a damaged one failing with a `ValueError` naming it.

A full disk (or an exhausted quota) is a `DiskFullError` (an `OSError`) whose one line names
the filesystem, its free space and the path being written (`disk_full_error`); `is_disk_full`
recognises one anywhere in an exception's chain, also as the text of a library's error
(tensorstore reports `OS error 28` inside its own exception types).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

try:
    import fcntl
except ImportError:  # not on Windows: leftovers are then told apart by age alone
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "STALE_TEMP_S",
    "TEMP_PATTERN",
    "DiskFullError",
    "atomic_open",
    "atomic_savefig",
    "atomic_write_json",
    "atomic_write_text",
    "atomic_write_with",
    "check_writable_dir",
    "check_writable_file",
    "disk_full_error",
    "is_disk_full",
    "read_json",
    "read_npz",
    "remove_stale_temps",
    "write_npz",
]

# temp files of `atomic_open`: "." + target name + "." + mkstemp's 8 random characters + ".tmp"
TEMP_PATTERN = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")
# a temp file younger than this is never removed (it may be a write just starting)
STALE_TEMP_S = 5.0


# --------------------------------------------------------------------------- disk full
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_FULL_TEXT = re.compile(
    r"No space left on device|Disk quota exceeded|OS error 28\b|\[Errno 28\]|\bENOSPC\b"
)


class DiskFullError(OSError):
    """No space left where a file was being written; `str()` is one line naming the
    filesystem (its mount point and free space) and `path`."""

    def __init__(self, message: str, path: str | Path) -> None:
        super().__init__(errno.ENOSPC, message)
        self.path = Path(path)
        self.message = message

    def __str__(self) -> str:
        return self.message


def is_disk_full(e: BaseException | None) -> bool:
    """Whether `e`, or an exception in its chain (`__cause__`, `__context__`), says that a
    disk is full: an `OSError` with `ENOSPC`/`EDQUOT`, or a library error whose text does."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return True
        if _FULL_TEXT.search(str(e)):
            return True
        e = e.__cause__ or e.__context__
    return False


def _mount_point(path: Path) -> Path:
    """The mount point of the filesystem holding `path` (its nearest existing parent)."""
    path = path.absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    while not os.path.ismount(path) and path.parent != path:
        path = path.parent
    return path


def format_bytes(n: int) -> str:
    """`n` bytes as text in binary units, 4 significant digits: `512 B`, `1.5 KiB`, `3 TiB`."""
    value, units = float(n), ("B", "KiB", "MiB", "GiB", "TiB")
    for unit in units[:-1]:
        if abs(value) < 1024:
            return f"{value:.4g} {unit}"
        value /= 1024
    return f"{value:.4g} {units[-1]}"


def disk_full_error(path: str | Path) -> DiskFullError:
    """The `DiskFullError` of a write to `path` that found no space: one line naming the
    filesystem (mount point, free of total) and `path`."""
    path = Path(path)
    mount = _mount_point(path)
    try:
        usage = shutil.disk_usage(mount)
        space = f", {format_bytes(usage.free)} free of {format_bytes(usage.total)}"
    except OSError:
        space = ""
    return DiskFullError(
        f"disk full: no space left on the filesystem mounted at {str(mount)!r}{space}, "
        f"writing {str(path)!r}; free some space there or write elsewhere",
        path,
    )


# --------------------------------------------------------------------------- checks
def check_writable_dir(path: str | Path, what: str = "output directory") -> Path:
    """`path` if it is, or can be created as, a directory this process can write files in.

    Raises `ValueError` naming `path` if it is a file, lies under a file, or its nearest
    existing directory refuses new files (read-only, no permission). Nothing is created but
    a probe file, removed at once.
    """
    path = Path(path)
    _check_dir(path, path, what)
    return path


def check_writable_file(path: str | Path, what: str = "output file") -> Path:
    """`path` if a file can be written there: not a directory, its directory writable."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {str(path)!r} is a directory; give a file name")
    _check_dir(path.parent, path, what)
    return path


def _check_dir(directory: Path, shown: Path, what: str) -> None:
    """Raise `ValueError` (naming `shown`) unless files can be created in `directory`."""
    existing = directory
    while not os.path.exists(existing):  # False also where a parent is a file or unreadable
        if existing.parent == existing:  # a relative path whose working directory is gone
            raise ValueError(f"{what} {str(shown)!r}: no existing directory above it")
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == shown else f"lies under the file {str(existing)!r}"
        raise ValueError(f"{what} {str(shown)!r} {where}, not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".pfedwn-check.", suffix=".tmp", dir=existing)
    except OSError as e:
        raise ValueError(
            f"{what} {str(shown)!r}: cannot create files in {str(existing)!r} ({e.strerror or e})"
        ) from None
    os.close(fd)
    os.unlink(probe)


def read_json(path: str | Path, what: str = "JSON file") -> Any:
    """The JSON document in `path`; a `ValueError` naming `what` and `path` when it is not
    valid JSON (truncated, damaged, binary) or is a directory. A missing or unreadable file
    stays an `OSError` (which names the path)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {str(path)!r} is a directory, not a file")
    try:
        with path.open(encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(
            f"{what} {str(path)!r} is not valid JSON (truncated or damaged?): {e}"
        ) from None


def read_npz(path: str | Path, what: str = "array file") -> dict[str, Any]:
    """The arrays of the `.npz` at `path` (name -> numpy array, loaded now); a `ValueError`
    naming `what` and `path` when it is damaged (truncated, not a zip archive, a member that
    does not read) or is a directory. A missing or unreadable file stays an `OSError`."""
    import zipfile

    import numpy as np

    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {str(path)!r} is a directory, not a file")
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except (FileNotFoundError, PermissionError):
        raise
    except (zipfile.BadZipFile, EOFError, ValueError, OSError, KeyError) as e:
        raise ValueError(
            f"{what} {str(path)!r} is damaged (truncated or overwritten?): {type(e).__name__}: {e}"
        ) from None


# --------------------------------------------------------------------------- leftovers
def remove_stale_temps(directory: str | Path, min_age_s: float = STALE_TEMP_S) -> list[Path]:
    """Remove the leftover temp files of killed `atomic_open` writes in `directory`.

    Only files named like our temp files (`TEMP_PATTERN`), at least `min_age_s` seconds old
    and not locked by a write in progress (in any process) are removed. Best effort: a file
    that cannot be examined or removed is left. Returns the removed paths.
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        if not TEMP_PATTERN.match(entry.name):
            continue
        with contextlib.suppress(OSError):
            if not entry.is_file(follow_symlinks=False):
                continue
            if now - entry.stat(follow_symlinks=False).st_mtime < min_age_s:
                continue
            if _unlink_if_unlocked(entry.path):
                removed.append(Path(entry.path))
    return removed


def _unlink_if_unlocked(path: str) -> bool:
    """Unlink `path` unless a live write holds its lock; True if removed."""
    if fcntl is None:
        os.unlink(path)
        return True
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a write in progress
        os.unlink(path)
        return True
    finally:
        os.close(fd)  # also releases the lock


# --------------------------------------------------------------------------- writes
@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temp file beside `path`; on success fsync and `os.replace` it onto `path`.

    Missing parent directories are created and leftovers of killed writes there removed. On
    an exception the temp file is removed and `path` is left as it was; an `OSError` without
    a file name gets `path` as its file name (so an error message names it).
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # marks the write as live for `remove_stale_temps`
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)  # still locked: never seen unlocked under the temp name
    except BaseException as e:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, DiskFullError) and is_disk_full(e):
            raise disk_full_error(path) from None
        if isinstance(e, OSError) and e.errno is not None and e.filename in (None, tmp):
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise


def _umask() -> int:
    """The process umask (reading it means setting it; it is restored at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_with(path: str | Path, writer: Callable[[IO[bytes]], object]) -> Path:
    """Write the binary content `writer(file)` produces (e.g. `write_npz`; what it returns is
    ignored); returns the path."""
    with atomic_open(path, "wb") as f:
        writer(f)
    return Path(path)


def write_npz(file: IO[bytes], arrays: Mapping[str, ArrayLike], compressed: bool = False) -> None:
    """`np.savez(file, **arrays)` (`np.savez_compressed` with `compressed`): one archive
    member per name."""
    import numpy as np

    save = np.savez_compressed if compressed else np.savez
    # numpy's stub lets a `**` mapping reach its `allow_pickle: bool` keyword; every name
    # here is an array's
    save(file, **arrays)  # type: ignore[arg-type]


def csv_text(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    """CSV: the `header` line, then one line per row (None: an empty field)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text`; returns the path."""
    with atomic_open(path, "w") as f:
        f.write(text)
    return Path(path)


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 1) -> Path:
    """Write `obj` as JSON plus a newline; NaN and infinities are refused (not valid JSON)."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, allow_nan=False) + "\n")


def atomic_savefig(fig: Any, path: str | Path, **savefig_kwargs: Any) -> Path:
    """Save a matplotlib figure; the format comes from the suffix (none: PNG)."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    return atomic_write_with(path, lambda f: fig.savefig(f, format=fmt, **savefig_kwargs))
