"""Mobility models (pfedwn_jax.wireless.mobility): speed statistics, area, hand cases, errors.

Statistical tolerances are 5 standard errors (false-alarm odds ~6e-7 each).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pfedwn_jax.wireless import GaussianWalk, RandomWaypoint
from pfedwn_jax.wireless.mobility import reflect

MODELS = (GaussianWalk, RandomWaypoint)


def _start(n, area, seed=0):
    return jnp.asarray(np.random.default_rng(seed).uniform(0, area, (n, 2)), jnp.float32)


def test_gaussian_walk_speed_statistics():
    # far from the walls: |step| is Rayleigh with E|step|^2 = (speed dt)^2
    n, speed, dt, area = 20_000, 1.5, 2.0, 1e4
    state = GaussianWalk.init(jax.random.key(0), jnp.full((n, 2), area / 2), area, speed)
    d = np.linalg.norm(np.asarray(state.step(jax.random.key(1), dt).positions) - area / 2, axis=1)
    sigma = speed * dt / math.sqrt(2)
    mean, sd = sigma * math.sqrt(math.pi / 2), sigma * math.sqrt((4 - math.pi) / 2)
    assert abs(d.mean() - mean) < 5 * sd / math.sqrt(n)
    assert abs(d.mean() - speed * dt * math.sqrt(math.pi) / 2) < 5 * sd / math.sqrt(n)
    msd_sd = np.std(d**2) / math.sqrt(n)
    assert abs(np.mean(d**2) - (speed * dt) ** 2) < 5 * msd_sd


def test_random_waypoint_walks_speed_dt_per_step():
    n, speed, dt, area = 5_000, 1.0, 1.0, 50.0
    state = RandomWaypoint.init(jax.random.key(0), _start(n, area), area, speed)
    step = jax.jit(RandomWaypoint.step)
    disp = []
    for t in range(20):
        new = step(state, jax.random.key(t + 1), dt)
        disp.append(np.linalg.norm(np.asarray(new.positions - state.positions), axis=1))
        state = new
    disp = np.concatenate(disp)
    assert np.all(disp <= speed * dt * (1 + 1e-5))
    # straight segments: |step| = speed dt except in steps with an arrival (turns), which are
    # rare when speed dt is small against the mean leg (~0.52 area = 26 m)
    exact = np.isclose(disp, speed * dt, rtol=1e-4)
    assert 0.9 < exact.mean() < 1.0
    assert disp.mean() > 0.99 * speed * dt


def test_random_waypoint_hand_cases():
    state = RandomWaypoint(
        positions=jnp.array([[0.0, 0.0], [9.0, 0.0]]),
        waypoints=jnp.array([[10.0, 0.0], [10.0, 0.0]]),
        area=jnp.array(50.0),
        speed=jnp.array(2.0),
    )
    new = state.step(jax.random.key(3), 1.0)
    np.testing.assert_allclose(new.positions[0], [2.0, 0.0], atol=1e-6)  # on its way
    np.testing.assert_array_equal(new.waypoints[0], [10.0, 0.0])
    # node 1 arrives after 1 m, then walks the remaining 1 m towards its new waypoint
    goal = np.asarray(new.waypoints[1])
    assert not np.array_equal(goal, [10.0, 0.0])
    unit = (goal - [10.0, 0.0]) / np.linalg.norm(goal - [10.0, 0.0])
    np.testing.assert_allclose(new.positions[1], np.array([10.0, 0.0]) + unit, atol=1e-5)


def test_reflect_by_hand():
    x = jnp.array([-1.0, 3.0, 12.0, 21.0, -12.0])
    np.testing.assert_allclose(reflect(x, 10.0), [1.0, 3.0, 8.0, 1.0, 8.0], atol=1e-6)


@pytest.mark.parametrize("model", MODELS)
def test_positions_stay_in_the_area(model):
    area = 50.0
    state = model.init(jax.random.key(0), _start(500, area), area, 40.0)  # ~ area per step
    step = jax.jit(model.step)
    moved = False
    for t in range(30):
        new = step(state, jax.random.key(t), 1.0)
        moved |= bool(jnp.any(new.positions != state.positions))
        state = new
        xy = np.asarray(state.positions)
        assert np.all((xy >= 0) & (xy <= area))
    assert moved


@pytest.mark.parametrize("model", MODELS)
def test_zero_speed_or_zero_dt_means_no_motion(model):
    xy = _start(50, 50.0)
    still = model.init(jax.random.key(0), xy, 50.0, 0.0).step(jax.random.key(1), 3.0)
    np.testing.assert_array_equal(still.positions, xy)
    paused = model.init(jax.random.key(0), xy, 50.0, 2.0).step(jax.random.key(1), 0.0)
    np.testing.assert_array_equal(paused.positions, xy)
    # per-node speeds: only the moving nodes move
    speed = jnp.where(jnp.arange(50) % 2 == 0, 0.0, 2.0)
    half = model.init(jax.random.key(0), xy, 50.0, speed).step(jax.random.key(1), 1.0)
    np.testing.assert_array_equal(half.positions[::2], xy[::2])
    assert np.all(np.any(np.asarray(half.positions[1::2]) != np.asarray(xy[1::2]), axis=1))


@pytest.mark.parametrize("model", MODELS)
def test_determinism_and_vmap_over_runs(model):
    keys = jax.random.split(jax.random.key(5), 3)
    starts = jnp.stack([_start(20, 50.0, seed=s) for s in range(3)])
    runs = jax.vmap(lambda k, p: model.init(k, p, 50.0, 1.5))(keys, starts)
    stepped = jax.jit(jax.vmap(lambda s, k: model.step(s, k, 2.0)))(runs, keys)
    for i in range(3):
        one = model.init(keys[i], starts[i], 50.0, 1.5).step(keys[i], 2.0)
        np.testing.assert_allclose(stepped.positions[i], one.positions, atol=1e-6)
        again = model.init(keys[i], starts[i], 50.0, 1.5).step(keys[i], 2.0)
        np.testing.assert_array_equal(one.positions, again.positions)
    assert not np.allclose(stepped.positions[0], stepped.positions[1])


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"speed": -1.0}, r"speed must be in \[0.0, inf\)"),
        ({"speed": float("nan")}, "speed must be finite"),
        ({"speed": [1.0, 2.0]}, "speed must be a scalar or have shape"),
        ({"area": 0.0}, "area must be in"),
        ({"positions": [[1.0, 60.0], [2.0, 2.0], [3.0, 3.0]]}, "positions must lie in"),
        ({"positions": [[1.0, 2.0, 3.0]]}, "positions must have shape"),
    ],
)
def test_init_rejects_bad_input(model, kwargs, match):
    args = {
        "key": jax.random.key(0),
        "positions": [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]],
        "area": 50.0,
        "speed": 1.0,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        model.init(**args)


@pytest.mark.parametrize("model", MODELS)
def test_step_rejects_negative_dt(model):
    state = model.init(jax.random.key(0), [[1.0, 1.0]], 50.0, 1.0)
    with pytest.raises(ValueError, match="dt must be in"):
        state.step(jax.random.key(1), -1.0)
