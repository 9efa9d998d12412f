"""Compiling the next program while the current one runs.

XLA compiles on the host; while one method's rounds run, the next method's block program
(same runs, same placed inputs, its state known by shape alone: `groups.state_shapes`) can
be lowered and compiled on a background thread, so a study of several methods pays little
of its compile time on top of its rounds. One compilation ahead at most; anything that goes
wrong there is dropped and the driver compiles the program itself (where the error, if it
repeats, surfaces with its own traceback). Off over several processes (each keeps its
compilations in its main thread) and for a single method.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Any


class Ahead:
    """At most one compilation running ahead: `start(key, fn)`, then `take(key)`."""

    def __init__(self) -> None:
        self.key: Hashable | None = None
        self.thread: threading.Thread | None = None
        self.box: dict[str, Any] = {}

    def start(self, key: Hashable, compile_fn: Callable[[], Any]) -> None:
        """Run `compile_fn()` on a background thread. Not a daemon: a job that fails while it
        compiles (a full disk, say) ends with the interpreter joining it, as a daemon thread
        stopped inside XLA's C++ at exit aborts the process (status 134). A Ctrl-C ends the
        process at once (`interrupts.exit_now`), so an interrupted job does not wait for it."""
        box: dict[str, Any] = {}

        def work() -> None:
            t0 = time.perf_counter()
            try:
                box["value"] = compile_fn()
            except Exception as exc:  # the driver compiles it again itself
                box["error"] = exc
            box["seconds"] = time.perf_counter() - t0

        self.key, self.box = key, box
        self.thread = threading.Thread(target=work, name="pfedwn-compile-ahead", daemon=False)
        self.thread.start()

    def take(self, key: Hashable) -> tuple[Any, float] | None:
        """`(compiled, seconds)` of `key` once its compilation ended; None when `key` was not
        started or failed."""
        if self.thread is None or self.key != key:
            return None
        self.thread.join()
        box, self.key, self.thread, self.box = self.box, None, None, {}
        if "value" not in box:
            return None
        return box["value"], float(box["seconds"])
