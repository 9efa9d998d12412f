"""Mobility during training (`mobility`, `speed`, `round_seconds`, `reselect_every`)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import TINY_RUN

import pfedwn_jax
from pfedwn_jax import ExperimentConfig
from pfedwn_jax.experiment.federation import channel_params, network_perr
from pfedwn_jax.experiment.setup import setup
from pfedwn_jax.runner.links import begin_round, end_round, init_track, reselect

BASE = {**TINY_RUN, "rounds": 2, "num_neighbors": 6, "gamma_th": 5.0, "eps": 0.1}


def _run(**kw):
    return pfedwn_jax.run(ExperimentConfig(**{**BASE, **kw}), progress=False)


@pytest.mark.parametrize(
    ("mode", "kw"),
    [
        pytest.param("single", dict(mobility="waypoint"), marks=pytest.mark.slow),
        pytest.param(
            "network",
            dict(mobility="gaussian", link_model="bernoulli", link_failure=0.3),
            marks=pytest.mark.slow,
        ),
    ],
)
def test_speed_zero_equals_no_mobility(mode, kw):
    methods = ("pfedwn",) if mode == "single" else ("fedavg", "pfedwn")
    still = _run(mode=mode, algorithms=methods, **{**kw, "mobility": "none"})
    moving = _run(mode=mode, algorithms=methods, speed=0.0, reselect_every=1, **kw)
    for m in methods:
        assert moving.methods[m]["target_accuracy"] == still.methods[m]["target_accuracy"]
        for mine, theirs in zip(  # single mode: the extra slots (unselected clients) come last
            moving.methods[m]["client_loss"], still.methods[m]["client_loss"], strict=True
        ):
            # to float rounding: the two programs' evaluations reduce over differently padded
            # (bucketed) sample axes, and XLA may sum them in another order
            np.testing.assert_allclose(mine[: len(theirs)], theirs, rtol=1e-6, err_msg=m)
        assert not any(moving.methods[m]["records"]["reselected"])
    assert moving.network["mobility"]["rounds"] == [1]


def _rounds(config: ExperimentConfig, n: int):
    """`n` rounds of the runner's link halves alone (no algorithm): the per-round records."""
    exp = setup(config)
    params = {"w": np.zeros((exp.ctx.num_slots, 1), np.float32)}
    track = init_track(jax.random.wrap_key_data(exp.init_key), exp.ctx, params)
    root = jax.random.wrap_key_data(exp.round_root)
    out = []
    for r in range(n):
        key = jax.random.fold_in(root, r)
        ctx, rec, drawn = begin_round(exp.ctx, track, key)
        track, _ = end_round(ctx, track, drawn, None, key)
        out.append(jax.tree.map(np.asarray, rec))
    return exp, out


def test_positions_stay_in_the_area_and_reselection_follows_the_geometry():
    config = ExperimentConfig(
        **{**BASE, "eps": 0.05},
        mobility="gaussian",
        speed=200.0,  # several area widths per round: reflection at the walls every round
        reselect_every=2,
    )
    exp, recs = _rounds(config, 9)
    area = channel_params(config).area_m
    pos = np.stack([r["positions"] for r in recs])
    assert ((pos >= 0) & (pos <= area)).all()
    assert np.abs(np.diff(pos, axis=0)).max() > 1.0  # they do move
    k = exp.ctx.neighbors.shape[1]
    changed = False
    for r, rec in enumerate(recs):
        if r == 0 or r % 2:  # not a re-selection round: the lists of the round before
            want_nbr = np.asarray(exp.ctx.neighbors) if r == 0 else recs[r - 1]["neighbors"]
            np.testing.assert_array_equal(rec["neighbors"], want_nbr)
            continue
        # host reference: the target's links with P_err < eps at these positions (float64)
        perr = network_perr(
            rec["positions"].astype(np.float64), 5.0, channel_params(config), "paper"
        )
        ok = np.nonzero(perr[0, 1:] < 0.05)[0] + 1
        chosen = ok[np.argsort(perr[0, ok], kind="stable")][: k - 1]
        got = rec["neighbors"][0][rec["neighbor_mask"][0]][1:]
        np.testing.assert_array_equal(got, np.sort(chosen))
        group = np.concatenate([[0], np.sort(chosen)])
        for s in range(exp.ctx.num_slots):  # the group is fully connected, the rest alone
            row = rec["neighbors"][s][rec["neighbor_mask"][s]]
            want = np.concatenate([[s], group[group != s]]) if s in group else [s]
            np.testing.assert_array_equal(row, want)
        changed |= bool(rec["reselected"])
        assert (
            rec["reselected"]
            == (rec["neighbors"] != recs[r - 1]["neighbors"]).any()
            | (rec["neighbor_mask"] != recs[r - 1]["neighbor_mask"]).any()
        )
    assert changed  # at 200 m/s the target's neighbor set changes


