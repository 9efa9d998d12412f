"""Divergence: flagged in the compiled round, reported once, the method stopped (or not)."""

from __future__ import annotations

import logging

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY_RUN

from pfedwn_jax import Result, run
from pfedwn_jax.cli import main as cli_main
from pfedwn_jax.cli.run import EXIT_DIVERGED
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.results.divergence import LOSS_BOUND, slot_finite
from pfedwn_jax.results.report import format_table

# FedProx with lr * mu = 500 oscillates out of bounds within its first round; Local is fine
CFG = ExperimentConfig(
    **TINY_RUN, algorithms=("fedprox", "local"), hparams={"fedprox": {"mu": 1e4}}
)


class Stop(Exception):
    pass


def test_slot_finite_flags_nonfinite_params_and_huge_losses():
    params = {"w": jnp.ones((4, 2, 3)), "b": jnp.zeros((4,))}
    params["w"] = params["w"].at[1, 0, 2].set(jnp.nan)
    test_loss = jnp.array([1.0, 1.0, 2 * LOSS_BOUND, 1.0])
    train_loss = jnp.array([0.5, 0.5, 0.5, -jnp.inf])
    got = slot_finite(params, [test_loss, train_loss])
    np.testing.assert_array_equal(got, [True, False, False, False])
    np.testing.assert_array_equal(slot_finite(params, []), [True, False, True, True])


def test_diverged_method_stops_is_saved_and_the_next_runs(tmp_path, caplog):
    def stop(method, rounds_done, metrics):
        if method == "local" and rounds_done == 2:
            raise Stop

    with caplog.at_level(logging.WARNING, logger="pfedwn_jax"), pytest.raises(Stop):
        run(CFG, progress=False, checkpoint=tmp_path / "c", callback=stop)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "\n" not in warned[0]
    assert warned[0].startswith("fedprox diverged at round 1") and "slot(s) [" in warned[0]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pfedwn_jax"):
        res = run(CFG, progress=False, checkpoint=tmp_path / "c", resume=True)
    assert not caplog.records  # fedprox came from the checkpoint, not run again
    prox, local = res.methods["fedprox"], res.methods["local"]
    assert prox["diverged"]["round"] == 1 and prox["diverged"]["slots"]
    assert prox["diverged"]["clients"] == [
        res.network["slot_client"][s] for s in prox["diverged"]["slots"]
    ]
    assert len(prox["target_accuracy"]) == 1 and prox["final_target_accuracy"] is not None
    assert local["diverged"] is None and len(local["target_accuracy"]) == 3
    lines = format_table(res).splitlines()
    assert lines[3].startswith("fedprox") and lines[3].endswith("diverged @1")
    assert lines[4].startswith("local") and "diverged" not in lines[4]
    back = Result.load(res.save(tmp_path / "r.json"))  # NaN losses stored as null
    assert back.methods["fedprox"]["diverged"] == prox["diverged"]


def test_continue_on_divergence_runs_every_round_and_the_cli_exits_3(tmp_path, capsys):
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TINY_RUN.items()]
    argv = ["run", *flags, "--algorithms=fedprox", "--hparams=fedprox.mu=1e4", "--quiet"]
    code = cli_main([*argv, "--no-plot", "--keep-going-on-divergence", f"--out={tmp_path}"])
    assert code == EXIT_DIVERGED == 3
    assert "diverged: fedprox (round 1); results written" in capsys.readouterr().err
    res = Result.load(tmp_path / "results.json")
    prox = res.methods["fedprox"]
    assert prox["diverged"]["round"] == 1 and len(prox["target_accuracy"]) == 3
    assert "diverged @1" in format_table(res)
