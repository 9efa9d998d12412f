"""The front door (`pfedwn_jax.api`): `run` and `sweep` of one config or a list, one
`Options` object or its fields as keywords, and a saved sweep read back whole."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import TINY_RUN

import pfedwn_jax
from pfedwn_jax import ExperimentConfig, Options, Result, SweepResult
from pfedwn_jax.runner.options import options_from

CFG = ExperimentConfig(**{**TINY_RUN, "rounds": 2, "algorithms": ("local", "fedavg")})


def test_options_from_keywords_and_object():
    base = Options(progress=False, block=2)
    opt = options_from(base, {"block": 1}, records="all")
    assert (opt.progress, opt.block, opt.records) == (False, 1, "all")
    assert options_from(Options(records=("pi",)), {}, records=()).records == ("pi",)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['progres'\]"):
        options_from(None, {"progres": False}, records=())
    with pytest.raises(ValueError, match="options must be"):
        options_from({"progress": False}, {}, records=())  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.block = 3  # type: ignore[misc]


def test_run_of_a_list_and_sweep_of_a_list_equal_run_of_each():
    other = CFG.replace(seed=1)
    one = pfedwn_jax.run(CFG, Options(progress=False))
    both = pfedwn_jax.run([CFG, other], progress=False)
    assert isinstance(one, Result) and [type(r) for r in both] == [Result, Result]
    for m in CFG.method_names:
        np.testing.assert_allclose(
            both[0].methods[m]["target_accuracy"], one.methods[m]["target_accuracy"], atol=1e-6
        )
    res = pfedwn_jax.sweep(
        [CFG, other], labels=[{"seed": 0, "case": "a"}, {"seed": 1, "case": "b"}], progress=False
    )
    assert isinstance(res, SweepResult) and res.swept == ("case",)
    for i, r in enumerate(both):
        for m in CFG.method_names:
            sel = (res.rows["run"] == i) & (res.rows["method"] == m)
            np.testing.assert_allclose(
                res.rows["target_accuracy"][sel], r.methods[m]["target_accuracy"], atol=1e-6
            )
    unseeded = pfedwn_jax.sweep([CFG, other], labels=[{"case": "a"}, {"case": "b"}], progress=False)
    by_run = dict(zip(unseeded.rows["run"].tolist(), unseeded.rows["seed"].tolist(), strict=True))
    assert by_run == {0: CFG.seed, 1: other.seed}  # a label without a seed: the config's
    with pytest.raises(ValueError, match="one per config"):
        pfedwn_jax.sweep([CFG, other], labels=[{"seed": 0}], progress=False)
    with pytest.raises(ValueError, match="labels name the runs"):
        pfedwn_jax.sweep(CFG, labels=[{"seed": 0}], progress=False)
    with pytest.raises(ValueError, match="seeds and grid expand one config"):
        pfedwn_jax.sweep([CFG], seeds=[1, 2], progress=False)


def test_saved_sweep_loads_with_its_records(tmp_path):
    cfg = CFG.replace(algorithms=("pfedwn",))
    res = pfedwn_jax.sweep(cfg, seeds=[0, 1], records=("pi",), progress=False)
    assert res.records and all(k.endswith("/pfedwn/pi") for k in res.records)
    res.save(tmp_path / "s", plots=False)
    back = SweepResult.load(tmp_path / "s")
    assert sorted(back.records) == sorted(res.records)
    for k, v in res.records.items():
        np.testing.assert_array_equal(back.records[k], v)
    np.testing.assert_array_equal(back.record("pi", 1, "pfedwn"), res.record("pi", 1, "pfedwn"))
