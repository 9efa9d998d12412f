"""Bad inputs, one row each: what a user gave and the error it must end in.

Every bad-input report becomes a row here. API rows call the function and expect a
`ValueError` matching the text; command-line rows run `pfedwn ...` in-process and expect exit
status 2 and one stderr line matching the text. Every row fails before any training or
compilation (validation comes first), so the table stays fast as it grows.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pfedwn_jax.api import run, sweep
from pfedwn_jax.cli import main
from pfedwn_jax.data import register_dataset, unregister_dataset
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.grid import expand, parse_grid_arg, parse_seeds

BASE = ExperimentConfig(model="logreg", num_neighbors=3, rounds=1, algorithms=("local",))


def _dataset(labels: list[int]) -> Callable[[Path], Any]:
    """Registering a dataset of these labels (removed again if it was accepted)."""

    def make(tmp_path: Path) -> Any:
        y = np.array(labels, np.int32)
        register_dataset("bad_labels", np.zeros((len(y), 2, 2, 1), np.uint8), y)
        unregister_dataset("bad_labels")

    return make


def _robustness(**kwargs: Any) -> Any:
    from pfedwn_jax.reproduce.robustness import run_robustness

    return run_robustness("tiny", "loss", **kwargs)


# (id, call(tmp_path), error text)
API_ROWS: list[tuple[str, Callable[[Path], Any], str]] = [
    # sizes
    ("grid of a million values", lambda p: sweep(BASE, "0", {"lr": list(range(10**6))}), "at most"),
    # bools that took any truthy value
    ("run progress='no'", lambda p: run(BASE, progress="no"), "progress must be true or false"),
    ("run resume='x'", lambda p: run(BASE, resume="x"), "resume must be true or false"),
    ("run overwrite=1", lambda p: run(BASE, overwrite=1), "overwrite must be true or false"),
    ("sweep zip='yes'", lambda p: sweep(BASE, "0", {"lr": [0.1]}, zip="yes"), "zip must be true"),
    ("config selection='yes'", lambda p: ExperimentConfig(selection="yes"), "selection must be"),
    # seeds: never wrapped modulo 2**32
    ("config seed 2**32", lambda p: ExperimentConfig(seed=2**32), r"seed must be in \[0, "),
    ("config topology_seed 2**64", lambda p: ExperimentConfig(topology_seed=2**64), "must be in"),
    ("config data_seed -1", lambda p: ExperimentConfig(data_seed=-1), "data_seed must be in"),
    ("sweep seed 2**32", lambda p: parse_seeds([2**32]), r"seeds\[0\] must be in"),
    ("seeds '0,,1'", lambda p: parse_seeds("0,,1"), "neither a seed nor a range"),
    ("seeds '3,3'", lambda p: parse_seeds("3,3"), "seed 3 appears twice"),
    # options checked before compiling
    ("run callback=3", lambda p: run(BASE, callback=3), "callback must be a function"),
    ("run records twice", lambda p: run(BASE, records=("pi", "pi")), "must not repeat"),
    ("run records empty name", lambda p: run(BASE, records=("",)), "records must be 'all' or"),
    ("run records a string", lambda p: run(BASE, records="pi"), "records must be 'all' or"),
    # names, lists
    ("algorithms twice", lambda p: ExperimentConfig(algorithms=("local", "local")), "not repeat"),
    ("algorithms 'local,,fedavg'", lambda p: ExperimentConfig(algorithms="local,,fedavg"), "empty"),
    ("hparams of no method", lambda p: ExperimentConfig(hparams={"x": {}}), "unknown algorithm"),
    # None where a mapping is expected
    (
        "hparams table None",
        lambda p: ExperimentConfig(hparams={"fedprox": None}),
        r"hparams\.fedprox must be a table of overrides",
    ),
    ("hparams a list", lambda p: ExperimentConfig(hparams=[1]), "hparams must map algorithm"),
    ("channel a list", lambda p: ExperimentConfig(channel=[1]), "channel must map ChannelParams"),
    ("config from None", lambda p: ExperimentConfig.from_dict(None), "config must be a table"),
    ("grid key unknown", lambda p: expand(BASE, "0", {"lrr": [0.1]}), "unknown key 'lrr'"),
    ("grid value None", lambda p: expand(BASE, "0", {"lr": None}), r"grid\[lr\] must be a list"),
    ("grid repeats", lambda p: expand(BASE, "0", {"lr": [0.1, 0.1]}), "repeats the value"),
    ("--grid 'lr=0.1,,0.2'", lambda p: parse_grid_arg("lr=0.1,,0.2"), "an empty value"),
    # datasets
    ("one class", _dataset([1, 1, 1, 1]), "a single class: nothing to classify"),
    # studies
    ("robustness of one seed", lambda p: _robustness(seeds=[0]), "needs 2 at least"),
    # files
    ("config file a directory", lambda p: ExperimentConfig.from_toml(p), "is a directory"),
]


@pytest.mark.parametrize("call, text", [r[1:] for r in API_ROWS], ids=[r[0] for r in API_ROWS])
def test_bad_api_input(call, text, tmp_path):
    with pytest.raises(ValueError, match=text):
        call(tmp_path)


def _exiting_module(tmp_path: Path) -> str:
    path = tmp_path / "exits.py"
    path.write_text("import sys\nsys.exit(3)\n")
    return str(path)


TINY = ["--model", "logreg", "--num-neighbors", "3", "--rounds", "1", "--algorithms", "local"]

# (id, set-up(tmp_path) -> argv, stderr text)
CLI_ROWS: list[tuple[str, Callable[[Path], list[str]], str]] = [
    (
        "OUT/results.json a directory",
        lambda p: ["run", *TINY, "--out", str(_mkdir(p / "o" / "results.json").parent)],
        r"output file '.*results\.json' is a directory",
    ),
    (
        "OUT/logs/metrics.csv a directory",
        lambda p: [
            "run",
            *TINY,
            "--log-to",
            "csv",
            "--out",
            str(_mkdir(p / "o" / "logs" / "metrics.csv").parents[1]),
        ],
        r"metrics CSV '.*metrics\.csv' is a directory",
    ),
    (
        "OUT/sweep.json a directory",
        lambda p: ["sweep", *TINY, "--out", str(_mkdir(p / "o" / "sweep.json").parent)],
        r"output file '.*sweep\.json' is a directory",
    ),
    ("--config a directory", lambda p: ["run", "--config", str(p)], "is a directory"),
    ("--import that exits", lambda p: ["--import", _exiting_module(p), "data", "list"], "sys.exit"),
    ("--algorithms 'local,,fedavg'", lambda p: ["run", "--algorithms", "local,,fedavg"], "empty"),
    ("--log-to csv,csv", lambda p: ["run", *TINY, "--log-to", "csv,csv"], "'csv' appears twice"),
    ("--log-to 'csv,'", lambda p: ["run", *TINY, "--log-to", "csv,"], "an empty item"),
    ("--gamma-th 5,,10", lambda p: ["run", *TINY, "--gamma-th", "5,,10"], "--gamma-th: an empty"),
    ("--dataset ','", lambda p: ["run", *TINY, "--dataset", ","], "--dataset: an empty item"),
    ("--records pi,pi", lambda p: ["sweep", *TINY, "--records", "pi,pi"], "'pi' appears twice"),
    ("--seeds 0,0", lambda p: ["sweep", *TINY, "--seeds", "0,0"], "appears twice"),
]


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


@pytest.mark.parametrize("argv, text", [r[1:] for r in CLI_ROWS], ids=[r[0] for r in CLI_ROWS])
def test_bad_command_line(argv, text, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = argv(tmp_path)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(text, err), err


def test_sparse_labels_are_named_in_a_warning(caplog):
    """51 classes for 3 distinct labels: the model gets them, and the log says so."""
    y = np.array([0, 7, 50] * 4, np.int32)
    with caplog.at_level(logging.WARNING, logger="pfedwn_jax"):
        dataset = register_dataset("sparse_labels", np.zeros((12, 2, 2, 1), np.uint8), y)
    unregister_dataset("sparse_labels")
    assert dataset.num_classes == 51
    assert "only 3 distinct labels occur (48 classes have no sample)" in caplog.text