def test_reselect_network_mode_keeps_the_k_minus_1_lowest_perr():
    rows = [
        [0.0, 0.01, 0.2, 0.03, 0.02],  # 1, 3, 4 below eps: the two lowest, 1 and 4
        [0.5, 0.0, 0.5, 0.5, 0.5],  # none
        [0.01, 0.01, 0.0, 0.01, 0.01],  # ties: the lowest indices
        [0.04, 0.0, 0.0, 0.0, 0.2],
        [0.0, 0.0, 0.0, 0.0, 0.0],
    ]
    perr = np.array(rows, np.float32)
    nbr, mask = reselect(perr, 3, 0.05, single=False)
    np.testing.assert_array_equal(nbr, [[0, 1, 4], [1, 1, 1], [2, 0, 1], [3, 1, 2], [4, 0, 1]])
    np.testing.assert_array_equal(mask[:, 1:], [[1, 1], [0, 0], [1, 1], [1, 1], [1, 1]])
    nbr, mask = reselect(perr, 3, np.inf, single=False)  # no selection: lowest P_err of all
    np.testing.assert_array_equal(nbr[1], [1, 0, 2])


def test_pfedwn_re_estimates_after_a_reselection():
    res = _run(
        algorithms=("pfedwn",),
        rounds=4,
        mobility="waypoint",
        speed=40.0,
        reselect_every=1,
        hparams={"pfedwn": {"em_steps": 0, "em_iters": 20}},
    )
    rec = res.methods["pfedwn"]["records"]
    flags = np.asarray(rec["reselected"])
    pi = np.asarray(rec["pi"])
    assert flags[1:].any()
    for r in range(2, 4):  # warm-up 1: pi from round 2 on; em_every=0 freezes it otherwise
        assert (pi[r] != pi[r - 1]).any() == flags[r], r
    mob = res.network["mobility"]
    assert mob["rounds"] == [1] + [r + 1 for r in range(1, 4) if flags[r]]
    assert np.shape(mob["positions"]) == (len(mob["rounds"]), 7, 2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(mobility="waypoint", speed=-1.0), "speed"),
        (dict(mobility="levy"), "mobility"),
        (dict(mobility="gaussian", round_seconds=0.0), "round_seconds"),
        (dict(mobility="gaussian", reselect_every=-1), "reselect_every"),
    ],
)
def test_bad_mobility_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ExperimentConfig(**kwargs)


@pytest.mark.slow
def test_a_resumed_run_with_stale_links_and_mobility_repeats_the_uninterrupted_one(tmp_path):
    config = ExperimentConfig(
        **{**BASE, "rounds": 3},
        algorithms=("fedavg",),
        link_model="bernoulli",
        link_failure=0.5,
        stale=True,
        mobility="waypoint",
        speed=20.0,
        reselect_every=1,
    )
    full = pfedwn_jax.run(config, progress=False)

    def stop(name, rounds_done, row):
        if rounds_done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pfedwn_jax.run(config, progress=False, checkpoint=tmp_path, callback=stop)
    resumed = pfedwn_jax.run(config, progress=False, checkpoint=tmp_path, resume=True)
    for key in ("client_loss", "records"):
        assert resumed.methods["fedavg"][key] == full.methods["fedavg"][key], key
    assert resumed.network["mobility"] == full.network["mobility"]
