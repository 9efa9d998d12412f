"""Inputs that used to fail late, silently or with a traceback: each is now handled at the
door (a clamp with a note, a named `ValueError`, a warning). The table of bad inputs through
every entry point is `test_probe.py`."""

from __future__ import annotations

import logging

import chex
import jax
import numpy as np
import optax
import pytest
from helpers import CLASSES, SHAPE, TINY_RUN, make_data

from pfedwn_jax.data.batching import fit_batch_size
from pfedwn_jax.engine import init_client_state, local_train
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.runner import setup
from pfedwn_jax.models import get_model


# --------------------------------------------------------------------------- batch clamp
def test_fit_batch_size_clamps_to_the_largest_client_with_one_note(caplog):
    with caplog.at_level(logging.WARNING, logger="pfedwn_jax"):
        assert fit_batch_size(32, [5, 800, 0]) == 32
        assert fit_batch_size(800, [5, 800, 0]) == 800
        assert not caplog.records
        assert fit_batch_size(1_000_000, np.array([5, 800, 0])) == 800
    assert len(caplog.records) == 1
    assert "1000000" in caplog.text and "800" in caplog.text
    assert fit_batch_size(64, [0, 0]) == 64  # no data at all: left to the engine's checks


@pytest.mark.parametrize("steps", [None, 2])
def test_a_batch_larger_than_every_client_gives_the_numbers_of_the_largest_client(steps):
    """The padded schedule (the engine without the clamp) against the clamped one."""
    model = get_model("mlp", CLASSES, SHAPE)
    opt = optax.sgd(0.1)
    data = make_data()  # counts 11, 5, 0, 9, 3; M = 16
    dc = np.array([0, 1, 3, 4])
    state = init_client_state(model, opt, jax.random.key(0), len(dc))
    kw = dict(num_steps=steps, strategy="vmap")
    key = jax.random.key(3)
    padded, m_pad = local_train(model, opt, state, data, dc, key, batch_size=64, **kw)
    clamped, m_cl = local_train(
        model, opt, state, data, dc, key, batch_size=fit_batch_size(64, [11, 5, 9, 3]), **kw
    )
    chex.assert_trees_all_close(padded, clamped, rtol=1e-5, atol=1e-8)  # summation order only
    np.testing.assert_allclose(m_pad["loss"], m_cl["loss"], rtol=1e-6)


def test_setup_clamps_the_batch_of_the_round_context():
    exp = setup(ExperimentConfig(**{**TINY_RUN, "batch_size": 1_000_000}))
    largest = int(np.asarray(exp.data.train.count)[exp.federation.data_client].max())
    assert exp.ctx.batch_size == largest
    assert setup(ExperimentConfig(**TINY_RUN)).ctx.batch_size == TINY_RUN["batch_size"]
