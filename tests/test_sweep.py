"""A sweep computes, run by run, what `run()` computes; it resumes exactly; it fails early."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import VARIED_RUN, loss_rtol

import pfedwn_jax
from pfedwn_jax import ExperimentConfig, sweep
from pfedwn_jax.algorithms import available_algorithms
from pfedwn_jax.experiment.grid import expand, run_config
from pfedwn_jax.results.table import Table

EVERY_NUMBER = {
    "topology_seed": [0, 3],
    "lr": [0.05, 0.08],
    "fedprox.mu": [0.01, 0.1],
    "perfedavg.alpha": [0.01, 0.03],
    "fedamp.sigma": [1.0, 2.0],
    "pfedwn.a": [0.5, 0.3],
}


def _runs_equal(result, config, specs, atol=1e-6, records=()):
    """Every run's curve of every method equals `run()` of its own config, and so do the
    `(method, record)` pairs of `records` that the sweep kept."""
    for spec in specs:
        own = pfedwn_jax.run(run_config(config, spec), progress=False)
        for name, rec in records:
            got_rec = result.record(rec, spec.index, name)
            np.testing.assert_allclose(got_rec, own.records(name, rec), atol=atol, err_msg=rec)
        for name in config.method_names:
            sel = (result.rows["run"] == spec.index) & (result.rows["method"] == name)
            got = result.rows["target_accuracy"][sel]
            want = np.asarray(own.methods[name]["target_accuracy"])
            np.testing.assert_allclose(got, want, atol=atol, err_msg=f"{name} run {spec}")
            got_loss = result.rows["target_loss"][sel]
            np.testing.assert_allclose(got_loss, own.methods[name]["target_loss"], rtol=loss_rtol())


def _check_sweep_equals_runs(methods):
    config = ExperimentConfig(**VARIED_RUN, algorithms=methods)
    grid = {k: v for k, v in EVERY_NUMBER.items() if k.split(".")[0] in (*methods, k)}
    result = sweep(config, seeds=[1], grid=grid, zip=True, block=1, progress=False)
    assert result.meta["programs"] == 1  # every number batched, shapes padded
    specs = expand(config, [1], grid, zip=True)
    _runs_equal(result, config, specs if len(methods) > 2 else specs[:1])  # [0]: padded slots
    assert set(result.rows["lr"]) == {0.05, 0.08}


def test_sweep_equals_runs_pfedwn_and_local():
    """The quick tier: pFedWN (EM pairs padded) and Local."""
    _check_sweep_equals_runs(("local", "pfedwn"))


@pytest.mark.slow
def test_sweep_equals_runs_for_every_algorithm():
    _check_sweep_equals_runs(available_algorithms())


def test_blocks_odd_runs_and_grouped_shapes():
    """3 runs on 2 devices (one padding run), 3 rounds in blocks of 2 and 1, and a grid value
    that changes the program (batch size) grouped into a second program."""
    config = ExperimentConfig(**{**VARIED_RUN, "rounds": 3}, algorithms=("fedavg",))
    grid = {"batch_size": [32, 16]}
    result = sweep(config, seeds="0-1", grid=grid, block=2, progress=False)
    assert result.meta["programs"] == 2
    specs = expand(config, "0-1", grid)
    _runs_equal(result, config, specs[3:])  # a run of the second program (batch size 16)
    assert len(result) == 4 * 3


def test_resume_after_interruption_gives_the_same_numbers(tmp_path, monkeypatch):
    config = ExperimentConfig(**{**VARIED_RUN, "rounds": 3}, algorithms=("local", "pfedwn"))
    kwargs = dict(seeds=[0, 1], block=1, progress=False, checkpoint=tmp_path / "ck")
    full = sweep(config, **{**kwargs, "checkpoint": None})
    add_block, calls = Table.add_block, []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 9:  # pfedwn's second block (local's 3 blocks x 2 runs came first)
            raise KeyboardInterrupt
        return add_block(self, *args, **kwargs)

    monkeypatch.setattr(Table, "add_block", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sweep(config, **kwargs)
    monkeypatch.setattr(Table, "add_block", add_block)
    resumed = sweep(config, **kwargs, resume=True)
    for key in ("run", "method", "round", "target_accuracy", "target_loss"):
        np.testing.assert_array_equal(resumed.rows[key], full.rows[key], err_msg=key)


def test_resume_of_another_sweep_is_refused(tmp_path):
    config = ExperimentConfig(**{**VARIED_RUN, "rounds": 1}, algorithms=("local",))
    sweep(config, seeds=[0], progress=False, checkpoint=tmp_path)
    with pytest.raises(ValueError, match=r"another job: .*seed 0 then, 1 now"):
        sweep(config, seeds=[1], progress=False, checkpoint=tmp_path, resume=True)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(grid={"learning_rate": [0.1]}), "unknown key 'learning_rate'"),
        (dict(grid={"lr": [-1.0]}), r"grid\[lr\]"),
        (dict(block=0), "block"),
        (dict(seeds="3-1"), "seed"),
    ],
)
def test_bad_input_fails_before_any_work(kwargs, match):
    config = ExperimentConfig(**VARIED_RUN, algorithms=("local",))
    with pytest.raises(ValueError, match=match):
        sweep(config, progress=False, **kwargs)


@pytest.mark.slow
def test_partition_fields_and_val_fraction_sweep_like_runs():
    """Partition knobs and `val_fraction` are grid keys: each run equals `run()`; runs with
    and without a validation split compile apart and the latter get NaN validation rows."""
    config = ExperimentConfig(**VARIED_RUN, algorithms=("local",), pool="train")
    grid = {"classes_per_client": [2, 3], "val_fraction": [0.0, 0.25]}
    result = sweep(config, seeds=[0], grid=grid, zip=True, block=2, progress=False)
    assert result.meta["programs"] == 2
    specs = expand(config, [0], grid, zip=True)
    _runs_equal(result, config, specs)
    val = result.rows["target_val_accuracy"]
    assert np.isnan(val[result.rows["run"] == 0]).all()
    assert np.isfinite(val[result.rows["run"] == 1]).all()


def test_validation_accuracy_equals_runs_and_ranks_the_grid():
    """With a validation split, each run's per-round target validation accuracy equals
    `run()`'s record, and `summary(metric=...)` ranks the grid on it."""
    config = ExperimentConfig(**VARIED_RUN, algorithms=("local",), val_fraction=0.25)
    grid = {"lr": [0.05, 0.5]}
    result = sweep(config, seeds=[0], grid=grid, block=2, progress=False)
    for spec in expand(config, [0], grid):
        own = pfedwn_jax.run(run_config(config, spec), progress=False)
        sel = result.rows["run"] == spec.index
        want = np.asarray(own.methods["local"]["target_val_accuracy"])
        np.testing.assert_allclose(result.rows["target_val_accuracy"][sel], want, atol=1e-6)
    by_val = result.summary(metric="target_val_accuracy")
    assert [e["lr"] for e in by_val] == [0.05, 0.5]
    assert not np.allclose(
        [e["final_mean"] for e in by_val], [e["final_mean"] for e in result.summary()]
    )


