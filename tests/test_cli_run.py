"""`pfedwn run` end to end on a tiny config file."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from pfedwn_jax.algorithms import default_algorithms
from pfedwn_jax.cli import build_parser, main
from pfedwn_jax.cli.run import CURVE, PI_PLOT, RESULTS, config_from_args
from pfedwn_jax.experiment import ExperimentConfig

TOML = """
model = "logreg"
num_neighbors = 3
rounds = 2
lr = 0.1
algorithms = ["local", "fedavg"]
gamma_th = 1.0
eps = 0.12

[hparams.fedprox]
mu = 0.1
"""


def test_run_end_to_end(tmp_path, capsys):
    cfg = tmp_path / "exp.toml"
    cfg.write_text(TOML)
    out = tmp_path / "out"
    rc = main(
        ["run", "--config", str(cfg), "--rounds", "3", "--lr", "0.05", "--out", str(out), "--quiet"]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "local" in printed and "fedavg" in printed and "max" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["rounds"] == 3  # the flag overrides the file
    assert results["config"]["lr"] == 0.05
    assert results["config"]["hparams"] == {"fedprox": {"mu": 0.1}}
    assert list(results["methods"]) == ["local", "fedavg"]
    for m in results["methods"].values():
        assert len(m["target_accuracy"]) == 3
        assert len(m["client_accuracy"]) == 3
        assert len(m["client_accuracy"][0]) == len(results["network"]["slot_client"])
    png = out / "learning_curve.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "checkpoint").exists()
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]

    # --resume on a finished directory re-runs cleanly and gives the same numbers
    rc = main(
        [
            "run",
            "--config",
            str(cfg),
            "--rounds",
            "3",
            "--lr",
            "0.05",
            "--out",
            str(out),
            "--quiet",
            "--resume",
            "--no-plot",
        ]
    )
    assert rc == 0
    again = json.loads((out / "results.json").read_text())
    assert (
        again["methods"]["fedavg"]["client_accuracy"]
        == results["methods"]["fedavg"]["client_accuracy"]
    )


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--algorithms", "local,fedsgd"], "algorithms"),
        (["--lr", "0"], "lr"),
        (["--rounds", "0"], "rounds"),
        (["--target", "11"], "target"),
        (["--model", "vgg"], "model"),
    ],
)
def test_bad_flags_are_one_line_errors(tmp_path, capsys, argv, field):
    rc = main(["run", "--out", str(tmp_path / "o"), "--quiet", *argv])
    assert rc == 2
    err = capsys.readouterr().err
    assert field in err and len(err.strip().splitlines()) == 1


def test_missing_config_file_is_an_error(tmp_path, capsys):
    rc = main(["run", "--config", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "o")])
    assert rc == 2
    assert "nope.toml" in capsys.readouterr().err


def _run_args(*argv):
    return build_parser().parse_args(["run", *argv])


def test_every_config_field_has_a_flag():
    parser = build_parser()
    run_parser = next(
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["run"]
    flags = {a.dest: a.option_strings for a in run_parser._actions}
    for name in ExperimentConfig.field_names():
        assert flags.get(name) == ["--" + name.replace("_", "-")], name
        assert run_parser._option_string_actions[flags[name][0]].help, name


def test_table_flags_merge_into_the_config_file(tmp_path):
    cfg = tmp_path / "exp.toml"
    cfg.write_text(TOML)
    args = _run_args(
        "--config", str(cfg), "--momentum", "0.5", "--data-seed", "3",
        "--hparams", "fedprox.mu=0.2", "--hparams", "pfedwn.em_steps=2",
        "--channel", "num_subchannels=20",
    )  # fmt: skip
    config = config_from_args(args)
    assert config.momentum == 0.5 and config.data_seed == 3 and config.rounds == 2
    assert config.hparams == {"fedprox": {"mu": 0.2}, "pfedwn": {"em_steps": 2}}
    assert config.channel == {"num_subchannels": 20}
    with pytest.raises(ValueError, match="hparams"):
        config_from_args(_run_args("--hparams", "fedprox.mu"))


@pytest.mark.slow
def test_default_demo_config_end_to_end(tmp_path, capsys):
    """`make demo`'s run (every default: all methods, 30 rounds, the embedded MNIST) into a
    fresh directory: the files it writes, their content, and learning well above chance."""
    out = tmp_path / "demo"
    assert main(["run", "--out", str(out), "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([RESULTS, CURVE, PI_PLOT])
    for png in (CURVE, PI_PLOT):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / RESULTS).read_text())
    assert results["config"] == json.loads(json.dumps(ExperimentConfig().to_dict()))
    assert list(results["methods"]) == list(default_algorithms())
    printed = capsys.readouterr().out
    rounds = ExperimentConfig().rounds
    slots = len(results["network"]["slot_client"])
    for name, m in results["methods"].items():
        assert name in printed
        assert len(m["target_accuracy"]) == rounds and len(m["target_loss"]) == rounds
        acc = np.asarray(m["client_accuracy"])
        assert acc.shape == (rounds, slots) and ((acc >= 0) & (acc <= 1)).all()
        assert np.isfinite(np.asarray(m["client_loss"])).all()
        assert m["max_target_accuracy"] > 0.5, (name, m["max_target_accuracy"])  # chance: 0.1
    pi = np.asarray(results["methods"]["pfedwn"]["records"]["pi"])
    assert pi.shape == (rounds, slots, slots)
    np.testing.assert_allclose(pi[-1, 0].sum(), 1.0 if slots > 1 else 0.0, atol=1e-5)
