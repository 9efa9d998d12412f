"""Atomic file writes: a reader never sees a half-written file, even after a crash."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temp file beside `path`; on success fsync and `os.replace` it onto `path`.

    On an exception the temp file is removed and `path` is left as it was.
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
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """JSON with NaN/inf refused (they are not valid JSON)."""
    atomic_write_text(path, json.dumps(obj, indent=1, allow_nan=False) + "\n")


def atomic_write_with(path: str | Path, writer: Callable[[IO[bytes]], None]) -> None:
    """Atomically write binary content produced by `writer(file)` (e.g. `np.savez`)."""
    with atomic_open(path, "wb") as f:
        writer(f)
