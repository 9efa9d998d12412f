"""kill -9 at random moments of `pfedwn run --log-to csv,tensorboard --checkpoint-every 1`,
each followed by `--resume`: the CSV and the TensorBoard files hold every round once and equal
an uninterrupted run's. `PFEDWN_KILLS` kills (default 6; 20 for the full check)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import read_events
from test_writers_exact import csv_rows

ROOT = Path(__file__).resolve().parents[1]
FLAGS = [
    "--algorithms", "local,fedavg", "--model", "logreg", "--num-neighbors", "3",
    "--gamma-th", "1.0", "--eps", "0.12", "--rounds", "8", "--batch-size", "32", "--lr", "0.05",
    "--quiet", "--no-plot", "--log-to", "csv,tensorboard", "--checkpoint-every", "1",
]  # fmt: skip


def pfedwn(out: Path, *extra: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    code = "import sys; from pfedwn_jax.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, "run", *FLAGS, "--out", str(out), *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen) -> None:
    log = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, log[-3000:]


def events(logs: Path) -> list[tuple]:
    """Every scalar and histogram of the event files: `(run/method, tag, step, value)`."""
    out = []
    for where in sorted(p for p in (logs / "tensorboard").glob("*/*") if p.is_dir()):
        for event in read_events(where):
            for v in event.summary.value:
                value = v.simple_value if v.HasField("simple_value") else (v.histo.num, v.histo.sum)
                out.append((f"{where.parent.name}/{where.name}", v.tag, event.step, value))
    return sorted(out)


@pytest.mark.slow
def test_kill_9_anywhere_then_resume_writes_every_round_once(tmp_path):
    pytest.importorskip("tensorboardX")
    kills = int(os.environ.get("PFEDWN_KILLS", "6"))
    t0 = time.perf_counter()
    finish(pfedwn(tmp_path / "reference"))
    seconds = time.perf_counter() - t0
    rows = csv_rows(tmp_path / "reference" / "logs" / "metrics.csv")
    scalars = events(tmp_path / "reference" / "logs")
    assert len({r[3] for r in rows[1:]}) == 8 and scalars
    rng, inside = random.Random(0), 0
    for i in range(kills):
        out = tmp_path / f"killed{i}"
        proc = pfedwn(out)
        time.sleep(rng.uniform(0.3, 1.0) * seconds)  # mostly after start-up, in the rounds
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        inside += (out / "checkpoint").is_dir()  # killed between the first commit and the end
        finish(pfedwn(out, "--resume"))
        assert csv_rows(out / "logs" / "metrics.csv") == rows, f"kill {i}"
        assert events(out / "logs") == scalars, f"kill {i}"
    print(f"{inside} of {kills} kills in the rounds")
    assert inside >= min(kills, 2) // 2, f"{inside} of {kills} kills landed in the rounds"
