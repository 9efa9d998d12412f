"""Files and logs: output paths checked up front, permissions, stale outputs and temp files,
one-line OS errors, plain progress lines in logs, the time column after a resume."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
import types

import pytest
from helpers import TINY_RUN

from pfedwn_jax import io, run
from pfedwn_jax.cli import describe_os_error, main
from pfedwn_jax.cli import run as cli_run
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.results.report import RESUMED_NOTE, format_table
from pfedwn_jax.runner import job as runner_job
from pfedwn_jax.runner import progress as progress_mod

TINY = {**TINY_RUN, "algorithms": ("local", "fedavg")}
TINY_FLAGS = ["--model", "logreg", "--num-neighbors", "3", "--gamma-th", "1", "--eps", "0.12"]
IS_ROOT = os.geteuid() == 0


@pytest.fixture
def umask_002():
    """Run with umask 0o002 (files 0664), so the test tells it from 0600 and from 0644."""
    old = os.umask(0o002)
    yield 0o664
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _read_only_dir(tmp_path, monkeypatch):
    """A directory no file can be created in: chmod 555, or (root writes anyway) a patched
    `mkstemp` that fails like a read-only directory."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if IS_ROOT:

        def refuse(*args, **kwargs):
            raise PermissionError(errno.EACCES, "Permission denied", kwargs.get("dir"))

        monkeypatch.setattr(io.tempfile, "mkstemp", refuse)
    else:
        ro.chmod(0o555)
    return ro


