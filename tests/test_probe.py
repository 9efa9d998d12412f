"""A probe of bad inputs through every entry point, as a new user would try them.

Each row is one input and the words its error must contain:

- `API`: a Python call that must raise a `ValueError` naming the problem (never a traceback
  from inside JAX, never another exception type);
- `HANDLED`: inputs that are legal but suspicious, checked to end in a clamp or a warning;
- `CLI`: a `pfedwn` command line (a real process) that must exit with status 2 and one line
  on stderr naming the problem, without "Traceback";
- `SCRIPTS`: the same for `scripts/robustness.py` and `scripts/reproduce.py`.

Grow it by adding rows. `{name}` in a command line is replaced by a path of `Files` or of
`Checkpoints` (output directories holding checkpoints: interrupted, busy, of other data, of an
earlier version, damaged). The subprocess rows are in the slow tier (about a minute on 2
cores); the in-process rows are quick. What needs a process killed or interrupted at a chosen
moment (kill -9 then a rerun, --resume, --overwrite; a double Ctrl-C; two runs at once) is
driven through real processes in `test_checkpoint_processes.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
# every run that might start by mistake stays tiny
TINY = ["--model", "logreg", "--num-neighbors", "3", "--rounds", "1", "--algorithms", "local"]


@dataclasses.dataclass(frozen=True)
class Files:
    """Bad files the rows point at (made once per module)."""

    dir: Path  # an existing directory
    file: Path  # a regular file (not a directory)
    npy: Path  # a single array saved with np.save
    text: Path  # a text file that is not an archive
    truncated: Path  # a results JSON cut short
    binary: Path  # bytes that are not UTF-8
    foreign: Path  # valid JSON of something else
    bad_toml: Path  # not TOML
    no_y: Path  # an .npz without y_train


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Files:
    d = tmp_path_factory.mktemp("probe")
    (d / "file").write_text("x")
    np.save(d / "a.npy", np.zeros((5, 4, 4), np.uint8))
    (d / "text.npz").write_text("not an archive")
    (d / "truncated.json").write_text('{"schema": "pfedwn-results/1", "config": {')
    (d / "binary.json").write_bytes(b"\x89PNG\x00\xff\xfe")
    (d / "foreign.json").write_text('{"schema": "pfedwn-results/1"}')
    (d / "bad.toml").write_text("rounds = = 3\n")
    np.savez(d / "no_y.npz", x_train=np.zeros((5, 4, 4), np.uint8))
    return Files(
        d, d / "file", d / "a.npy", d / "text.npz", d / "truncated.json", d / "binary.json",
        d / "foreign.json", d / "bad.toml", d / "no_y.npz",
    )  # fmt: skip


# the run every checkpoint below was interrupted in (the CLI's TINY with 3 rounds)
CKPT_RUN = dict(model="logreg", num_neighbors=3, rounds=3, algorithms=("local",))
CKPT_ARGS = [*TINY, "--rounds", "3"]


class _Stop(Exception):
    pass


def _interrupted(out: Path, **fields: Any) -> Path:
    """`out/checkpoint` of `CKPT_RUN` (with `fields`) stopped after round 2 (steps 1 and 2)."""
    from pfedwn_jax import run
    from pfedwn_jax.experiment import ExperimentConfig

    def stop(name: str, rounds_done: int, metrics: Any) -> None:
        if rounds_done == 2:
            raise _Stop

    with contextlib.suppress(_Stop):
        run(ExperimentConfig(**{**CKPT_RUN, **fields}), progress=False, block=1,
            checkpoint=out / "checkpoint", callback=stop)  # fmt: skip
    return out


@dataclasses.dataclass(frozen=True)
class Checkpoints:
    """Output directories holding a checkpoint (made once per module, never changed)."""

    interrupted: Path  # `CKPT_RUN` stopped after round 2
    busy: Path  # the same, its lock held by this test process (another job writing it)
    data: Path  # the npz file of `changed`
    changed: Path  # `CKPT_RUN` on `npz:data`, whose content changed since
    old: Path  # an earlier version's checkpoint (state.npz)
    a_file: Path  # `checkpoint` is a regular file
    truncated: Path  # `CKPT_RUN` whose newest step's files are cut short (copy before use)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> Any:
    from pfedwn_jax.runner.checkpoint import _lock

    d = tmp_path_factory.mktemp("checkpoints")
    interrupted = _interrupted(d / "interrupted")
    busy = d / "busy"
    shutil.copytree(interrupted, busy)
    data = d / "data.npz"
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 255, (200, 4, 4, 1), dtype=np.uint8), rng.integers(0, 3, 200)
    np.savez(data, x_train=x, y_train=y)
    changed = _interrupted(d / "changed", dataset=f"npz:{data}")
    np.savez(data, x_train=x[::-1], y_train=y[::-1])  # the same samples, another order
    (d / "old" / "checkpoint").mkdir(parents=True)
    (d / "old" / "checkpoint" / "state.npz").write_bytes(b"an earlier version's checkpoint")
    (d / "a_file").mkdir()
    (d / "a_file" / "checkpoint").write_text("not a directory")
    truncated = d / "truncated"
    shutil.copytree(interrupted, truncated)
    state = truncated / "checkpoint" / "state"
    newest = max(int(p.name) for p in state.iterdir() if p.name.isdigit())
    for f in (state / str(newest)).rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    lock = _lock(busy / "checkpoint")
    yield Checkpoints(interrupted, busy, data, changed, d / "old", d / "a_file", truncated)
    lock.close()


def _scratch(path: Path) -> Path:
    """A fresh copy of the output directory `path` (for a row that may write into it)."""
    copy = path.with_name(f"{path.name}-{os.getpid()}-{len(list(path.parent.iterdir()))}")
    shutil.copytree(path, copy)
    return copy


# --------------------------------------------------------------------------- the API
def _config(**kw: Any) -> Any:
    from pfedwn_jax.experiment import ExperimentConfig

    return ExperimentConfig(**kw)


def _run(config: Any = None, **kw: Any) -> Any:
    from pfedwn_jax import run

    cfg = _config(model="logreg", num_neighbors=3, rounds=1, algorithms=("local",))
    return run(cfg if config is None else config, progress=False, **kw)


def _wireless(name: str) -> Callable[..., Any]:
    import pfedwn_jax.wireless as w

    return getattr(w, name)


def _sweep(**kw: Any) -> Any:
    import pfedwn_jax

    cfg = _config(model="logreg", num_neighbors=3, rounds=1, algorithms=("local",))
    return pfedwn_jax.sweep(cfg, progress=False, **kw)


def _ckpt_run(out: Path, **kw: Any) -> Any:
    """`run` of `CKPT_RUN` (its fields replaced by `fields`) checkpointed into `out`."""
    fields = kw.pop("fields", {})
    return _run(_config(**{**CKPT_RUN, **fields}), checkpoint=out / "checkpoint", **kw)


def _on_a_small_device(call: Callable[[], Any]) -> Any:
    """`call()` where every device reports 1 MiB free (the memory plan refuses first)."""
    from pfedwn_jax.runner import memory

    with mock.patch.object(memory, "available_bytes", lambda device=None: 1 << 20):
        return call()


def _estimate() -> Any:
    from pfedwn_jax.runner.memory import MemoryEstimate

    return MemoryEstimate(100, 0, 0, 0, 0, shared=50, method="fedavg")


def _result_load(path: Path) -> Any:
    from pfedwn_jax import Result

    return Result.load(path)


def _dataset(name: str) -> Any:
    from pfedwn_jax.data import load_dataset

    return load_dataset(name)


XY = np.array([[0.0, 0.0], [3.0, 4.0], [10.0, 0.0]])

# (id, call with the Files, words the ValueError must contain)
API: list[tuple[str, Callable[[Files], Any], str]] = [
    ("config rounds 0", lambda f: _config(rounds=0), "rounds"),
    ("config rounds 2.5", lambda f: _config(rounds=2.5), "rounds"),
    ("config lr negative", lambda f: _config(lr=-1.0), "lr"),
    ("config lr nan", lambda f: _config(lr=float("nan")), "lr"),
    ("config eps 0", lambda f: _config(eps=0.0), "eps"),
    ("config eps 1.5", lambda f: _config(eps=1.5), "eps"),
    ("config model", lambda f: _config(model="transformer"), "model"),
    ("config algorithm", lambda f: _config(algorithms=("nosuch",)), "unknown algorithm"),
    ("config algorithms empty", lambda f: _config(algorithms=""), "algorithms"),
    ("config batch 0", lambda f: _config(batch_size=0), "batch_size"),
    ("config neighbors 0", lambda f: _config(num_neighbors=0), "num_neighbors"),
    ("config mode", lambda f: _config(mode="star"), "mode"),
    ("config target", lambda f: _config(target=99), "target"),
    ("config channel field", lambda f: _config(channel={"bogus": 1}), "channel.bogus"),
    ("config hparam", lambda f: _config(hparams={"fedprox": {"nosuch": 1}}), "nosuch"),
    ("config link_failure ideal", lambda f: _config(link_failure=0.5), "link_failure"),
    ("config stale ideal", lambda f: _config(stale=True), "stale"),
    ("config momentum 1", lambda f: _config(momentum=1.0), "momentum"),
    ("config seed negative", lambda f: _config(seed=-1), "seed"),
    ("config partition", lambda f: _config(partition="nosuch"), "partition"),
    ("config unknown field", lambda f: _config().from_dict({"bogus": 1}), "unknown field"),
    ("config missing toml", lambda f: _config().from_toml(f.dir / "no.toml"), "not found"),
    ("config bad toml", lambda f: _config().from_toml(f.bad_toml), "bad.toml"),
    ("run not a config", lambda f: _run("x"), "ExperimentConfig"),
    ("run divergence policy", lambda f: _run(on_divergence="maybe"), "on_divergence"),
    ("run checkpoint_every 0", lambda f: _run(checkpoint_every=0), "checkpoint_every"),
    ("run checkpoint is a file", lambda f: _run(checkpoint=f.file), "checkpoint"),
    ("run npz is a .npy", lambda f: _run(_config(dataset=f"npz:{f.npy}")), "holds one array"),
    ("dataset unknown", lambda f: _dataset("nosuch"), "unknown dataset"),
    ("dataset npz missing", lambda f: _dataset(f"npz:{f.dir / 'no.npz'}"), "not found"),
    ("dataset npz not an archive", lambda f: _dataset(f"npz:{f.text}"), "cannot read"),
    ("dataset npz without labels", lambda f: _dataset(f"npz:{f.no_y}"), "must contain"),
    ("results truncated", lambda f: _result_load(f.truncated), "not valid JSON"),
    ("results binary", lambda f: _result_load(f.binary), "not valid JSON"),
    ("results a directory", lambda f: _result_load(f.dir), "is a directory"),
    ("results foreign JSON", lambda f: _result_load(f.foreign), "has no 'config'"),
    (
        "perr 2M neighbors",
        lambda f: _wireless("error_probability")(np.zeros(2), np.ones((2_000_000, 2)), 5.0),
        "sparse_error_probability",
    ),
    (
        "perr target shape",
        lambda f: _wireless("error_probability")(np.zeros(3), XY, 5.0),
        "target_xy",
    ),
    ("perr gamma negative", lambda f: _wireless("error_probability")(XY[0], XY, -1), "gamma_th"),
    (
        "perr nan position",
        lambda f: _wireless("error_probability")(XY[0], XY + np.nan, 5.0),
        "finite",
    ),
    (
        "perr moments",
        lambda f: _wireless("error_probability")(XY[0], XY, 5.0, moments="x"),
        "moments",
    ),
    ("select eps 2", lambda f: _wireless("select_neighbors")(np.zeros(3), 2.0), "eps"),
    ("select perr 1.5", lambda f: _wireless("select_neighbors")(np.array([1.5]), 0.1), "perr"),
    (
        "montecarlo too many draws",
        lambda f: _wireless("simulate_links")(0, XY[0], XY[1:], 5.0, 10**9),
        "split the draws",
    ),
    (
        "candidate lists of a million nodes",
        lambda f: _wireless("candidate_neighbors")(np.ones((10**6, 2)), k=10**6 - 1),
        "of host memory",
    ),
    ("ceiling moments", lambda f: _wireless("perr_ceiling")(moments="x"), "moments"),
    ("channel subchannels 0", lambda f: _wireless("ChannelParams")(num_subchannels=0), "num_sub"),
    ("sweep seeds text", lambda f: _sweep(seeds="a"), "seeds"),
    ("sweep seeds twice", lambda f: _sweep(seeds="1,1"), "twice"),
    ("sweep grid field", lambda f: _sweep(grid={"bogus": [1]}), "bogus"),
    (
        "memory plan over budget",
        lambda f: __import__("pfedwn_jax.runner.memory").runner.memory.check_fits(
            _estimate(), 500, runs=8
        ),
        "runs per program",
    ),
    (
        "cpu devices 0",
        lambda f: __import__("pfedwn_jax.devices").devices.use_cpu_devices(0),
        "count",
    ),
    (
        "run whose memory plan exceeds the device",
        lambda f: _on_a_small_device(_run),
        "free on a device",
    ),
    (
        "sweep whose memory plan exceeds the device",
        lambda f: _on_a_small_device(lambda: _sweep(seeds="0-3")),
        "free on a device",
    ),
    (
        "sweep resume and overwrite",
        lambda f: _sweep(checkpoint=f.dir / "c", resume=True, overwrite=True),
        "exclude each other",
    ),
    ("sweep checkpoint is a file", lambda f: _sweep(checkpoint=f.file), "checkpoint"),
]

# (id, call with the Checkpoints, words of the ValueError): checkpoints through the API
CKPT_API: list[tuple[str, Callable[[Checkpoints], Any], str]] = [
    ("run into an interrupted checkpoint", lambda c: _ckpt_run(c.interrupted), "resume=True"),
    (
        "run of other settings into an interrupted checkpoint",
        lambda c: _ckpt_run(c.interrupted, fields={"rounds": 1}),
        "overwrite=True",
    ),
    (
        "sweep into an interrupted checkpoint",
        lambda c: _sweep(checkpoint=c.interrupted / "checkpoint"),
        "resume=True",
    ),
    (
        "run resume with other rounds",
        lambda c: _ckpt_run(c.interrupted, fields={"rounds": 5}, resume=True),
        "rounds 3 then, 5 now",
    ),
    (
        "run resume with another lr",
        lambda c: _ckpt_run(c.interrupted, fields={"lr": 0.5}, resume=True),
        "lr 0.05 then, 0.5 now",
    ),
    (
        "run resume with another method",
        lambda c: _ckpt_run(c.interrupted, fields={"algorithms": ("fedavg",)}, resume=True),
        "algorithms ['local'] then, ['fedavg'] now",
    ),
    (
        "run resume with kept records",
        lambda c: _ckpt_run(c.interrupted, resume=True, records=("pi",)),
        "records kept",
    ),
    (
        "run resume after the npz data changed",
        lambda c: _ckpt_run(c.changed, fields={"dataset": f"npz:{c.data}"}, resume=True),
        "changed since it was written: SHA-256",
    ),
    (
        "run resume and overwrite",
        lambda c: _ckpt_run(c.interrupted, resume=True, overwrite=True),
        "exclude each other",
    ),
    ("run into a busy checkpoint", lambda c: _ckpt_run(c.busy), "in use by another process"),
    (
        "run resume of a busy checkpoint",
        lambda c: _ckpt_run(c.busy, resume=True),
        "in use by another process",
    ),
    (
        "run overwrite of a busy checkpoint",
        lambda c: _ckpt_run(c.busy, overwrite=True),
        "in use by another process",
    ),
    (
        "run resume of an earlier version's checkpoint",
        lambda c: _ckpt_run(c.old, resume=True),
        "earlier version (state.npz)",
    ),
    ("run into an earlier version's checkpoint", lambda c: _ckpt_run(c.old), "resume=True"),
    ("run checkpoint path is a file", lambda c: _ckpt_run(c.a_file), "is a file"),
]


@pytest.mark.parametrize(("call", "words"), [a[1:] for a in API], ids=[a[0] for a in API])
def test_api_bad_input_is_a_named_value_error(files, call, words):
    with pytest.raises(ValueError) as err:
        call(files)
    assert words in str(err.value), str(err.value)
    assert "Traceback" not in str(err.value) and len(str(err.value)) < 1500


@pytest.mark.parametrize(("call", "words"), [a[1:] for a in CKPT_API], ids=[a[0] for a in CKPT_API])
def test_api_bad_checkpoint_input_is_a_named_value_error_and_keeps_it(ckpts, call, words):
    before = sorted(str(p) for p in ckpts.interrupted.rglob("*"))
    with pytest.raises(ValueError) as err:
        call(ckpts)
    assert words in str(err.value), str(err.value)
    assert "Traceback" not in str(err.value) and len(str(err.value)) < 1500
    assert sorted(str(p) for p in ckpts.interrupted.rglob("*")) == before


# --------------------------------------------------------------------------- handled
def _clamped(files: Files) -> None:
    from pfedwn_jax.experiment.setup import setup

    cfg = _config(model="logreg", num_neighbors=3, batch_size=10**6)
    assert setup(cfg).ctx.batch_size < 10**4


def _stray_label(files: Files) -> None:
    y = np.arange(40) % 4
    y[0] = 1000
    np.savez(files.dir / "stray.npz", x_train=np.zeros((40, 4, 4), np.uint8), y_train=y)
    assert _dataset(f"npz:{files.dir / 'stray.npz'}").num_classes == 1001


def _no_neighbor(files: Files) -> None:
    from pfedwn_jax.experiment.federation import build_federation

    assert build_federation(_config(num_neighbors=4, gamma_th=1e4)).num_slots == 1


def _eps_ceiling(files: Files) -> None:
    from pfedwn_jax.experiment import config

    config._warn_once.cache_clear()
    _config(eps=0.3)


# (id, call, words of the one warning it logs)
HANDLED: list[tuple[str, Callable[[Files], None], str]] = [
    ("batch larger than every client", _clamped, "larger than every client"),
    ("one stray label", _stray_label, "only 5 distinct labels"),
    ("no neighbor selected", _no_neighbor, "no neighbor is selected"),
    ("eps above the ceiling", _eps_ceiling, "above 0.1353"),
]


@pytest.mark.parametrize(("call", "words"), [h[1:] for h in HANDLED], ids=[h[0] for h in HANDLED])
def test_suspicious_input_is_handled_with_a_warning(files, caplog, call, words):
    with caplog.at_level(logging.WARNING, logger="pfedwn_jax"):
        call(files)
    assert words in caplog.text, caplog.text


# (id, call with the Checkpoints, words of the one warning it logs; None: no warning)
CKPT_HANDLED: list[tuple[str, Callable[[Checkpoints], None], str | None]] = [
    (
        "resume with the newest step truncated",
        lambda c: _ckpt_run(_scratch(c.truncated), resume=True),
        "cannot be read",
    ),
    (
        "resume with no checkpoint yet",
        lambda c: _ckpt_run(c.interrupted.parent / "nothing-to-resume", resume=True),
        None,
    ),
]


@pytest.mark.parametrize(
    ("call", "words"), [h[1:] for h in CKPT_HANDLED], ids=[h[0] for h in CKPT_HANDLED]
)
def test_suspicious_checkpoint_is_handled_with_one_warning(ckpts, caplog, call, words):
    """One line of ours naming what was done (a step skipped, the one resumed from), no
    lines from orbax."""
    with caplog.at_level(logging.WARNING):
        call(ckpts)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if words is None:
        assert not warnings, warnings
    else:
        assert len(warnings) == 1 and words in warnings[0], warnings
        assert "resuming from step 1" in warnings[0], warnings


# --------------------------------------------------------------------------- processes
# (id, argv after `pfedwn`, words of the one stderr line)
CLI: list[tuple[str, list[str], str]] = [
    ("run rounds 0", ["run", *TINY, "--rounds", "0"], "rounds"),
    ("run rounds 2.5", ["run", *TINY, "--rounds", "2.5"], "--rounds"),
    ("run lr nan", ["run", *TINY, "--lr", "nan"], "lr"),
    ("run eps above ceiling", ["run", *TINY, "--eps", "0.2"], "above 0.1353"),
    ("run eps 1.5", ["run", *TINY, "--eps", "1.5"], "eps"),
    ("run model", ["run", *TINY, "--model", "nosuch"], "model"),
    ("run algorithm", ["run", *TINY, "--algorithms", "nosuch"], "unknown algorithm"),
    ("run batch 0", ["run", *TINY, "--batch-size", "0"], "batch_size"),
    ("run mode", ["run", *TINY, "--mode", "star"], "mode"),
    ("run too many neighbors", ["run", *TINY, "--num-neighbors", "100000"], "num_neighbors"),
    ("run target", ["run", *TINY, "--target", "99"], "target"),
    ("run cases mismatch", ["run", *TINY, "--gamma-th", "5,10", "--target", "1,2,3"], "per case"),
    ("run out empty", ["run", *TINY, "--out", ""], "must not be empty"),
    ("run out a file", ["run", *TINY, "--out", "{file}"], "is a file"),
    ("run out under a file", ["run", *TINY, "--out", "{file}/sub"], "lies under the file"),
    ("run config missing", ["run", *TINY, "--config", "{dir}/no.toml"], "not found"),
    ("run config not TOML", ["run", *TINY, "--config", "{bad_toml}"], "bad.toml"),
    ("run hparams entry", ["run", *TINY, "--hparams", "fedprox.mu="], "hparams"),
    ("run channel field", ["run", *TINY, "--channel", "bogus=1"], "channel"),
    ("run npz is a .npy", ["run", *TINY, "--dataset", "npz:{npy}"], "holds one array"),
    ("run dataset", ["run", *TINY, "--dataset", "nosuch"], "unknown dataset"),
    ("run checkpoint every -1", ["run", *TINY, "--checkpoint-every", "-1"], "checkpoint-every"),
    ("run resume without", ["run", *TINY, "--resume", "--checkpoint-every", "0"], "--resume"),
    ("run bogus flag", ["run", "--bogus-flag"], "--bogus-flag"),
    ("neighbors eps above ceiling", ["neighbors", "--eps", "0.2"], "above 0.1353"),
    ("neighbors eps nan", ["neighbors", "--eps", "nan"], "eps"),
    ("neighbors 0 neighbors", ["neighbors", "--num-neighbors", "0"], "num-neighbors"),
    ("neighbors gamma negative", ["neighbors", "--gamma-th", "-1"], "gamma_th"),
    ("neighbors moments", ["neighbors", "--moments", "nosuch"], "--moments"),
    ("neighbors json a dir", ["neighbors", "--json", "{dir}"], "is a directory"),
    ("neighbors plot under a file", ["neighbors", "--plot", "{file}/h.png"], "under the file"),
    ("data clients 0", ["data", "show", "--clients", "0"], "clients"),
    ("data dataset", ["data", "show", "--dataset", "nosuch"], "unknown dataset"),
    ("data scheme", ["data", "show", "--scheme", "nosuch"], "--scheme"),
    ("sweep seeds text", ["sweep", *TINY, "--seeds", "a"], "seeds"),
    ("sweep seeds twice", ["sweep", *TINY, "--seeds", "1,1"], "twice"),
    ("sweep grid field", ["sweep", *TINY, "--grid", "bogus=1"], "bogus"),
    ("sweep grid empty value", ["sweep", *TINY, "--grid", "lr="], "empty value"),
    ("sweep out empty", ["sweep", *TINY, "--out", ""], "must not be empty"),
    ("sweep eps above ceiling", ["sweep", *TINY, "--eps", "0.2"], "above 0.1353"),
    ("no such command", ["no-such-command"], "no-such-command"),
    ("cpu devices 0", ["--cpu-devices", "0", "neighbors"], "--cpu-devices"),
    ("run resume and overwrite", ["run", *TINY, "--resume", "--overwrite"], "not allowed with"),
    ("sweep resume and overwrite", ["sweep", *TINY, "--resume", "--overwrite"], "not allowed"),
    # an --out holding a checkpoint (`Checkpoints`)
    ("run rerun without --resume", ["run", *CKPT_ARGS, "--out", "{interrupted}"], "--resume"),
    ("run rerun, other settings", ["run", *TINY, "--out", "{interrupted}"], "--overwrite"),
    ("sweep rerun without --resume", ["sweep", *TINY, "--out", "{interrupted}"], "--resume"),
    (
        "run resume, other rounds",
        ["run", *CKPT_ARGS, "--rounds", "5", "--out", "{interrupted}", "--resume"],
        "rounds 3 then, 5 now",
    ),
    (
        "run resume, other method",
        ["run", *CKPT_ARGS, "--algorithms", "fedavg", "--out", "{interrupted}", "--resume"],
        "['local'] then, ['fedavg'] now",
    ),
    (
        "run resume, npz data changed",
        ["run", *CKPT_ARGS, "--dataset", "npz:{data}", "--out", "{changed}", "--resume"],
        "changed since it was written: SHA-256",
    ),
    ("run into a busy --out", ["run", *CKPT_ARGS, "--out", "{busy}"], "in use by another"),
    ("run resume, busy", ["run", *CKPT_ARGS, "--out", "{busy}", "--resume"], "in use by"),
    ("run overwrite, busy", ["run", *TINY, "--out", "{busy}", "--overwrite"], "in use by"),
    ("sweep into a busy --out", ["sweep", *TINY, "--out", "{busy}"], "in use by another"),
    (
        "run resume, an earlier version",
        ["run", *CKPT_ARGS, "--out", "{old}", "--resume"],
        "earlier version (state.npz)",
    ),
    ("sweep resume, an earlier version", ["sweep", *TINY, "--out", "{old}", "--resume"], "earlier"),
    ("run --out/checkpoint a file", ["run", *TINY, "--out", "{a_file}"], "is a file"),
    ("sweep --out/checkpoint a file", ["sweep", *TINY, "--out", "{a_file}"], "is a file"),
]

ROBUSTNESS = [str(ROOT / "scripts" / "robustness.py"), "--preset", "tiny"]
REPRODUCE = [str(ROOT / "scripts" / "reproduce.py"), "--preset", "tiny"]
# (id, argv after `python`, words of the one stderr line)
SCRIPTS: list[tuple[str, list[str], str]] = [
    ("robustness only", [*ROBUSTNESS, "--out", "{dir}/r", "--only", "nosuch"], "--only"),
    ("robustness seeds text", [*ROBUSTNESS, "--out", "{dir}/r", "--seeds", "a,b"], "--seeds"),
    ("robustness seeds negative", [*ROBUSTNESS, "--out", "{dir}/r", "--seeds=-1"], "--seeds"),
    ("robustness methods", [*ROBUSTNESS, "--out", "{dir}/r", "--methods", "x"], "--methods"),
    ("robustness out a file", [*ROBUSTNESS, "--out", "{file}"], "is a file"),
    ("robustness out empty", [*ROBUSTNESS, "--out", ""], "must not be empty"),
    ("robustness no out", ROBUSTNESS, "--out"),
    ("robustness preset", [*ROBUSTNESS, "--out", "{dir}/r", "--preset", "huge"], "--preset"),
    ("robustness cpu 0", [*ROBUSTNESS, "--out", "{dir}/r", "--cpu-devices", "0"], "--cpu"),
    ("reproduce out a file", [*REPRODUCE, "--out", "{file}"], "is a file"),
    ("reproduce out empty", [*REPRODUCE, "--out", ""], "must not be empty"),
    ("reproduce only", [*REPRODUCE, "--out", "{dir}/p", "--only", "fig99"], "--only"),
    ("reproduce preset", [*REPRODUCE, "--out", "{dir}/p", "--preset", "huge"], "--preset"),
    ("reproduce cpu 0", [*REPRODUCE, "--out", "{dir}/p", "--cpu-devices", "0"], "--cpu"),
]


def _process(argv: list[str], files: Files, ckpts: Checkpoints | None = None):
    names = {f.name: str(getattr(files, f.name)) for f in dataclasses.fields(Files)}
    if ckpts is not None:
        names |= {f.name: str(getattr(ckpts, f.name)) for f in dataclasses.fields(Checkpoints)}
    args = [a.format(**names) for a in argv]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, *args],
        cwd=files.dir,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def _check_processes(
    rows: list[tuple[str, list[str], str]],
    prefix: list[str],
    files: Files,
    ckpts: Checkpoints | None = None,
):
    """Run `rows` two at a time, except that the rows naming one checkpoint run one after
    another: a run holds its checkpoint's lock, and the other would be refused for it."""

    def run(group: list[int]) -> list[Any]:
        return [_process([*prefix, *rows[i][1]], files, ckpts) for i in group]

    shared = [i for i, row in enumerate(rows) if any("{interrupted}" in a for a in row[1])]
    groups = [shared, *([i] for i in range(len(rows)) if i not in shared)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        ran = list(pool.map(run, groups))
    out = {i: proc for group, procs in zip(groups, ran, strict=True)
           for i, proc in zip(group, procs, strict=True)}  # fmt: skip
    done = [out[i] for i in range(len(rows))]
    bad = []
    for (name, _, words), proc in zip(rows, done, strict=True):
        lines = proc.stderr.strip().splitlines()
        ok = proc.returncode == 2 and len(lines) == 1 and words in lines[0]
        if not ok or "Traceback" in proc.stderr:
            bad.append(f"{name}: exit {proc.returncode}, stderr {proc.stderr[-600:]!r}")
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_cli_bad_input_exits_2_with_one_line(files, ckpts):
    before = sorted(str(p) for p in ckpts.interrupted.rglob("*"))
    _check_processes(CLI, ["-m", "pfedwn_jax"], files, ckpts)
    assert sorted(str(p) for p in ckpts.interrupted.rglob("*")) == before


@pytest.mark.slow
def test_scripts_bad_input_exits_2_with_one_line(files):
    _check_processes(SCRIPTS, [], files)


def test_the_probe_holds_at_least_sixty_inputs():
    tables = (API, CKPT_API, HANDLED, CKPT_HANDLED, CLI, SCRIPTS)
    assert sum(len(t) for t in tables) >= 60
    for table in tables:  # ids name the failing row: unique within a table
        assert len({row[0] for row in table}) == len(table)
