"""A full disk, for real: a small tmpfs (or a loop-mounted file system) filled to a few KB.

Every write path (atomic files, orbax steps, a run, a sweep) ends in one `DiskFullError`
naming the filesystem and the path (exit status 2 on the command line), leaves no temporary
file or directory behind and removes nothing that was complete before.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from pfedwn_jax import state_store
from pfedwn_jax.io import DiskFullError, atomic_write_json, atomic_write_text, is_disk_full

SIZE_KB = 1024


def _mount_small(directory: Path) -> str | None:
    """Mount a `SIZE_KB` file system on `directory`; None when done, else why not."""
    tmpfs = ["mount", "-t", "tmpfs", "-o", f"size={SIZE_KB}k", "tmpfs", str(directory)]
    tried = subprocess.run(tmpfs, capture_output=True, text=True)
    if tried.returncode == 0:
        return None
    image = directory.parent / "disk.img"
    steps = [
        ["truncate", "-s", f"{SIZE_KB}k", str(image)],
        ["mkfs.ext2", "-q", "-F", str(image)],
        ["mount", "-o", "loop", str(image), str(directory)],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            return (
                f"cannot mount a small file system ({tried.stderr.strip()}; {done.stderr.strip()})"
            )
    return None


@pytest.fixture(scope="module")
def small_disk() -> Iterator[Path]:
    """A mounted `SIZE_KB` file system (skipped, with the reason, where none can be mounted:
    mounting needs root)."""
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root and mount(8)")
    parent = Path(tempfile.mkdtemp(prefix="pfedwn-disk-"))
    directory = parent / "disk"
    directory.mkdir()
    why = _mount_small(directory)
    if why is not None:
        shutil.rmtree(parent, ignore_errors=True)
        pytest.skip(why)
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True)
        shutil.rmtree(parent, ignore_errors=True)


def _fill(disk: Path, free_kb: int) -> None:
    """Empty `disk`, then fill it until about `free_kb` KB are left."""
    for entry in disk.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    free = shutil.disk_usage(disk).free
    with contextlib.suppress(OSError), (disk / "filler").open("wb") as f:
        f.write(b"\0" * max(free - free_kb * 1024, 0))


def _leftovers(directory: Path) -> list[str]:
    """Temporary files or directories (ours or orbax's) anywhere under `directory`."""
    return [
        str(p)
        for p in directory.rglob("*")
        if "orbax-checkpoint-tmp" in p.name or (p.name.startswith(".") and p.suffix == ".tmp")
    ]


def test_an_atomic_write_on_a_full_disk_names_the_disk_and_keeps_the_old_file(small_disk):
    _fill(small_disk, 64)
    target = small_disk / "out" / "results.json"
    atomic_write_json(target, {"complete": True})
    _fill_keep = target.read_text()
    with contextlib.suppress(OSError), (small_disk / "more").open("wb") as f:
        f.write(b"\0" * shutil.disk_usage(small_disk).free)
    with pytest.raises(DiskFullError) as full:
        atomic_write_text(target, "x" * 200_000)
    message = str(full.value)
    assert message.startswith("disk full: ") and "\n" not in message
    assert repr(str(small_disk)) in message and repr(str(target)) in message
    assert target.read_text() == _fill_keep
    assert _leftovers(small_disk) == []


def test_a_state_step_on_a_full_disk_is_one_error_and_leaves_no_temporary_directory(
    small_disk, capfd
):
    _fill(small_disk, 600)
    where = small_disk / "state"
    state_store.save(where, 0, {"a": jnp.ones(4)}, {"step": 0})
    noise = np.random.default_rng(0).random(400_000).astype(np.float32)  # 1.6 MB: no room
    for save in (
        lambda: state_store.save(where, 1, {"a": jnp.asarray(noise)}, {"step": 1}),
        lambda: _async_save(where, 2, {"a": jnp.asarray(noise)}),
    ):
        capfd.readouterr()
        with pytest.raises(DiskFullError, match=r"^disk full: .*mounted at .*writing"):
            save()
        assert _leftovers(small_disk) == []
        assert state_store.latest(where) == 0  # the complete step is kept
        err = capfd.readouterr().err
        assert "Traceback" not in err and "Errno 28" not in err, err


def _async_save(where: Path, step: int, tree: dict) -> None:
    with state_store.Writer(where) as writer:
        writer.save(step, tree, {"step": step})


def test_disk_full_is_recognised_in_a_library_error_text():
    assert is_disk_full(ValueError("Error writing x: [OS error 28: No space left on device]"))
    assert is_disk_full(RuntimeError("wrapped").with_traceback(None)) is False
    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError as e:
            raise RuntimeError("orbax failed") from e
    except RuntimeError as e:
        assert is_disk_full(e)


def test_the_command_line_reports_a_full_disk_in_a_library_error_as_one_line(capsys):
    from pfedwn_jax.cli.common import run_command

    def work():
        try:
            raise OSError(28, "No space left on device", "/x/state/1/d/abc")
        except OSError as e:
            raise ValueError("Error writing local file: [OS error 28: No space left]") from e

    assert run_command("pfedwn run", work) == 2
    err = capsys.readouterr().err
    assert err.startswith("pfedwn run: error: disk full: ") and "'/x/state/1/d/abc'" in err


ARGV = ["--model", "logreg", "--num-neighbors", "3", "--rounds", "2"]


@pytest.mark.parametrize(
    "command, free_kb",
    [
        pytest.param("run", 0, marks=pytest.mark.slow),  # the first block file finds no room
        pytest.param("run", 24, marks=pytest.mark.slow),  # a state step or the saved models
        pytest.param("run", 96, marks=pytest.mark.slow),
        pytest.param("sweep", 0, marks=pytest.mark.slow),
        pytest.param("sweep", 24, marks=pytest.mark.slow),
        pytest.param("sweep", 96, marks=pytest.mark.slow),
    ],
)
def test_a_run_and_a_sweep_on_a_full_disk_end_in_one_line_with_status_2(
    small_disk, command, free_kb
):
    """In a process of its own: the status is the process's (an abort at exit shows)."""
    _fill(small_disk, free_kb)
    out = small_disk / "out"
    argv = [command, *ARGV, "--algorithms", "local,fedavg", "--out", str(out)]
    if command == "run":
        argv += ["--save-models", "--no-plot", "--quiet"]
    else:
        argv += ["--seeds", "0-1", "--grid", "lr=0.01,0.05", "--no-progress"]
    code = "import sys; from pfedwn_jax.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert lines[-1].startswith(f"pfedwn {command}: error: disk full"), done.stderr
    assert [line for line in lines if "error" in line or "Traceback" in line] == [lines[-1]]
    assert f"mounted at {str(small_disk)!r}" in lines[-1]
    assert _leftovers(small_disk) == []
