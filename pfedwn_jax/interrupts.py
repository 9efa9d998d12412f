"""Ctrl-C: the first one interrupts cleanly, a second one exits at once with status 130.

SIGTERM (a scheduler's or `kill`'s stop) is handled as a Ctrl-C: the work unwinds, the
checkpoint is kept and said so, and the command ends with 143 (128 + SIGTERM).

Inside `interrupt_guard()` a first SIGINT raises `KeyboardInterrupt` as usual, so the work
unwinds through its `finally` blocks (a checkpoint's last save completes, its files stay
whole). From then on a second SIGINT ends the process at once with status 130 (`os._exit`):
no clean-up, and no interpreter shutdown for a third signal to break (letting Python unwind
twice crashed the process with SIGSEGV). A checkpoint survives that too: an orbax step
appears only when complete, block files are written atomically.

The command lines (`cli.common.run_command`) hold a guard for the whole command and, once a
Ctrl-C has stopped it and the clean-up is done, end the process at once with 130
(`exit_now`): Python's shutdown puts the default handler back, so a second Ctrl-C landing
there would kill the process by the signal (status -2) instead. `run()` and `sweep()` hold a
guard for the job; a guard inside another leaves the outer one in charge, and outside the
main thread a guard does nothing (signals reach the main thread only).

Imports nothing heavy: the command lines install it before any JAX work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C
SECOND = b"interrupted again: exiting at once\n"


def exit_at_once(signum: int, frame: Any) -> None:
    """The handler of a second Ctrl-C: one line on stderr, exit 130, nothing else runs."""
    with contextlib.suppress(OSError):
        os.write(2, SECOND)
    os._exit(EXIT_INTERRUPTED)


def exit_now(status: int = EXIT_INTERRUPTED) -> None:
    """End the process with `status` now: stdout and stderr flushed, no interpreter shutdown."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


@dataclasses.dataclass
class Guard:
    """What a guard saw: `received` is True once a SIGINT arrived inside it (also when an
    outer guard got it)."""

    received: bool = False
    signum: int = signal.SIGINT  # the signal that stopped the work (SIGINT or SIGTERM)


@contextlib.contextmanager
def interrupt_guard() -> Iterator[Guard]:
    """The first SIGINT (or SIGTERM) inside raises `KeyboardInterrupt`, a second one exits
    with 130 at once.

    Yields a `Guard` saying whether a SIGINT came. On leaving, the previous handler comes
    back. A guard inside another guard, or outside the main thread, changes nothing.
    """
    guard = Guard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is exit_at_once or getattr(previous, "pfedwn_guard", False):
        try:
            yield guard  # an outer guard is in charge
        finally:
            guard.received = signal.getsignal(signal.SIGINT) is exit_at_once
        return

    def first(signum: int, frame: Any) -> None:
        guard.received, guard.signum = True, signum
        signal.signal(signal.SIGINT, exit_at_once)
        signal.signal(signal.SIGTERM, exit_at_once)
        raise KeyboardInterrupt

    first.pfedwn_guard = True  # type: ignore[attr-defined]
    previous_term = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, first)
    signal.signal(signal.SIGTERM, first)  # a scheduler's stop: unwound as a Ctrl-C is
    try:
        yield guard
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