def _links_and_mobility():
    config = ExperimentConfig(
        **{**VARIED_RUN, "rounds": 3},
        algorithms=("local", "pfedwn"),
        link_model="bernoulli",
        stale=True,
        mobility="waypoint",
        reselect_every=2,
    )
    grid = {"link_failure": [0.0, 0.3], "speed": [0.0, 2.0]}
    return config, grid


def test_moving_runs_with_and_without_selection_share_one_program():
    """Selection off is `eps = inf` (an array), not a code path: moving runs with and
    without channel-aware selection are one program, each run equal to its own `run()`, and
    without selection a re-selection lists at least as many neighbors."""
    config = ExperimentConfig(
        **{**VARIED_RUN, "rounds": 3}, algorithms=("local",), mobility="waypoint", speed=2.0,
        reselect_every=1, link_model="physical",
    )  # fmt: skip
    grid = {"selection": [True, False]}
    result = sweep(config, seeds="0", grid=grid, records=("neighbor_mask",), progress=False)
    assert result.meta["programs"] == 1 and result.num_runs == 2
    on, off = (result.record("neighbor_mask", i, "local")[:, 0].sum(-1) for i in (0, 1))
    assert np.all(off >= on) and np.any(off > on)
    _runs_equal(result, config, expand(config, "0", grid)[1:])  # selection off, eps = inf


@pytest.mark.slow  # the quick tier runs stale links and motion in sweeps of their own
def test_stale_links_and_mobility_sweep_equals_every_run_and_keeps_pi():
    """Stale links, a lossy link model and moving nodes inside one sweep (one program, no
    `run()`), pFedWN's pi kept per round for every run; every run equals its own `run()`."""
    config, grid = _links_and_mobility()
    result = sweep(config, seeds="0-1", grid=grid, records=("pi",), progress=False)
    assert result.meta["programs"] == 1 and result.num_runs == 8
    specs = expand(config, "0-1", grid)
    for spec in specs:
        pi = result.record("pi", spec.index, "pfedwn")
        assert pi.shape[0] == 3 and np.all(np.isfinite(pi))
    _runs_equal(result, config, specs, records=[("pfedwn", "pi")])


def test_a_job_holds_one_placed_program_at_a_time(monkeypatch):
    """Programs are placed when run and the previous one is let go: a job's memory is one
    program's runs, however many programs `max_runs` makes."""
    import gc
    import weakref

    from pfedwn_jax.runner import execute

    class Placed:
        def __init__(self, ids):
            self.ids = ids

    made = []
    monkeypatch.setattr(
        execute, "make_group", lambda ids, exps, mesh: made.append(ids) or Placed(ids)
    )
    groups = execute.PlacedGroups([[0, 1], [2, 3], [4]], exps=None, mesh=None)
    first = weakref.ref(groups[0])
    assert groups[0] is first() and made == [[0, 1]]  # asked again: not placed again
    second = groups[1]
    gc.collect()
    assert first() is None and second.ids == [2, 3] and len(groups) == 3
    assert made == [[0, 1], [2, 3]]


@pytest.mark.slow  # the quick tier keeps a cheaper check of the same property
def test_sweep_split_by_max_runs_equals_one_program():
    config = ExperimentConfig(**{**VARIED_RUN, "rounds": 2}, algorithms=("pfedwn",))
    one = sweep(config, seeds="0-2", progress=False)
    split = sweep(config, seeds="0-2", progress=False, max_runs=1)
    assert split.meta["programs"] > one.meta["programs"]
    for k in ("target_accuracy", "target_loss"):
        np.testing.assert_allclose(split.rows[k], one.rows[k], rtol=1e-5, atol=1e-6)
