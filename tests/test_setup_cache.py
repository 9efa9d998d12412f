"""The host set-up's federation cache (`experiment.setup.federation_of`): keyed on every
config field the federation reads, so configs that differ in one of them (a fading model,
shadowing) never share a federation."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
from helpers import TINY_RUN

from pfedwn_jax import ExperimentConfig
from pfedwn_jax.experiment import federation
from pfedwn_jax.experiment.federation import build_federation
from pfedwn_jax.experiment.setup import FEDERATION_FIELDS, federation_of

#: Properties of the config derived from fields in the key.
DERIVED = {"num_clients": "num_neighbors"}


def test_the_cache_key_holds_every_field_the_federation_reads():
    source = Path(federation.__file__).read_text()
    read = set(re.findall(r"\bconfig\.([a-z_]+)", source))
    assert read, "the federation module reads no config field: the pattern is stale"
    missing = {DERIVED.get(f, f) for f in read} - set(FEDERATION_FIELDS)
    assert not missing, f"federation_of's key lacks {sorted(missing)}"
    assert set(DERIVED.values()) <= set(FEDERATION_FIELDS)


def test_configs_differing_in_fading_or_shadowing_get_their_own_federation():
    """Rayleigh first (cached), then a Rician law and shadowing on the same topology: each
    the federation `build_federation` gives it, with P_err of its own law."""
    base = ExperimentConfig(**{**TINY_RUN, "eps": 0.05})
    others = [
        dataclasses.replace(base, fading="rician", fading_param=10.0),
        dataclasses.replace(base, shadowing_db=8.0),
    ]
    first = federation_of(base).perr
    for config in others:
        got, want = federation_of(config), build_federation(config)
        np.testing.assert_array_equal(got.perr, want.perr)
        np.testing.assert_array_equal(got.data_client, want.data_client)
        assert not np.allclose(got.perr, first)
