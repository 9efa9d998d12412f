"""`pfedwn_jax.experiment.grid`: seeds, grid keys, the runs of a sweep and each run's config."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pfedwn_jax._checks import SEED_MAX
from pfedwn_jax.algorithms import default_algorithms, get_algorithm
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.grid import (
    CHANNEL_GRID_KEYS,
    GRID_FIELDS,
    MAX_RUNS,
    RunSpec,
    expand,
    grid_keys,
    parse_grid_arg,
    parse_seeds,
    run_config,
)

BASE = ExperimentConfig(
    algorithms=("fedavg", "fedprox", "pfedwn"), hparams={"pfedwn": {"em_steps": 2}}
)


# ---------------------------------------------------------------------------------- seeds
@pytest.mark.parametrize(
    ("spec", "seeds"),
    [
        ("0-15", tuple(range(16))),
        ("0,3,7", (0, 3, 7)),
        ("5", (5,)),
        (" 2 - 4 , 9 ", (2, 3, 4, 9)),
        ("7-7", (7,)),
        (16, (16,)),  # an int is that one seed, not a count
        (np.int64(3), (3,)),
        ([4, 1, 2], (4, 1, 2)),
        (range(3), (0, 1, 2)),
        (np.arange(2), (0, 1)),
        (f"{SEED_MAX - 1}-{SEED_MAX}", (SEED_MAX - 1, SEED_MAX)),
    ],
)
def test_parse_seeds(spec, seeds):
    parsed = parse_seeds(spec)
    assert parsed == seeds
    assert all(type(s) is int for s in parsed)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("0-3,2", "seed 2 appears twice"),
        ([1, 1], "seed 1 appears twice"),
        ("", "neither a seed nor a range"),
        ("0,,1", "neither a seed nor a range"),
        ("a-b", "'a-b'"),
        ("1.5", "'1.5'"),
        ("5-3", "range '5-3' is empty"),
        ("-1", r"seeds must be in \[0, 4294967295\]"),
        (f"0-{SEED_MAX + 1}", "4294967296"),
        (f"0-{MAX_RUNS}", f"at most {MAX_RUNS}"),
        ([], "no seed"),
        ([0, 1.5], r"seeds\[1\] must be an integer"),
        (True, "seeds must be an integer"),
        (None, "seeds must be an integer"),
    ],
)
def test_parse_seeds_rejects(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_seeds(spec)


# ------------------------------------------------------------------------------ grid keys
def test_grid_keys_are_fields_then_every_hparam_of_the_methods_run():
    keys = grid_keys(BASE)
    hp = [
        f"{m}.{f.name}"
        for m in BASE.algorithms
        for f in dataclasses.fields(get_algorithm(m).hparams)
    ]
    assert keys == GRID_FIELDS + CHANNEL_GRID_KEYS + tuple(hp)
    assert "fedprox.mu" in keys and "pfedwn.a" in keys and "perfedavg.alpha" not in keys
    for excluded in ("seed", "algorithms", "hparams", "rounds", "dataset", "model", "channel"):
        assert excluded not in keys
    # every swept field is a real config field; an empty `algorithms` means every method
    assert set(GRID_FIELDS) <= set(ExperimentConfig.field_names())
    every = grid_keys(ExperimentConfig())
    assert {k.split(".")[0] for k in every if "." in k} - {"channel"} == {
        m for m in default_algorithms() if dataclasses.fields(get_algorithm(m).hparams)
    }


# ---------------------------------------------------------------------------------- expand
def _reference_runs(seeds, grid):
    """The runs of a product sweep by plain nested loops (first key outermost, seeds last)."""
    points = [{}]
    for key, values in grid.items():
        points = [{**p, key: v} for p in points for v in values]
    return [(s, p) for p in points for s in seeds]


def test_expand_is_the_product_with_seeds_innermost():
    grid = {"lr": [0.01, 0.05], "pfedwn.a": [0.3, 0.5, 0.7], "eps": [0.1]}
    runs = expand(BASE, "0-3", grid)
    ref = _reference_runs(range(4), grid)
    assert len(runs) == 2 * 3 * 1 * 4
    assert [r.index for r in runs] == list(range(len(ref)))
    assert [(r.seed, r.values) for r in runs] == ref
    assert all(isinstance(r, RunSpec) for r in runs)
    assert list(runs[0].values) == list(grid)  # the key order of the grid


def test_expand_zip_pairs_the_lists():
    grid = {"lr": [0.01, 0.05, 0.1], "fedprox.mu": [0.1, 0.2, 0.3]}
    runs = expand(BASE, [7, 3], grid, zip=True)
    expected = [({"lr": lr, "fedprox.mu": mu}, s) for lr, mu in zip(*grid.values()) for s in (7, 3)]
    assert [(r.values, r.seed) for r in runs] == expected
    # a value may repeat in one list when paired, as long as the points differ
    runs = expand(BASE, "0", {"lr": [0.1, 0.1], "eps": [0.1, 0.2]}, zip=True)
    assert [r.values for r in runs] == [{"lr": 0.1, "eps": 0.1}, {"lr": 0.1, "eps": 0.2}]


def test_expand_without_grid_runs_the_seeds():
    for grid in (None, {}):
        for paired in (False, True):
            runs = expand(BASE, "2,0", grid, zip=paired)
            every = BASE.method_names
            assert runs == (RunSpec(0, 2, {}, every), RunSpec(1, 0, {}, every))


def test_expand_normalises_values_as_the_config_stores_them():
    runs = expand(
        BASE, "0", {"lr": [1, np.float32(0.5)], "batch_size": [16.0], "local_steps": [None, 3]}
    )
    assert [r.values for r in runs] == [
        {"lr": 1.0, "batch_size": 16, "local_steps": None},
        {"lr": 1.0, "batch_size": 16, "local_steps": 3},
        {"lr": 0.5, "batch_size": 16, "local_steps": None},
        {"lr": 0.5, "batch_size": 16, "local_steps": 3},
    ]
    assert type(runs[0].values["lr"]) is float and type(runs[0].values["batch_size"]) is int
    assert expand(BASE, "0", {"eps": np.array([0.1, 0.2])})[1].values == {"eps": 0.2}


@given(
    lengths=st.lists(st.integers(1, 3), min_size=0, max_size=3),
    seeds=st.lists(st.integers(0, 50), min_size=1, max_size=4, unique=True),
    paired=st.booleans(),
)
def test_expand_matches_the_loop_reference(lengths, seeds, paired):
    keys = ["lr", "momentum", "pfedwn.a"][: len(lengths)]
    if paired:
        lengths = [lengths[0]] * len(lengths) if lengths else []
    grid = {k: [round(0.1 * (i + 1), 3) for i in range(n)] for k, n in zip(keys, lengths)}
    runs = expand(BASE, seeds, grid, zip=paired)
    if paired:
        points = [dict(zip(keys, vals)) for vals in zip(*grid.values())] or [{}]
        ref = [(s, p) for p in points for s in seeds]
    else:
        ref = _reference_runs(seeds, grid)
    assert [(r.seed, r.values) for r in runs] == ref
    points = (lengths[0] if lengths else 1) if paired else int(np.prod(lengths))
    assert len(runs) == points * len(seeds)


@pytest.mark.parametrize(
    ("grid", "match"),
    [
        ({"learning_rate": [0.1]}, r"grid: unknown key 'learning_rate'; allowed: \['lr', "),
        ({"seed": [1, 2]}, "unknown key 'seed' .*seeds="),
        ({"algorithms": [["fedavg"]]}, "unknown key 'algorithms'"),
        ({"rounds": [5]}, "unknown key 'rounds'.*'pfedwn.a'"),
        ({"perfedavg.alpha": [0.1]}, r"unknown key 'perfedavg.alpha' \(methods run: \['fedavg'"),
        ({"pfedwn.b": [0.1]}, "unknown key 'pfedwn.b'"),
        ({"lr": 0.1}, r"grid\[lr\] must be a list of values; got 0.1"),
        ({"partition": "paper"}, r"grid\[partition\] must be a list of values; got 'paper'"),
        ({"lr": []}, r"grid\[lr\] must be a non-empty list"),
        ({"lr": [0.1, -1.0]}, r"grid\[lr\]: value -1.0 is not allowed: lr must be in \(0.0, inf\)"),
        ({"lr": [True]}, r"grid\[lr\]: value True .*lr must be a number"),
        ({"pfedwn.a": [0.5, 1.5]}, r"grid\[pfedwn.a\]: value 1.5 .*hparams.pfedwn.a must be in"),
        ({"target": [99]}, r"grid\[target\]: value 99 "),
        ({"moments": ["exact", "nope"]}, r"grid\[moments\]: value 'nope' .*one of"),
        ({"topology_seed": [-1]}, r"grid\[topology_seed\]: value -1 "),
        ({"lr": [0.1, 0.1]}, r"grid\[lr\] repeats the value 0.1"),
        ({"batch_size": [16, 16.0]}, r"grid\[batch_size\] repeats the value 16"),
        (["lr"], "grid must map keys to lists"),
    ],
)
def test_expand_rejects_bad_grids(grid, match):
    with pytest.raises(ValueError, match=match):
        expand(BASE, "0", grid)


def test_expand_rejects_bad_zips_and_seeds():
    with pytest.raises(ValueError, match=r"one length; got \{'lr': 2, 'eps': 1\}"):
        expand(BASE, "0", {"lr": [0.1, 0.2], "eps": [0.1]}, zip=True)
    with pytest.raises(ValueError, match=r"point \{'lr': 0.1, 'eps': 0.1\} appears twice"):
        expand(BASE, "0", {"lr": [0.1, 0.1], "eps": [0.1, 0.1]}, zip=True)
    with pytest.raises(ValueError, match="appears twice"):
        expand(BASE, "1,1", {"lr": [0.1]})
    with pytest.raises(ValueError, match=f"= {2 * MAX_RUNS} runs; at most {MAX_RUNS}"):
        expand(BASE, f"1-{MAX_RUNS}", {"lr": [0.1, 0.2]})
    many = {
        k: [0.1 * (i + 1) for i in range(9)] for k in ("lr", "alpha", "gamma_th", "fedamp.sigma")
    }
    many["fedprox.mu"] = [0.1 * (i + 1) for i in range(9)]  # 9**5 points: refused, not listed
    with pytest.raises(ValueError, match=f"{9**5} grid point"):
        expand(ExperimentConfig(), "0-1", many)


def test_a_huge_grid_list_is_refused_before_its_values_are_checked():
    import time

    from pfedwn_jax.api import sweep

    start = time.perf_counter()
    with pytest.raises(ValueError, match=f"{10**6} grid point.*at most {MAX_RUNS}"):
        sweep(BASE, "0", {"lr": list(range(10**6))}, progress=False)
    assert time.perf_counter() - start < 1.0
    with pytest.raises(ValueError, match=r"must be a list of values; got .{0,200}$"):
        expand(BASE, "0", {"lr": {i: i for i in range(10**4)}.keys()})


# ------------------------------------------------------------------------------ run config
def test_run_config_is_the_hand_written_config_of_the_run():
    spec = RunSpec(5, 11, {"lr": 0.2, "eps": 0.3, "pfedwn.a": 0.7, "fedprox.mu": 0.5})
    expected = ExperimentConfig(
        algorithms=("fedavg", "fedprox", "pfedwn"),
        hparams={"pfedwn": {"em_steps": 2, "a": 0.7}, "fedprox": {"mu": 0.5}},
        lr=0.2,
        eps=0.3,
        seed=11,
    )
    config = run_config(BASE, spec)
    assert config == expected
    assert config.hparams_for("pfedwn").a == 0.7 and config.hparams_for("pfedwn").em_steps == 2
    assert BASE.hparams == {"pfedwn": {"em_steps": 2}} and BASE.lr == 0.05  # unchanged
    assert run_config(BASE, RunSpec(0, 3, {})) == BASE.replace(seed=3)


def test_every_run_config_carries_its_values_and_seed():
    runs = expand(BASE, "0-2", {"data_seed": [4, 5], "pfedwn.em_steps": [1, 3]})
    for spec in runs:
        config = run_config(BASE, spec)
        assert config.seed == spec.seed and config.data_seed == spec.values["data_seed"]
        assert config.hparams_for("pfedwn").em_steps == spec.values["pfedwn.em_steps"]
        assert config.topology_seed == BASE.topology_seed  # never follows the seed


def test_seed_follows_into_the_partition_only_while_data_seed_is_unset():
    # the runner draws the partition from `data_seed`, or from `seed` when it is None
    partition_seed = lambda c: c.seed if c.data_seed is None else c.data_seed
    runs = expand(BASE, "0-2", None)
    assert [partition_seed(run_config(BASE, r)) for r in runs] == [0, 1, 2]
    fixed = BASE.replace(data_seed=9)
    assert {partition_seed(run_config(fixed, r)) for r in expand(fixed, "0-2")} == {9}
    assert {run_config(BASE, r).topology_seed for r in runs} == {0}


def test_run_config_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="unknown key 'seed'"):
        run_config(BASE, RunSpec(0, 0, {"seed": 3}))
    with pytest.raises(ValueError, match=r"lr must be in \(0.0, inf\)"):
        run_config(BASE, RunSpec(0, 0, {"lr": 0.0}))
    with pytest.raises(ValueError, match="seed must be in"):
        run_config(BASE, RunSpec(0, -1, {}))


# ------------------------------------------------------------------------------------ CLI
@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("lr=0.01,0.05", ("lr", [0.01, 0.05])),
        ("batch_size=16,32", ("batch_size", [16, 32])),
        (" pfedwn.a = 0.3, 0.5 ,0.7", ("pfedwn.a", [0.3, 0.5, 0.7])),
        ("pfedwn.component_updates=true,False", ("pfedwn.component_updates", [True, False])),
        ("target=random,0,-2", ("target", ["random", 0, -2])),
        ("fedprox.mu=1e-3", ("fedprox.mu", [0.001])),
        ("moments=paper,exact", ("moments", ["paper", "exact"])),
        ("x=1=2", ("x", ["1=2"])),
    ],
)
def test_parse_grid_arg(text, parsed):
    key, values = parse_grid_arg(text)
    assert (key, values) == parsed
    assert [type(v) for v in values] == [type(v) for v in parsed[1]]


@pytest.mark.parametrize(
    ("text", "match"),
    [("lr", "KEY=V1,V2"), ("=0.1", "KEY=V1,V2"), ("lr=", "empty value"), ("lr=0.1,,0.2", "empty")],
)
def test_parse_grid_arg_rejects(text, match):
    with pytest.raises(ValueError, match=match):
        parse_grid_arg(text)
