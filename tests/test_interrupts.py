"""Ctrl-C handling (`pfedwn_jax.interrupts`): the first SIGINT interrupts, a second exits with
130 at once, an interrupted command ends with 130 without Python's shutdown. Real signals;
the ones that end a process are sent to a small subprocess (no JAX). The same through
`pfedwn sweep` with kill/resume: `test_checkpoint_processes.py`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pfedwn_jax.interrupts import SECOND, interrupt_guard


def test_a_first_sigint_interrupts_and_the_handler_comes_back():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), interrupt_guard() as guard:
        assert getattr(signal.getsignal(signal.SIGINT), "pfedwn_guard", False)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)  # the handler raises here
    assert guard.received
    assert signal.getsignal(signal.SIGINT) is before
    with interrupt_guard() as quiet:  # no signal: nothing changes
        pass
    assert not quiet.received and signal.getsignal(signal.SIGINT) is before


def test_a_guard_inside_another_leaves_the_outer_in_charge():
    before = signal.getsignal(signal.SIGINT)
    with interrupt_guard():
        outer = signal.getsignal(signal.SIGINT)
        with interrupt_guard():
            assert signal.getsignal(signal.SIGINT) is outer
        assert signal.getsignal(signal.SIGINT) is outer
    assert signal.getsignal(signal.SIGINT) is before


SECOND_SIGINT = """
    import atexit, os, signal, time
    from pfedwn_jax.interrupts import interrupt_guard
    atexit.register(lambda: print("shutdown ran"))
    with interrupt_guard():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)
        except KeyboardInterrupt:
            print("first", flush=True)
            os.kill(os.getpid(), signal.SIGINT)  # the clean-up is interrupted again
            time.sleep(10)
            print("clean-up went on")
"""

INTERRUPTED_COMMAND = """
    import atexit, os, signal, sys, time
    from pfedwn_jax.cli.common import run_command
    atexit.register(lambda: print("shutdown ran"))

    def work():
        print("partial output")  # not flushed yet: a pipe is block-buffered
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)

    sys.exit(run_command("prog", work))
"""


def test_a_second_sigint_and_an_interrupted_command_exit_130_at_once():
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for code in (SECOND_SIGINT, INTERRUPTED_COMMAND)
    ]
    (out, err), (cmd_out, cmd_err) = (p.communicate(timeout=120) for p in procs)
    assert procs[0].returncode == 130, (out, err)
    assert out == "first\n" and err == SECOND.decode(), (out, err)
    assert procs[1].returncode == 130, (cmd_out, cmd_err)
    assert cmd_out == "partial output\n" and cmd_err == "prog: interrupted\n", (cmd_out, cmd_err)


TERMINATED_COMMAND = """
    import atexit, os, signal, sys, time
    from pfedwn_jax.cli.common import run_command

    def work():
        print("partial output")
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
        except KeyboardInterrupt:  # where `pfedwn run` says its checkpoint is kept
            print("checkpoint kept", file=sys.stderr)
            raise

    sys.exit(run_command("prog", work))
"""


def test_sigterm_stops_a_command_as_a_ctrl_c_does_and_exits_143():
    """A scheduler's SIGTERM unwinds the work like a Ctrl-C (the command's "checkpoint kept"
    line comes from the same `except KeyboardInterrupt`), and ends with 128 + 15."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TERMINATED_COMMAND)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 143, (proc.stdout, proc.stderr)
    assert proc.stdout == "partial output\n"
    assert proc.stderr == "checkpoint kept\nprog: terminated (SIGTERM)\n", proc.stderr
