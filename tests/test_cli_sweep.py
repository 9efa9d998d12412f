"""`pfedwn sweep`: the command line's parsing layer, with a fake `pfedwn_jax.api.sweep`.

The compiled program is tested on its own; here a fake records what the CLI asks of it.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

from pfedwn_jax.cli import build_parser, main
from pfedwn_jax.experiment import ExperimentConfig

TOML = """
model = "logreg"
num_neighbors = 3
rounds = 4
algorithms = ["fedavg", "fedprox", "pfedwn"]

[hparams.fedprox]
mu = 0.1

[sweep]
seeds = "0-2"
zip = true
block = 2

[sweep.grid]
lr = [0.01, 0.05]
pfedwn.a = [0.3, 0.7]
"""


class FakeResult:
    def __init__(self):
        self.saved_to = None

    def save(self, out):
        self.saved_to = Path(out)
        path = Path(out) / "sweep.csv"
        path.write_text("fake\n")
        return [path]

    def summary_table(self):
        return "FAKE SUMMARY TABLE"


@pytest.fixture
def fake_sweep(monkeypatch):
    """Replace `pfedwn_jax.api.sweep`; returns the list of recorded calls."""
    calls = []

    def sweep(config, **kwargs):
        result = FakeResult()
        calls.append({"config": config, **kwargs, "result": result})
        return result

    monkeypatch.setattr(importlib.import_module("pfedwn_jax.api"), "sweep", sweep)
    return calls


def test_flags_reach_sweep(tmp_path, capsys, fake_sweep):
    out = tmp_path / "out"
    argv = [
        "sweep", "--seeds", "0-3", "--grid", "lr=0.01,0.05", "--grid", "pfedwn.a=0.3,0.5,0.7",
        "--algorithms", "fedavg,pfedwn", "--rounds", "2", "--gamma-th", "2.5", "--block", "2",
        "--out", str(out), "--no-progress", "--resume",
    ]  # fmt: skip
    assert main(argv) == 0
    (call,) = fake_sweep
    assert call["config"] == ExperimentConfig(
        algorithms=("fedavg", "pfedwn"), rounds=2, gamma_th=2.5
    )
    assert call["seeds"] == (0, 1, 2, 3)
    assert call["grid"] == {"lr": [0.01, 0.05], "pfedwn.a": [0.3, 0.5, 0.7]}
    assert call["zip"] is False and call["block"] == 2
    assert call["progress"] is False and call["resume"] is True
    assert call["checkpoint"] == out / "checkpoint"
    assert call["result"].saved_to == out
    printed = capsys.readouterr().out
    assert "24 run(s) = 6 grid point(s) x 4 seed(s)" in printed
    assert "methods (runs): fedavg (8), pfedwn (24)" in printed  # fedavg once per lr
    assert "FAKE SUMMARY TABLE" in printed and str(out / "sweep.csv") in printed


def test_defaults(tmp_path, monkeypatch, fake_sweep):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep"]) == 0
    (call,) = fake_sweep
    assert call["config"] == ExperimentConfig()
    assert call["seeds"] == (0,) and call["grid"] == {}
    assert call["zip"] is False and call["block"] is None
    assert call["progress"] is True and call["resume"] is False
    assert call["checkpoint"] == Path("runs/sweep/checkpoint")
    assert (tmp_path / "runs" / "sweep" / "sweep.csv").is_file()


def test_config_file_and_its_sweep_table(tmp_path, fake_sweep):
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(TOML)
    assert main(["sweep", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 0
    call = fake_sweep[-1]
    assert call["config"] == ExperimentConfig(
        model="logreg",
        num_neighbors=3,
        rounds=4,
        algorithms=("fedavg", "fedprox", "pfedwn"),
        hparams={"fedprox": {"mu": 0.1}},
    )
    assert call["seeds"] == (0, 1, 2) and call["zip"] is True and call["block"] == 2
    # TOML reads `pfedwn.a = [...]` as a nested table: it comes back as the key "pfedwn.a"
    assert call["grid"] == {"lr": [0.01, 0.05], "pfedwn.a": [0.3, 0.7]}

    # flags win: seeds, block, one grid key replaced, one added, a config field
    argv = [
        "sweep", "--config", str(cfg), "--out", str(tmp_path / "o"), "--seeds", "7",
        "--block", "1", "--grid", "lr=0.1,0.2", "--grid", "fedprox.mu=0.5,1", "--rounds", "3",
        "--hparams", "pfedwn.em_steps=2",
    ]  # fmt: skip
    assert main(argv) == 0
    call = fake_sweep[-1]
    assert call["seeds"] == (7,) and call["block"] == 1 and call["config"].rounds == 3
    assert call["config"].hparams == {"fedprox": {"mu": 0.1}, "pfedwn": {"em_steps": 2}}
    assert call["grid"] == {"lr": [0.1, 0.2], "pfedwn.a": [0.3, 0.7], "fedprox.mu": [0.5, 1]}


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--grid", "learning_rate=0.1"], ["'learning_rate'", "allowed:", "'lr'", "'pfedwn.a'"]),
        (["--grid", "seed=1,2"], ["'seed'", "--seeds"]),
        (["--algorithms", "fedavg", "--grid", "fedprox.mu=0.1"], ["'fedprox.mu'", "allowed:"]),
        (["--grid", "lr=0.1,-1"], ["grid[lr]", "-1", "lr must be in"]),
        (["--grid", "pfedwn.a=2"], ["grid[pfedwn.a]", "2"]),
        (["--grid", "lr"], ["--grid takes KEY=V1,V2"]),
        (["--grid", "lr=0.1", "--grid", "lr=0.2"], ["--grid lr is given twice"]),
        (["--grid", "lr=0.1,0.2", "--grid", "eps=0.1", "--zip"], ["one length"]),
        (["--seeds", "5-3"], ["range '5-3' is empty"]),
        (["--seeds", "0,1,1"], ["seed 1 appears twice"]),
        (["--seeds", "x"], ["'x'", "neither a seed nor a range"]),
        (["--block", "0"], ["--block must be in [1"]),
        (["--gamma-th", "5,10"], ["--gamma-th takes one value", "--grid gamma_th=V1,V2"]),
        (["--dataset", "a,b"], ["--dataset takes one value", "one sweep per value"]),
        (["--lr", "0"], ["lr must be in"]),
        (["--config", "nope.toml"], ["config file not found", "nope.toml"]),
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path, capsys, fake_sweep, argv, words):
    out = tmp_path / "o"
    assert main(["sweep", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("pfedwn sweep: error: ")
    for word in words:
        assert word in err, (word, err)
    assert not fake_sweep and not out.exists()  # nothing ran, nothing was created


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ("[sweep]\nseed = 3\n", ["[sweep] has unknown key(s) ['seed']", "allowed:"]),
        ("[sweep]\nzip = 'yes'\n", ["[sweep] zip must be true or false"]),
        ("[sweep]\nblock = 0\n", ["[sweep] block must be in [1"]),
        ("[sweep]\nseeds = [1, 1]\n", ["seed 1 appears twice"]),
        ("[sweep]\ngrid = [1]\n", ["[sweep.grid] must be a table"]),
        ("[sweep.grid]\nlr = 0.1\n", ["grid[lr] must be a list"]),
        ("[sweep.grid]\nfoo = [1]\n", ["unknown key 'foo'", "allowed:"]),
        ("sweep = 3\n", ["must be a [sweep] table"]),
        ("[sweep\n", ["sweep.toml"]),
    ],
)
def test_bad_sweep_table_is_a_one_line_error(tmp_path, capsys, fake_sweep, table, words):
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(table)
    assert main(["sweep", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, (word, err)
    assert not fake_sweep


def test_interrupt_keeps_the_checkpoint_and_says_how_to_resume(tmp_path, capsys, monkeypatch):
    def sweep(config, *, checkpoint, **kwargs):
        Path(checkpoint).mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module("pfedwn_jax.api"), "sweep", sweep)
    out = tmp_path / "o"
    assert main(["sweep", "--out", str(out), "--no-progress"]) == 130
    err = capsys.readouterr().err
    assert f"--out {out} --resume" in err and "interrupted" in err
    assert (out / "checkpoint").is_dir()


def test_every_config_field_but_seed_has_a_flag():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    sweep_parser, run_parser = sub.choices["sweep"], sub.choices["run"]
    flags = {a.dest: a.option_strings for a in sweep_parser._actions}
    for name in ExperimentConfig.field_names():
        if name == "seed":
            assert "seed" not in flags  # each run's seed comes from --seeds
            continue
        assert flags.get(name) == ["--" + name.replace("_", "-")], name
        # the same flag as `pfedwn run`'s (one helper builds both)
        ours = sweep_parser._option_string_actions[flags[name][0]]
        theirs = run_parser._option_string_actions[flags[name][0]]
        assert (ours.type, ours.action if hasattr(ours, "action") else None) == (
            theirs.type,
            theirs.action if hasattr(theirs, "action") else None,
        )
        assert ours.help, name
    for option in ("--seeds", "--grid", "--zip", "--block", "--out", "--resume", "--no-progress"):
        assert option in sweep_parser._option_string_actions, option
