"""How the runner compiles: the next method's program on a background thread
(`runner.ahead`), CPU programs with their own XLA options (`program.CPU_COMPILER_OPTIONS`)."""

from __future__ import annotations

import time

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
    """The numbers with the runner's CPU compiler options equal those with XLA's own
    defaults, value for value (the options buy compile time, not numbers), and those with its
    fast-compile options (`$PFEDWN_FAST_COMPILE=1`, the quick tier's) differ from them by
    float32 rounding only (LLVM at -O0: 1 ulp seen): the methods with gradients of gradients,
    a proximal term and EM."""
    assert program.CPU_COMPILER_OPTIONS  # what this test is about
    methods = ("fedprox", "perfedavg", "pfedwn")
    config = ExperimentConfig(**{**TINY_RUN, "rounds": 2}, algorithms=methods)

    def table(fast: str):
        monkeypatch.setenv(program.FAST_COMPILE_ENV, fast)
        for cached in (program.block_program, program.init_program, program.model_init_program):
            cached.cache_clear()
        jax.clear_caches()
        return sweep(config, seeds="0-1", progress=False).rows

    tuned, fast = table("0"), table("1")
    monkeypatch.setattr(program, "CPU_COMPILER_OPTIONS", None)
    default = table("0")
    for k in ("target_accuracy", "target_loss", "mean_client_accuracy"):
        np.testing.assert_array_equal(tuned[k], default[k], err_msg=k)
        np.testing.assert_allclose(fast[k], default[k], rtol=1e-6, atol=1e-7, err_msg=k)


def test_fast_compile_takes_only_0_or_1(monkeypatch):
    monkeypatch.setenv(program.FAST_COMPILE_ENV, "yes")
    with pytest.raises(ValueError, match="PFEDWN_FAST_COMPILE='yes': allowed 0 or 1"):
        program.cpu_compiler_options()
    monkeypatch.setenv(program.FAST_COMPILE_ENV, "1")
    assert program.cpu_compiler_options() == program.FAST_COMPILE_OPTIONS
