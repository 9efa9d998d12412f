"""Progress of a job: a tqdm bar on a terminal or in a notebook, plain lines in a log.

One bar per program and method: for a single run its rounds (`unit="round"`, the current
target accuracy beside it), for several runs their run-rounds (`unit="run-round"`). Where
stderr is not a terminal (a log file, a CI job) a line is printed every tenth of the work and
at least every `LINE_EVERY_S` seconds, each naming its unit.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from tqdm.auto import tqdm

#: Seconds between two progress lines in a log at most (while work advances).
LINE_EVERY_S = 30.0


def progress_bar(name: str, total: int, initial: int, enabled: bool, unit: str = "round") -> Any:
    """A tqdm bar on a terminal (or notebook); `LineProgress` where stderr is a log file."""
    if enabled and not _interactive():
        return LineProgress(name, total, initial, unit)
    return tqdm(
        total=total,
        initial=initial,
        desc=f"{name:>9}",
        unit=unit,
        disable=not enabled,
        leave=True,
        dynamic_ncols=True,
    )


def _interactive() -> bool:
    """Whether a redrawn bar shows as one line: stderr is a terminal, or tqdm is a notebook's."""
    if any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__):
        return True
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


class LineProgress:
    """Progress as plain stderr lines: every tenth of `total`, every `LINE_EVERY_S` seconds
    and at the end. The part of tqdm's interface the driver uses: `update(n)`,
    `set_postfix(**values)` (prints a line that is due), `close()`."""

    def __init__(self, name: str, total: int, initial: int = 0, unit: str = "round") -> None:
        self.name, self.total, self.done, self.unit = name, total, initial, unit
        self.every = max(1, total // 10)
        self.next = (initial // self.every + 1) * self.every
        self.postfix: dict[str, Any] = {}
        self.due = False
        self.t0 = self.last = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if self.done >= self.next or self.done >= self.total or now - self.last >= LINE_EVERY_S:
            self.due = True
            self.next = (self.done // self.every + 1) * self.every

    def set_postfix(self, **values: Any) -> None:
        self.postfix = values
        if self.due:
            self._print()

    def close(self) -> None:
        if self.due:
            self._print()

    def _print(self) -> None:
        extra = "".join(f", {k}={v}" for k, v in self.postfix.items())
        elapsed = time.perf_counter() - self.t0
        print(
            f"{self.name:>9}: {self.unit} {self.done}/{self.total}{extra} ({elapsed:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
        self.due, self.last = False, time.perf_counter()
