"""Run a test worker script as several JAX processes on localhost (one job, two CPU devices
each): the helpers the multi-process tests share."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_two_processes(script: str, args: list[str], timeout: float) -> tuple[list[str], float]:
    """Run `tests/<script> PORT PROCESS_ID 2 *args` as two processes with 2 CPU devices each
    (one job, coordinator on a free localhost port); their logs and the wall time. Fails the
    test, with the log, when a process exits non-zero."""
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("JAX_NUM_CPU_DEVICES", None)
    port = str(free_port())
    path = str(ROOT / "tests" / script)
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, path, port, str(i), "2", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    elapsed = time.perf_counter() - start
    for i, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0, f"process {i} failed:\n{log[-3000:]}"
        assert f"process {i}: devices 4 local 2" in log
    return logs, elapsed
