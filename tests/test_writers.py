"""Metric writers: TensorBoard event files read back, CSV, W&B (a fake module, and the real
one offline where installed), one W&B run per grid point and seed, and each round logged once
across an interruption and resume."""

from __future__ import annotations

import csv
import sys
import time
import types

import numpy as np
import pytest
from helpers import TINY_RUN, read_events, scalar_series

import pfedwn_jax
from pfedwn_jax.cli import main
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.runner.writers import (
    CSVWriter,
    Logged,
    TensorBoardWriter,
    WandbWriter,
    histograms,
    make_writers,
    parse_kinds,
    run_name,
    scalars,
)

CFG = ExperimentConfig(**{**TINY_RUN, "algorithms": ("pfedwn",)})


class Stop(Exception):
    pass


class Recorder:
    """A writer that keeps every (method, round) it is sent."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str, int]] = []
        self.closed = False

    def log(self, event: Logged) -> None:
        self.seen += [(event.run, event.method, int(r)) for r in event.rounds]

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """One run of pFedWN, with a validation split, to a TensorBoard, a CSV and a recording
    writer."""
    pytest.importorskip("tensorboardX")
    where = tmp_path_factory.mktemp("logs")
    rec = Recorder()
    writers = [TensorBoardWriter(where / "tb"), CSVWriter(where / "m.csv"), rec]
    result = pfedwn_jax.run(CFG.replace(val_fraction=0.2), progress=False, writers=writers)
    return result, where, rec


def test_tensorboard_event_files_hold_every_round_of_every_metric(logged):
    result, where, rec = logged
    assert rec.closed
    for method in ("pfedwn",):
        series = scalar_series(where / "tb" / "seed=0" / method)
        entry = result.methods[method]
        for tag in (
            "target_accuracy",
            "mean_client_accuracy",
            "target_loss",
            "target_val_accuracy",
        ):
            steps, values = zip(*series[tag], strict=True)
            assert steps == (1, 2, 3), (method, tag)
            np.testing.assert_allclose(values, entry[tag], rtol=1e-6)
    pi = np.asarray(result.methods["pfedwn"]["records"]["pi"])  # [rounds, S, K]
    neighbors = result.network["slot_neighbors"][0]
    clients = [0, *result.network["selected_neighbors"]]
    for k in range(1, len(neighbors)):
        tag = f"pi/client_{clients[neighbors[k]]}"
        steps, values = zip(*scalar_series(where / "tb" / "seed=0" / "pfedwn")[tag], strict=True)
        assert steps == (1, 2, 3)
        np.testing.assert_allclose(values, pi[:, 0, k], rtol=1e-6)
    histos = {
        v.tag
        for e in read_events(where / "tb" / "seed=0" / "pfedwn")
        for v in e.summary.value
        if v.HasField("histo")
    }
    assert histos == {"client_accuracy", "pi"}


def test_csv_holds_one_row_per_round_and_scalar(logged):
    result, where, _ = logged
    with (where / "m.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["run", "seed", "method", "round", "name", "value"]
    acc = [float(r["value"]) for r in rows if r["name"] == "target_accuracy"]
    np.testing.assert_allclose(acc, result.methods["pfedwn"]["target_accuracy"])
    assert {r["name"] for r in rows if r["method"] == "pfedwn"} >= {"pi/client_3", "target_loss"}


def test_scalars_leave_out_nan_and_histograms_only_real_pi_entries():
    pi = np.array([[[0.0, 0.7, 0.3, 0.0]], [[0.0, 0.6, 0.4, 0.0]]])  # [n=2, S=1, K=4]
    event = Logged(
        run=0,
        labels={"seed": 0},
        method="pfedwn",
        rounds=np.array([1, 2]),
        metrics={
            "target_accuracy": np.array([0.5, 0.6]),
            "target_val_accuracy": np.full(2, np.nan),
        },
        arrays={"accuracy": np.array([[0.5], [0.6]]), "loss": np.array([[1.0], [0.9]])},
        records={"pi": pi},
        slots={
            "is_target": np.array([True]),
            "slot_client": np.array([7]),
            "neighbors": np.array([[0, 0, 0, 0]]),
            "neighbor_mask": np.array([[True, True, True, False]]),
        },
    )
    assert scalars(event, 1) == {
        "target_accuracy": 0.6,
        "mean_client_loss": 0.9,
        "pi/client_7": 0.4,  # both columns name client 7 here: the last wins
    }
    np.testing.assert_array_equal(histograms(event, 0)["pi"], [0.7, 0.3])


def test_two_tensorboard_writers_in_the_same_second_keep_both_files(tmp_path, monkeypatch):
    """An interrupted job's writer and the resumed job's, opened in the same second (the
    clock held still): both event files stay, every round is read back."""
    pytest.importorskip("tensorboardX")
    monkeypatch.setattr(time, "time", lambda: 1.7e9)

    def event(rounds):
        rounds = np.asarray(rounds)
        return Logged(
            run=0, labels={"seed": 0}, method="local", rounds=rounds,
            metrics={"target_accuracy": rounds / 10}, records={}, slots={},
            arrays={"accuracy": rounds[:, None] / 10, "loss": np.ones((len(rounds), 1))},
        )  # fmt: skip

    for rounds in ([1, 2, 3], [4, 5]):
        writer = TensorBoardWriter(tmp_path)
        writer.log(event(rounds))
        writer.close()
    steps = [s for s, _ in scalar_series(tmp_path / "seed=0" / "local")["target_accuracy"]]
    assert sorted(steps) == [1, 2, 3, 4, 5]


def test_kinds_are_checked_and_a_missing_extra_is_named(tmp_path, monkeypatch):
    assert parse_kinds("tensorboard, csv") == ("tensorboard", "csv")
    with pytest.raises(ValueError, match="'csv' appears twice"):  # a typo, not a request
        parse_kinds("tensorboard, csv,csv")
    with pytest.raises(ValueError, match=r"unknown writer 'tb'; allowed: tensorboard, wandb, csv"):
        parse_kinds("tb")
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails
    with pytest.raises(ValueError, match=r"pip install 'pfedwn-jax\[wandb\]'"):
        make_writers("wandb", tmp_path)
    with pytest.raises(ValueError, match="writers must have log"):
        pfedwn_jax.run(CFG, progress=False, writers=[object()])


# --------------------------------------------------------------------------- W&B
class FakeRun:
    def __init__(self, kwargs):
        self.kwargs, self.logged, self.defined, self.finished = kwargs, [], [], False

    def define_metric(self, name, step_metric=None):
        self.defined.append((name, step_metric))

    def log(self, row):
        self.logged.append(row)

    def finish(self):
        self.finished = True


def fake_wandb():
    module = types.ModuleType("wandb")
    module.runs = []

    def init(**kwargs):
        module.runs.append(FakeRun(kwargs))
        return module.runs[-1]

    module.init = init
    module.Histogram = lambda values: ("histogram", len(values))
    module.Settings = lambda **kw: ("settings", kw)
    return module


def test_real_wandb_offline_writes_a_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    pfedwn_jax.run(
        CFG.replace(rounds=2, algorithms=("local",)), progress=False,
        writers=[WandbWriter("proj", dir=tmp_path, mode="offline")],
    )  # fmt: skip
    files = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    assert b"local/target_accuracy" in files[0].read_bytes()


# --------------------------------------------------------------------------- exactly once
def test_a_resumed_run_logs_every_round_once(tmp_path):
    """Interrupted between checkpoint steps and resumed: every (method, round) reaches the
    writers once; rounds after the last complete step are logged by the resumed job."""
    pytest.importorskip("tensorboardX")
    cfg = CFG.replace(rounds=5, algorithms=("local", "fedavg"))
    path, tb = tmp_path / "ckpt", tmp_path / "tb"

    def stop(name, rounds_done, metrics):
        if name == "fedavg" and rounds_done == 4:
            raise Stop

    first, second = Recorder(), Recorder()
    with pytest.raises(Stop):
        pfedwn_jax.run(
            cfg, progress=False, checkpoint=path, checkpoint_every=3, block=1, callback=stop,
            writers=[first, TensorBoardWriter(tb)],
        )  # fmt: skip
    assert first.closed
    assert [(m, r) for _, m, r in first.seen] == [
        *(("local", r) for r in range(1, 6)),
        *(("fedavg", r) for r in range(1, 4)),  # round 4 was after the last step (3)
    ]
    pfedwn_jax.run(
        cfg, progress=False, checkpoint=path, checkpoint_every=3, resume=True,
        writers=[second, TensorBoardWriter(tb)],
    )  # fmt: skip
    assert [(m, r) for _, m, r in second.seen] == [("fedavg", 4), ("fedavg", 5)]
    steps = [s for s, _ in scalar_series(tb / "seed=0" / "fedavg")["target_accuracy"]]
    assert sorted(steps) == [1, 2, 3, 4, 5]


def test_cli_sweep_logs_one_wandb_run_per_grid_point_and_seed(tmp_path, monkeypatch, capsys):
    """`pfedwn sweep --log-to wandb,csv --save-models`: a W&B run (here a stand-in module)
    per grid point and seed with its config, pi kept for the writers, a CSV, the models."""
    wandb = fake_wandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    out = tmp_path / "sweep"
    argv = ["sweep", "--model", "logreg", "--num-neighbors", "3", "--rounds", "2", "--eps", "0.12"]
    argv += ["--gamma-th", "1", "--algorithms", "pfedwn", "--seeds", "0-1", "--no-progress"]
    argv += ["--grid", "lr=0.05,0.1", "--out", str(out)]
    assert main([*argv, "--log-to", "wandb,csv", "--save-models"]) == 0
    assert len(wandb.runs) == 4
    quiet = ("settings", {"quiet": True})  # W&B's own summary kept out of the output
    assert all(r.kwargs["settings"] == quiet for r in wandb.runs)
    names = sorted(r.kwargs["name"] for r in wandb.runs)
    assert names == ["seed=0,lr=0.05", "seed=0,lr=0.1", "seed=1,lr=0.05", "seed=1,lr=0.1"]
    rows = pfedwn_jax.SweepResult.load(out).rows
    for run in wandb.runs:
        config, labels = run.kwargs["config"], run.kwargs["config"]["labels"]
        assert config["lr"] == labels["lr"] and config["seed"] == labels["seed"]
        assert run.kwargs["mode"] == "offline" and run.kwargs["reinit"] == "create_new"
        assert ("pfedwn/*", "pfedwn/round") in run.defined and run.finished
        assert [row["pfedwn/round"] for row in run.logged] == [1, 2]
        assert any(k.startswith("pfedwn/pi/client_") for k in run.logged[-1])
        assert run.logged[-1]["pfedwn/pi"][0] == "histogram"
        pick = (np.asarray(rows["seed"]) == labels["seed"]) & (
            np.asarray(rows["lr"]) == labels["lr"]
        )
        want = np.asarray(rows["target_accuracy"])[pick]
        np.testing.assert_allclose([row["pfedwn/target_accuracy"] for row in run.logged], want)
    with (out / "logs" / "metrics.csv").open() as f:
        logged = {(r["seed"], r["lr"], r["round"]) for r in csv.DictReader(f)}
    assert logged == {(s, lr, r) for s in "01" for lr in ("0.05", "0.1") for r in "12"}
    models = pfedwn_jax.load_models(out / "models")
    assert [models.labels(i) for i in range(4)] == [
        {"seed": s, "lr": lr} for lr in (0.05, 0.1) for s in (0, 1)
    ]
    for bad, what in (
        (["--log-to", "tb"], "unknown writer 'tb'"),
        (["--log-dir", "x"], "--log-to"),
    ):
        capsys.readouterr()
        assert main([*argv[:-1], str(tmp_path / "b"), *bad]) == 2
        assert what in capsys.readouterr().err


def test_the_runs_of_one_job_get_their_own_names():
    """`runs` (the CLI's cases) label each run by the config values that differ, so the
    writers give every case its own TensorBoard directory and W&B run."""
    from pfedwn_jax.api import case_labels

    cases = [CFG.replace(gamma_th=g) for g in (1.0, 2.0)]
    assert [run_name(lbl) for lbl in case_labels(cases)] == [
        "seed=0,gamma_th=1.0",
        "seed=0,gamma_th=2.0",
    ]
    twins = [CFG, CFG.replace(hparams={"pfedwn": {"a": 0.3}})]  # differ only in a table
    assert case_labels(twins) == [{"seed": 0, "run": 0}, {"seed": 0, "run": 1}]
    assert case_labels([CFG]) == [{"seed": 0}]
