"""What a file writer has written, kept beside its files, so a resumed job writes each round
exactly once wherever a kill lands.

After every write the writer saves its `Ledger` (atomically): the last round written of each
(run, method) and the size of each of its files. A resumed job's writer first puts its files
back as the ledger saw them (a file grown since is cut back to its size, a file made since is
removed), then drops the rounds it holds from what the driver sends; the driver sends every
round of the checkpoint (the replayed table) again, so the rounds that were durable in the
checkpoint but never reached the files are written now, once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from pfedwn_jax.distributed import is_writer


class Ledger:
    """The rounds and file sizes a writer has written; `path` holds them (JSON), `files()`
    lists the writer's files as they are now (all under `path`'s folder)."""

    def __init__(self, path: Path, files: Callable[[], Iterable[Path]]) -> None:
        self.path, self.files = Path(path), files
        self.done: dict[str, int] = {}
        self.sizes: dict[str, int] = {}  # file (relative to `path`'s folder) -> bytes

    def start(self, resumed: bool) -> None:
        """A fresh job: nothing written yet (the files as they are now). A resumed one: the
        files back to the last saved ledger, its rounds known as written."""
        if not is_writer():
            return
        saved = self._load() if resumed else None
        if saved is None:
            self.done = {}
        else:
            self.done = {k: int(v) for k, v in saved["rounds"].items()}
            sizes = {self.path.parent / k: int(v) for k, v in saved["sizes"].items()}
            _restore(self.files(), sizes)
        base = self.path.parent
        files = [p for p in self.files() if p.is_file()]
        self.sizes = {str(p.relative_to(base)): p.stat().st_size for p in files}
        self.save()

    def _load(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def new(self, event: Any) -> Any:
        """`event` (a `writers.Logged`) without the rounds already written, or None."""
        keep = np.asarray(event.rounds) > self.last(event.run, event.method)
        if len(keep) and keep.all():
            return event
        if not keep.any():
            return None
        first = int(np.argmax(keep))

        def cut(arrays: Any) -> dict[str, Any]:
            return {k: v[first:] for k, v in arrays.items()}

        return event._replace(
            rounds=event.rounds[first:],
            metrics=cut(event.metrics),
            arrays=cut(event.arrays),
            records=cut(event.records),
        )

    def last(self, run: int, method: str) -> int:
        """The last round of `run` and `method` written (0: none)."""
        return self.done.get(f"{run}/{method}", 0)

    def wrote(self, event: Any, path: Path | None = None) -> None:
        """`event`'s rounds are in the (flushed) file `path` (None: in no file): saved."""
        if len(event.rounds):
            self.done[f"{event.run}/{event.method}"] = int(event.rounds[-1])
            if path is not None:
                self.sizes[str(path.relative_to(self.path.parent))] = path.stat().st_size
            self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"rounds": self.done, "sizes": self.sizes}))
        os.replace(tmp, self.path)


def _restore(files: Iterable[Path], sizes: dict[Path, int]) -> None:
    """Each file cut back to its size in `sizes`; one `sizes` does not name, removed."""
    for path in list(files):
        size = sizes.get(path)
        if not path.is_file():
            continue
        if size is None:
            path.unlink(missing_ok=True)
        elif path.stat().st_size > size:
            os.truncate(path, size)