def _one_line_error(capsys, *names: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for name in names:
        assert name in err, (name, err)
    return err


# --------------------------------------------------------------------------- path checks
def test_check_writable_dir_accepts_new_and_existing_dirs(tmp_path):
    assert io.check_writable_dir(tmp_path) == tmp_path
    new = tmp_path / "a" / "b"
    assert io.check_writable_dir(new) == new
    assert not (tmp_path / "a").exists()  # nothing created
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_check_writable_dir_refuses_files_and_paths_under_files(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(ValueError, match=r"'.*/f' is a file"):
        io.check_writable_dir(f, "--out")
    with pytest.raises(ValueError, match=r"'.*/f/sub/dir' lies under the file '.*/f'"):
        io.check_writable_dir(f / "sub" / "dir", "--out")
    with pytest.raises(ValueError, match="is a directory"):
        io.check_writable_file(tmp_path, "--plot")
    with pytest.raises(ValueError, match="lies under the file"):
        io.check_writable_file(f / "h.png", "--plot")


def test_check_writable_dir_refuses_a_read_only_dir(tmp_path, monkeypatch):
    ro = _read_only_dir(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match=r"'.*/ro/out'.*cannot create files in '.*/ro'"):
        io.check_writable_dir(ro / "out", "--out")


def test_run_checks_the_out_dir_before_any_work(tmp_path, capsys, monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("ran before checking --out")

    monkeypatch.setattr(cli_run, "configs_from_args", no_work)
    f = tmp_path / "file"
    f.write_text("x")
    for out in (f, f / "sub"):
        assert main(["run", "--out", str(out), "--quiet"]) == 2
        _one_line_error(capsys, "--out", str(out))
    ro = _read_only_dir(tmp_path, monkeypatch)
    assert main(["run", "--out", str(ro / "x"), "--quiet"]) == 2
    _one_line_error(capsys, str(ro / "x"), "cannot create files")


def test_neighbors_and_data_show_check_their_outputs_first(tmp_path, capsys, monkeypatch):
    f = tmp_path / "file"
    f.write_text("x")
    monkeypatch.setattr("pfedwn_jax.cli.neighbors.place_network", None)  # never reached
    monkeypatch.setattr("pfedwn_jax.cli.data.make_federated", None)
    assert main(["neighbors", "--json", str(f / "t.json")]) == 2
    _one_line_error(capsys, "--json", str(f / "t.json"))
    assert main(["neighbors", "--plot", str(tmp_path)]) == 2
    _one_line_error(capsys, "--plot", "is a directory")
    assert main(["data", "show", "--plot", str(f / "d.png")]) == 2
    _one_line_error(capsys, "--plot", str(f / "d.png"))


def test_run_api_checks_the_checkpoint_path_first(tmp_path, monkeypatch):
    monkeypatch.setattr(runner_job, "setup_runs", None)  # never reached
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match=r"checkpoint .* lies under the file"):
        run(ExperimentConfig(**TINY), progress=False, checkpoint=f / "ckpt.npz")


def test_os_error_during_the_work_is_one_line_naming_the_path(tmp_path, capsys, monkeypatch):
    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    def failing_disk(fd):
        raise OSError(errno.EIO, "Input/output error")

    out = tmp_path / "t.json"
    monkeypatch.setattr(io.os, "fsync", failing_disk)
    assert main(["neighbors", "--num-neighbors", "3", "--json", str(out)]) == 1
    _one_line_error(capsys, "Input/output error", str(out))
    monkeypatch.setattr(io.os, "fsync", disk_full)  # a full disk: named, status 2
    assert main(["neighbors", "--num-neighbors", "3", "--json", str(out)]) == 2
    _one_line_error(capsys, "disk full: no space left on the filesystem mounted at", str(out))
    assert [p.name for p in tmp_path.iterdir()] == []  # no temp file left behind
    assert describe_os_error(OSError("plain")) == "plain"
    assert describe_os_error(OSError(2, "No such file", "a", None, "b")) == "No such file: a -> b"


# --------------------------------------------------------------------------- permissions
def test_atomic_files_follow_the_umask(tmp_path, umask_002):
    assert _mode(io.atomic_write_text(tmp_path / "a.txt", "x")) == umask_002
    os.umask(0o077)
    assert _mode(io.atomic_write_json(tmp_path / "b.json", {})) == 0o600


def test_neighbors_files_follow_the_umask(tmp_path, capsys, umask_002):
    pytest.importorskip("matplotlib")
    js, png = tmp_path / "n.json", tmp_path / "h.png"
    argv = ["neighbors", "--num-neighbors", "3", "--json", str(js), "--plot", str(png)]
    assert main(argv) == 0
    assert _mode(js) == umask_002 and _mode(png) == umask_002


def test_data_show_plot_follows_the_umask(tmp_path, capsys, umask_002):
    pytest.importorskip("matplotlib")
    png = tmp_path / "d.png"
    assert main(["data", "show", "--clients", "4", "--plot", str(png)]) == 0
    assert _mode(png) == umask_002


# --------------------------------------------------------------------------- stale outputs
def test_rerun_removes_the_previous_runs_outputs(tmp_path, capsys, umask_002):
    out = tmp_path / "out"
    out.mkdir()
    for name in cli_run.OUTPUTS:  # a previous run (several cases, pFedWN, plots) wrote these
        (out / name).write_text("old")
    (out / "notes.txt").write_text("mine")
    argv = ["run", *TINY_FLAGS, "--algorithms", "local", "--rounds", "1"]
    assert main([*argv, "--out", str(out), "--quiet", "--no-plot"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "results.json"]
    assert _mode(out / "results.json") == umask_002
    assert json.loads((out / "results.json").read_text())["config"]["rounds"] == 1


def test_remove_stale_outputs_keeps_what_was_written(tmp_path):
    for name in (cli_run.RESULTS, cli_run.CURVE, cli_run.PI_PLOT):
        (tmp_path / name).write_text("x")
    written = [tmp_path / cli_run.RESULTS, tmp_path / cli_run.CURVE]
    assert cli_run.remove_stale_outputs(tmp_path, written) == [tmp_path / cli_run.PI_PLOT]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([cli_run.RESULTS, cli_run.CURVE])


# --------------------------------------------------------------------------- temp leftovers
def test_next_write_removes_leftover_temp_files_only(tmp_path):
    old = time.time() - 60
    names = {
        "killed": ".results.json.ab12cd_9.tmp",  # a killed write: removed
        "young": ".table.txt.zz99yy00.tmp",  # may be a write just starting: kept
        "live": ".curve.png.qwertyui.tmp",  # locked by a write in progress: kept
        "other": ".notes.tmp",  # not our pattern: kept
        "plain": "data.tmp",
    }
    for key, name in names.items():
        (tmp_path / name).write_text(key)
        if key != "young":
            os.utime(tmp_path / name, (old, old))
    with open(tmp_path / names["live"]) as live:
        fcntl.flock(live.fileno(), fcntl.LOCK_EX)
        io.atomic_write_text(tmp_path / "results.json", "new")
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {"results.json", *names.values()} - {names["killed"]}


def test_remove_stale_temps_reports_and_tolerates_a_missing_dir(tmp_path):
    leftover = tmp_path / ".x.json.00000000.tmp"
    leftover.write_text("")
    os.utime(leftover, (0, 0))
    assert io.remove_stale_temps(tmp_path) == [leftover]
    assert io.remove_stale_temps(tmp_path / "missing") == []


# --------------------------------------------------------------------------- logs
def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(capsys):
    cfg = ExperimentConfig(**{**TINY, "algorithms": ("local",), "rounds": 3})
    run(cfg, progress=True, block=1)
    err = capsys.readouterr().err
    lines = [ln.strip() for ln in err.splitlines() if "round" in ln]
    assert [ln.split(",")[0] for ln in lines] == [f"local: round {r}/3" for r in (1, 2, 3)]
    assert "target_acc=" in lines[-1] and "\r" not in err


def test_line_progress_prints_every_tenth_and_the_last(capsys):
    bar = progress_mod.LineProgress("fedavg", total=25, initial=3)
    for _ in range(22):
        bar.update(1)
        bar.set_postfix(target_acc="0.500")
    bar.close()
    rounds = [
        int(ln.split("round ")[1].split("/")[0]) for ln in capsys.readouterr().err.splitlines()
    ]
    assert rounds == [4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 25]


def test_line_progress_prints_at_least_every_30_seconds(capsys, monkeypatch):
    """A slow job in a log: a line once 30 s have passed since the last, before the tenth."""
    now = [0.0]
    monkeypatch.setattr(progress_mod, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    bar = progress_mod.LineProgress("pfedwn", total=1000, unit="run-round")
    for _ in range(7):  # 10 s per update, a tenth is 100
        now[0] += 10.0
        bar.update(1)
        bar.set_postfix()
    assert capsys.readouterr().err.splitlines() == [
        "   pfedwn: run-round 3/1000 (30.0 s)",
        "   pfedwn: run-round 6/1000 (60.0 s)",
    ]


def test_progress_bar_on_a_terminal_is_tqdm(monkeypatch):
    monkeypatch.setattr(progress_mod.sys.stderr, "isatty", lambda: True, raising=False)
    bar = progress_mod.progress_bar("local", 3, 0, True)
    bar.close()
    assert isinstance(bar, progress_mod.tqdm)
    quiet = progress_mod.progress_bar("local", 3, 0, False)
    assert isinstance(quiet, progress_mod.tqdm) and quiet.disable


def _interrupt_at(method: str, rounds: int):
    """A `run` callback that interrupts the run once `method` has done `rounds` rounds."""

    def callback(name, rounds_done, metrics):
        if (name, rounds_done) == (method, rounds):
            raise KeyboardInterrupt

    return callback


def test_resumed_method_time_is_marked_in_result_and_table(tmp_path):
    ckpt, cfg = tmp_path / "ckpt.npz", ExperimentConfig(**TINY)
    with pytest.raises(KeyboardInterrupt):  # as if killed after fedavg's round 2 of 3
        run(cfg, progress=False, checkpoint=ckpt, block=1, callback=_interrupt_at("fedavg", 2))
    res = run(cfg, progress=False, checkpoint=ckpt, resume=True)
    local, fedavg = res.methods["local"]["timings"], res.methods["fedavg"]["timings"]
    assert "resumed_at" not in local and fedavg["resumed_at"] == [2]
    assert len(fedavg["round_s"]) == 3
    assert fedavg["total_s"] == pytest.approx(fedavg["compile_s"] + sum(fedavg["round_s"]))
    table = format_table(res).splitlines()
    assert table[-1] == RESUMED_NOTE
    assert table[-2].startswith("fedavg") and table[-2].endswith("*")
    assert not table[-3].endswith("*")
