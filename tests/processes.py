"""Run a test worker script as several JAX processes on localhost (one job, two CPU devices
each): the helpers the multi-process tests share."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEPT_LOGS = Path(tempfile.gettempdir()) / "pfedwn-two-process-logs"
TAIL = 12_000  # characters of each log in the failure message


def keep_logs(script: str, logs: list[str]) -> Path:
    """Write a failed pair's whole logs to a fresh folder under `KEPT_LOGS`; its path."""
    KEPT_LOGS.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{Path(script).stem}-", dir=KEPT_LOGS))
    for i, log in enumerate(logs):
        (folder / f"process{i}.log").write_text(log)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_two_processes(script: str, args: list[str], timeout: float) -> tuple[list[str], float]:
    """Run `tests/<script> PORT PROCESS_ID 2 *args` as two processes with 2 CPU devices each
    (one job, coordinator on a free localhost port); their logs and the wall time. Fails the
    test, with both processes' log tails, when a process exits non-zero; the whole logs are
    then kept under `KEPT_LOGS`. The logs go to files, not pipes: a process blocked on a full
    pipe would stall the other at its next barrier."""
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
        "PYTHONFAULTHANDLER": "1",  # a fatal abort (say a barrier timeout) prints every stack
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("JAX_NUM_CPU_DEVICES", None)
    port = str(free_port())
    path = str(ROOT / "tests" / script)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        files = [(Path(tmp) / f"process{i}.log").open("w+") for i in range(2)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-u", path, port, str(i), "2", *args],
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for i, f in enumerate(files)
        ]
        try:
            for p in procs:
                p.wait(timeout=max(1.0, timeout - (time.perf_counter() - start)))
        except subprocess.TimeoutExpired:
            pass  # killed below; the assertion shows both logs
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        logs = [Path(f.name).read_text() for f in files]
        for f in files:
            f.close()
    elapsed = time.perf_counter() - start
    codes = [p.returncode for p in procs]
    if codes != [0, 0]:
        kept = keep_logs(script, logs)
        tails = "\n".join(f"--- process {i} (exit {c}):\n{log[-TAIL:]}"
                          for i, (c, log) in enumerate(zip(codes, logs, strict=True)))  # fmt: skip
        raise AssertionError(f"after {elapsed:.0f} s (whole logs in {kept}):\n{tails}")
    for i, log in enumerate(logs):
        assert f"process {i}: devices 4 local 2" in log
    return logs, elapsed
