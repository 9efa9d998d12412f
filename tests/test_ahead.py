"""How the runner compiles: the next method's program on a background thread
(`runner.ahead`), CPU programs with their own XLA options (`program.CPU_COMPILER_OPTIONS`)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import TINY_RUN

from pfedwn_jax import ExperimentConfig, sweep
from pfedwn_jax.runner import program
from pfedwn_jax.runner.ahead import Ahead


def test_ahead_gives_what_it_compiled_and_drops_failures():
    ahead = Ahead()
    assert ahead.take("a") is None  # nothing started
    ahead.start("a", lambda: (time.sleep(0.05), "compiled")[1])
    assert ahead.take("b") is None  # another program: not this one's result
    value, seconds = ahead.take("a")
    assert value == "compiled" and seconds >= 0.05
    assert ahead.take("a") is None  # taken once

    def broken():
        raise RuntimeError("lowering failed")

    ahead.start("c", broken)
    assert ahead.take("c") is None  # the driver compiles it itself


def test_programs_compiled_ahead_give_the_numbers_compiled_in_place(monkeypatch):
    """A method's program compiled from its state's shapes while the previous method ran
    gives the same numbers as the program compiled in place from the state itself."""
    config = ExperimentConfig(**TINY_RUN, algorithms=("local", "fedavg", "pfedwn"))
    taken = []
    take = Ahead.take
    monkeypatch.setattr(Ahead, "take", lambda self, key: taken.append(take(self, key)) or taken[-1])
    ahead = sweep(config, seeds="0-1", progress=False)
    assert sum(t is not None for t in taken) == 2  # fedavg and pfedwn
    monkeypatch.setattr(Ahead, "start", lambda self, key, fn: None)
    here = sweep(config, seeds="0-1", progress=False)
    for k in ("target_accuracy", "target_loss", "mean_client_accuracy"):
        np.testing.assert_array_equal(ahead.rows[k], here.rows[k], err_msg=k)


@pytest.mark.slow  # 17 s: three cold sweeps of three methods
def test_cpu_compiler_options_give_the_bits_of_xlas_defaults(monkeypatch):
    """The numbers with the runner's CPU compiler options, and with the quick tier's XLA flags
    on top (`QUICK_XLA_FLAGS` in the Makefile), equal those with XLA's own defaults, value
    for value (the options buy compile time, not numbers): the methods with gradients of
    gradients, a proximal term and EM."""
    assert program.CPU_COMPILER_OPTIONS  # what this test is about
    methods = ("fedprox", "perfedavg", "pfedwn")
    config = ExperimentConfig(**{**TINY_RUN, "rounds": 2}, algorithms=methods)

    def table(options):
        monkeypatch.setattr(program, "CPU_COMPILER_OPTIONS", options)
        for cached in (program.block_program, program.init_program, program.model_init_program):
            cached.cache_clear()
        jax.clear_caches()
        return sweep(config, seeds="0-1", progress=False).rows

    tuned = table(program.CPU_COMPILER_OPTIONS)
    quick = table({**program.CPU_COMPILER_OPTIONS, **quick_tier_flags()})
    default = table(None)
    for k in ("target_accuracy", "target_loss", "mean_client_accuracy"):
        np.testing.assert_array_equal(tuned[k], default[k], err_msg=k)
        np.testing.assert_array_equal(quick[k], default[k], err_msg=k)


def quick_tier_flags() -> dict[str, object]:
    """The Makefile's `QUICK_XLA_FLAGS` as compiler options."""
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    line = re.search(r"^QUICK_XLA_FLAGS := (.+)$", makefile, re.M)
    assert line, "QUICK_XLA_FLAGS is not in the Makefile"
    flags = dict(f.removeprefix("--").split("=") for f in line.group(1).split())
    assert flags, line.group(1)
    return {k: {"true": True, "false": False}.get(v, int(v) if v.isdigit() else v)
            for k, v in flags.items()}  # fmt: skip
