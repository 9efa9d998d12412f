"""Atomic file writes: a reader never sees a half-written file, even after a crash.

The one place every package writes files through (results, checkpoints, tables, plots): each
writes a temp file beside the target, fsyncs it and `os.replace`s it onto the target. Files get
the usual permissions for the user's umask (not `mkstemp`'s 0600).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "atomic_open",
    "atomic_savefig",
    "atomic_write_json",
    "atomic_write_text",
    "atomic_write_with",
]


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temp file beside `path`; on success fsync and `os.replace` it onto `path`.

    Missing parent directories are created. On an exception the temp file is removed and
    `path` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    """The process umask (reading it means setting it; it is restored at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_with(path: str | Path, writer: Callable[[IO[bytes]], None]) -> Path:
    """Write the binary content `writer(file)` produces (e.g. `np.savez`); returns the path."""
    with atomic_open(path, "wb") as f:
        writer(f)
    return Path(path)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text`; returns the path."""
    with atomic_open(path, "w") as f:
        f.write(text)
    return Path(path)


def atomic_write_json(path: str | Path, obj: Any, indent: int = 1) -> Path:
    """Write `obj` as JSON plus a newline; NaN and infinities are refused (not valid JSON)."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, allow_nan=False) + "\n")


def atomic_savefig(fig: Any, path: str | Path, **savefig_kwargs: Any) -> Path:
    """Save a matplotlib figure; the format comes from the suffix (none: PNG)."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    return atomic_write_with(path, lambda f: fig.savefig(f, format=fmt, **savefig_kwargs))
