"""Checkpoints through real `pfedwn` processes: kill -9, a forgetful rerun, --resume,
--overwrite, changed data, a corrupted newest step, a double Ctrl-C, two runs into one --out,
progress lines in a log.

Each test starts the CLI as a subprocess (stderr a pipe, as in a log), waits until the
checkpoint directory shows a committed orbax step, then kills or interrupts it. The
in-process checks of the same rules are in `test_checkpoint.py`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

BASE = ["--model", "logreg", "--num-neighbors", "3", "--algorithms", "local,fedavg"]
RUN = ["run", *BASE, "--rounds", "30", "--checkpoint-every", "1", "--no-plot"]
SWEEP = ["sweep", *BASE, "--rounds", "12", "--seeds", "0-1", "--block", "1"]
# a rerun with other settings, as a user retrying something small would type it
OTHER_RUN = ["run", "--model", "logreg", "--num-neighbors", "3", "--rounds", "2"]
OTHER_RUN += ["--algorithms", "local", "--no-plot"]
OTHER_SWEEP = ["sweep", "--model", "logreg", "--num-neighbors", "3", "--rounds", "2"]
OTHER_SWEEP += ["--algorithms", "local", "--seeds", "0"]
KEYS = ("target_accuracy", "target_loss", "client_accuracy", "client_loss", "records", "diverged")
TIMEOUT = 300


# --------------------------------------------------------------------------- processes
def _popen(argv: list[str], cwd: Path) -> subprocess.Popen:
    """`python -m pfedwn_jax *argv` with stdout and stderr pipes. (No `preexec_fn` to reset
    SIGINT: Python code between fork and exec can deadlock in a process running JAX's
    threads, and the command's guard takes SIGINT over even where this process ignores it.)"""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(
        [sys.executable, "-m", "pfedwn_jax", *map(str, argv)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def pfedwn(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    p = _popen(argv, cwd)
    out, err = p.communicate(timeout=TIMEOUT)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def steps(checkpoint: Path) -> list[int]:
    """The committed orbax steps of a checkpoint directory (a step directory exists only once
    complete: orbax renames its temporary directory at the end)."""
    state = checkpoint / "state"
    if not state.is_dir():
        return []
    return sorted(int(p.name) for p in state.iterdir() if p.name.isdigit())


def wait_for_steps(p: subprocess.Popen, checkpoint: Path, count: int = 1) -> list[int]:
    """Wait until `checkpoint` holds `count` committed steps; fails if `p` ends first."""
    deadline = time.monotonic() + TIMEOUT
    while len(found := steps(checkpoint)) < count:
        if p.poll() is not None:
            _, err = p.communicate()
            pytest.fail(f"ended (exit {p.returncode}) before {count} step(s): {err[-2000:]}")
        assert time.monotonic() < deadline, "no checkpoint step in time"
        time.sleep(0.01)
    return found


def kill_after_steps(argv: list[str], out: Path, count: int = 1) -> None:
    """Start `argv --out out`, kill -9 it once `count` steps are committed."""
    p = _popen([*argv, "--out", out], out.parent)
    try:
        wait_for_steps(p, out / "checkpoint", count)
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.communicate(timeout=TIMEOUT)
    assert p.returncode == -signal.SIGKILL


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` by relative path, with the SHA-256 of its bytes."""
    return {
        str(f.relative_to(directory)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(directory.rglob("*"))
        if f.is_file()
    }


def check_one_line(proc: subprocess.CompletedProcess, status: int, *words: str) -> str:
    """Exit `status`, stderr one line holding `words`, no traceback; the line."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == status and len(lines) == 1, (proc.returncode, proc.stderr[-3000:])
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def same_run(a: Path, b: Path) -> None:
    """Two `pfedwn run` output directories hold the same numbers (timings aside)."""
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (a, b))
    assert ra["config"] == rb["config"]
    assert ra["methods"].keys() == rb["methods"].keys()
    for name in ra["methods"]:
        for key in KEYS:
            assert ra["methods"][name][key] == rb["methods"][name][key], (name, key)


def same_sweep(a: Path, b: Path) -> None:
    """Two `pfedwn sweep` output directories hold the same rows."""
    assert (a / "rows.csv").read_text() == (b / "rows.csv").read_text()


def _reference(tmp_path_factory, kind: str) -> Path:
    out = tmp_path_factory.mktemp("reference") / kind
    proc = pfedwn([*(RUN if kind == "run" else SWEEP), "--out", out], out.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def run_reference(tmp_path_factory) -> Path:
    """The output directory of `RUN`, uninterrupted."""
    return _reference(tmp_path_factory, "run")


@pytest.fixture(scope="module")
def sweep_reference(tmp_path_factory) -> Path:
    """The output directory of `SWEEP`, uninterrupted."""
    return _reference(tmp_path_factory, "sweep")


# --------------------------------------------------------------------------- kill -9
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["run", "sweep"])
def test_killed_job_survives_a_forgetful_rerun_then_resumes_exactly(kind, request, tmp_path):
    """kill -9 after two committed steps; a rerun with other settings and neither --resume nor
    --overwrite exits 2 naming both and leaves every checkpoint file as it was; --resume
    gives the uninterrupted numbers; --overwrite starts the other job over."""
    argv, other = (RUN, OTHER_RUN) if kind == "run" else (SWEEP, OTHER_SWEEP)
    out = tmp_path / "out"
    kill_after_steps(argv, out, count=2)
    before = snapshot(out / "checkpoint")
    for rerun in (other, argv):
        proc = pfedwn([*rerun, "--out", out], tmp_path)
        check_one_line(proc, 2, "--resume", "--overwrite", "interrupted")
        assert snapshot(out / "checkpoint") == before
    proc = pfedwn([*argv, "--out", out, "--resume"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (out / "checkpoint").exists()
    reference = request.getfixturevalue(f"{kind}_reference")
    (same_run if kind == "run" else same_sweep)(reference, out)

    kill_after_steps(argv, out)
    proc = pfedwn([*other, "--out", out, "--overwrite"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (out / "checkpoint").exists()
    if kind == "run":
        result = json.loads((out / "results.json").read_text())
        assert result["config"]["rounds"] == 2 and list(result["methods"]) == ["local"]
    else:
        assert {line.split(",")[2] for line in (out / "rows.csv").read_text().split()[1:]} == {
            "local"
        }


# --------------------------------------------------------------------------- data and damage
def _save_data(path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    np.savez(
        path,
        x_train=rng.integers(0, 255, (200, 4, 4, 1), dtype=np.uint8),
        y_train=rng.integers(0, 3, 200),
        x_test=rng.integers(0, 255, (40, 4, 4, 1), dtype=np.uint8),
        y_test=rng.integers(0, 3, 40),
    )


@pytest.mark.slow
def test_resume_refuses_changed_data_naming_it(tmp_path):
    """The `npz:` file replaced between the kill and --resume: exit 2, one line naming the
    dataset and that its content changed, the checkpoint kept; the old file back resumes."""
    data, out = tmp_path / "data.npz", tmp_path / "out"
    _save_data(data, 0)
    argv = [*RUN, "--dataset", f"npz:{data}"]
    kill_after_steps(argv, out)
    before = snapshot(out / "checkpoint")
    kept = data.read_bytes()
    _save_data(data, 1)
    proc = pfedwn([*argv, "--out", out, "--resume"], tmp_path)
    line = check_one_line(proc, 2, "--overwrite", f"npz:{data}", "changed")
    assert "SHA-256" in line, line
    assert snapshot(out / "checkpoint") == before
    data.write_bytes(kept)
    proc = pfedwn([*argv, "--out", out, "--resume"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _truncate(files: list[Path]) -> list[Path]:
    """Cut each file to half its size; the files cut."""
    for f in files:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return files


# what is cut short in the newest step: its arrays' data files (orbax's OCDBT database), every
# file of its arrays (their JSON metadata too), every file of the step (its meta as well)
DAMAGE = {
    "arrays": lambda step: [f for f in (step / "state" / "d").rglob("*") if f.is_file()],
    "state": lambda step: [f for f in (step / "state").rglob("*") if f.is_file()],
    "step": lambda step: [f for f in step.rglob("*") if f.is_file()],
}


@pytest.mark.slow
def test_a_truncated_newest_step_falls_back_to_the_previous_one(sweep_reference, tmp_path):
    """The newest step cut short (`DAMAGE`): --resume says in one stderr line which step it
    skipped and which it resumes from (no traceback, no orbax lines) and gives the
    uninterrupted rows."""
    killed = tmp_path / "killed"
    p = _popen([*SWEEP, "--out", killed], tmp_path)
    try:  # two steps, the newer one mid-method (it holds arrays)
        while True:
            found = wait_for_steps(p, killed / "checkpoint", 2)
            if (killed / "checkpoint" / "state" / str(found[-1]) / "state" / "d").is_dir():
                break
            time.sleep(0.01)
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.communicate(timeout=TIMEOUT)
    newest = steps(killed / "checkpoint")[-1]
    for damage, files in DAMAGE.items():
        out = tmp_path / damage
        shutil.copytree(killed, out)
        assert _truncate(files(out / "checkpoint" / "state" / str(newest)))
        proc = pfedwn([*SWEEP, "--out", out, "--resume", "--no-progress"], tmp_path)
        assert proc.returncode == 0, (damage, proc.stderr[-3000:])
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, (damage, proc.stderr[-3000:])
        assert f"step {newest} cannot be" in lines[0], (damage, lines[0])
        assert f"resuming from step {newest - 1}" in lines[0], (damage, lines[0])
        assert len(lines[0]) < 400, (damage, lines[0])
        same_sweep(sweep_reference, out)


# --------------------------------------------------------------------------- Ctrl-C
# seconds between a first and a second Ctrl-C (None: one Ctrl-C only)
GAPS = (None, 0.01, 0.1, 0.3)
# what stderr may say after Ctrl-C (no traceback, no crash)
INTERRUPTED = (
    "checkpoint kept: continue with `pfedwn sweep ... --out",
    "pfedwn sweep: interrupted",
    "interrupted again: exiting at once",
)


@pytest.mark.slow
def test_ctrl_c_once_or_twice_exits_130_and_the_checkpoint_resumes(sweep_reference, tmp_path):
    """SIGINT once, or twice 0.01-0.3 s apart, at a random moment after a committed step (a
    step is saved every round, so often during a save): exit status 130, stderr only the
    interruption lines; --resume then gives the uninterrupted rows."""
    rng = random.Random(0)
    for trial, gap in enumerate(GAPS):
        out = tmp_path / f"trial{trial}"
        p = _popen([*SWEEP, "--out", out, "--no-progress"], tmp_path)
        try:
            wait_for_steps(p, out / "checkpoint")
            time.sleep(rng.uniform(0.0, 0.3))
            os.kill(p.pid, signal.SIGINT)
            if gap is not None:
                time.sleep(gap)
                with contextlib.suppress(ProcessLookupError):  # it may have exited already
                    os.kill(p.pid, signal.SIGINT)
        finally:
            _, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 130, (gap, p.returncode, err[-3000:])
        lines = err.strip().splitlines()
        assert lines and all(line.startswith(INTERRUPTED) for line in lines), (gap, err[-3000:])
        proc = pfedwn([*SWEEP, "--out", out, "--resume", "--no-progress"], tmp_path)
        assert proc.returncode == 0, (gap, proc.stderr[-3000:])
        same_sweep(sweep_reference, out)


# --------------------------------------------------------------------------- two at once
@pytest.mark.slow
def test_a_second_job_into_the_same_out_fails_at_once_and_the_first_completes(tmp_path):
    """While a run writes its checkpoint, a second `pfedwn run` into the same --out (plain,
    --resume or --overwrite) exits 2 at once naming the lock, before any set-up; the first
    ends normally with the numbers of the same run alone."""
    argv = [*RUN, "--rounds", "300", "--quiet"]
    out = tmp_path / "out"
    first = _popen([*argv, "--out", out], tmp_path)
    try:
        wait_for_steps(first, out / "checkpoint")
        t0 = time.perf_counter()
        seconds = [_popen([*argv, "--out", out, *flag], tmp_path) for flag in ([], ["--resume"])]
        seconds.append(_popen([*OTHER_RUN, "--out", out, "--overwrite"], tmp_path))
        done = [p.communicate(timeout=TIMEOUT) for p in seconds]
        elapsed = time.perf_counter() - t0
        still_running = first.poll() is None
    finally:
        _, err = first.communicate(timeout=TIMEOUT)
    assert first.returncode == 0 and not err.strip(), err[-3000:]
    for p, (_, second_err) in zip(seconds, done, strict=True):
        proc = subprocess.CompletedProcess(p.args, p.returncode, "", second_err)
        check_one_line(proc, 2, "in use by another process", str(out / "checkpoint" / ".lock"))
    print(f"second jobs refused in {elapsed:.1f} s")
    assert still_running, f"the second jobs took {elapsed:.1f} s, the first ended meanwhile"
    assert not (out / "checkpoint").exists()
    alone = tmp_path / "alone"
    proc = pfedwn([*argv, "--out", alone], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    same_run(alone, out)


# --------------------------------------------------------------------------- progress in a log
PROGRESS = re.compile(r"^ *(\w+): (run-round|round) (\d+)/(\d+)(?:, .*)? \((\d+\.\d) s\)$")


@pytest.mark.slow
def test_a_sweep_in_a_log_prints_progress_lines_while_it_runs(tmp_path):
    """stderr a pipe (a log): every tenth of each method's run-rounds is a line, printed when
    reached (each line read as it comes, its time taken), not one line at the end."""
    argv = [*SWEEP, "--seeds", "0-2", "--rounds", "20", "--out", tmp_path / "out"]
    p = _popen(argv, tmp_path)
    arrivals: list[tuple[float, str]] = []
    reader = threading.Thread(
        target=lambda: arrivals.extend((time.monotonic(), ln) for ln in p.stderr), daemon=True
    )
    reader.start()
    p.wait(timeout=TIMEOUT)
    reader.join(timeout=60)
    ended = time.monotonic()
    assert p.returncode == 0, "".join(ln for _, ln in arrivals)[-3000:]
    lines = [(t, PROGRESS.match(ln.rstrip("\n"))) for t, ln in arrivals]
    assert all(m is not None for _, m in lines), [ln for _, ln in arrivals]
    for method in ("local", "fedavg"):
        own = [(t, m) for t, m in lines if m.group(1) == method]
        assert {m.group(2) for _, m in own} == {"run-round"}  # 3 runs: run-rounds
        assert [int(m.group(3)) for _, m in own] == list(range(6, 61, 6))  # every tenth of 60
        assert {int(m.group(4)) for _, m in own} == {60}
        seconds = [float(m.group(5)) for _, m in own]
        assert seconds == sorted(seconds) and seconds[0] < seconds[-1], seconds
    assert ended - lines[0][0] > 0.5, "the first line came at the end"
