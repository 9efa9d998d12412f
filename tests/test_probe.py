"""A probe of bad inputs through every entry point, as a new user would try them.

Each row is one input and the words its error must contain:

- `API`: a Python call that must raise a `ValueError` naming the problem (never a traceback
  from inside JAX, never another exception type);
- `HANDLED`: inputs that are legal but suspicious, checked to end in a clamp or a warning;
- `CLI`: a `pfedwn` command line (a real process) that must exit with status 2 and one line
  on stderr naming the problem, without "Traceback";
- `SCRIPTS`: the same for `scripts/robustness.py` and `scripts/reproduce.py`.

Grow it by adding rows. `{name}` in a command line is replaced by a path of `Files`.
The subprocess rows are in the slow tier (about a minute on 2 cores); the in-process rows are
quick. Checkpoint inputs (a rerun without --resume, changed data on --resume, a corrupted
latest step, a double Ctrl-C, two runs into one --out) are listed in `LATER`: they belong to
the run/sweep driver.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

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


# --------------------------------------------------------------------------- the API
def _config(**kw: Any) -> Any:
    from pfedwn_jax.experiment import ExperimentConfig

    return ExperimentConfig(**kw)


def _run(config: Any = None, **kw: Any) -> Any:
    from pfedwn_jax.experiment import run

    cfg = _config(model="logreg", num_neighbors=3, rounds=1, algorithms=("local",))
    return run(cfg if config is None else config, progress=False, **kw)


def _wireless(name: str) -> Callable[..., Any]:
    import pfedwn_jax.wireless as w

    return getattr(w, name)


def _sweep(**kw: Any) -> Any:
    import pfedwn_jax

    cfg = _config(model="logreg", num_neighbors=3, rounds=1, algorithms=("local",))
    return pfedwn_jax.sweep(cfg, progress=False, **kw)


def _estimate() -> Any:
    from pfedwn_jax.runner.memory import MemoryEstimate

    return MemoryEstimate(100, 0, 0, 0, 0, shared=50, method="fedavg")


def _result_load(path: Path) -> Any:
    from pfedwn_jax.experiment import Result

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
]


@pytest.mark.parametrize(("call", "words"), [a[1:] for a in API], ids=[a[0] for a in API])
def test_api_bad_input_is_a_named_value_error(files, call, words):
    with pytest.raises(ValueError) as err:
        call(files)
    assert words in str(err.value), str(err.value)
    assert "Traceback" not in str(err.value) and len(str(err.value)) < 1500


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


# (id, call, words of the one warning it logs; None: no warning expected)
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

#: Inputs for the run/sweep driver's checkpoint work, not probed yet.
LATER = (
    "pfedwn run/sweep rerun into an --out with a checkpoint, without --resume",
    "--resume after the npz: data file changed",
    "--resume with the newest orbax step truncated (the previous one intact)",
    "a second Ctrl-C 0.01-0.3 s after the first",
    "two runs into one --out at once",
    "run() / sweep() whose memory plan exceeds the device (check_fits not wired yet)",
)


def _process(argv: list[str], files: Files) -> subprocess.CompletedProcess:
    names = {f.name: str(getattr(files, f.name)) for f in dataclasses.fields(Files)}
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


def _check_processes(rows: list[tuple[str, list[str], str]], prefix: list[str], files: Files):
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(lambda row: _process([*prefix, *row[1]], files), rows))
    bad = []
    for (name, _, words), proc in zip(rows, done, strict=True):
        lines = proc.stderr.strip().splitlines()
        ok = proc.returncode == 2 and len(lines) == 1 and words in lines[0]
        if not ok or "Traceback" in proc.stderr:
            bad.append(f"{name}: exit {proc.returncode}, stderr {proc.stderr[-600:]!r}")
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_cli_bad_input_exits_2_with_one_line(files):
    _check_processes(CLI, ["-m", "pfedwn_jax"], files)


@pytest.mark.slow
def test_scripts_bad_input_exits_2_with_one_line(files):
    _check_processes(SCRIPTS, [], files)


def test_the_probe_holds_at_least_sixty_inputs():
    tables = (API, HANDLED, CLI, SCRIPTS)
    assert sum(len(t) for t in tables) >= 60
    for table in tables:  # ids name the failing row: unique within a table
        assert len({row[0] for row in table}) == len(table)
