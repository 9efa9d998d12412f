"""Node mobility between rounds inside the square deployment area [0, area]^2.

Two models as `flax.struct.dataclass` states (pytrees: jittable, vmappable over runs):

* `RandomWaypoint`: each node walks in a straight line at `speed` towards its waypoint; on
  arrival it draws a new waypoint uniformly in the area and spends the rest of the step
  walking towards it (no pause). Segments between points of the square stay inside it, so
  no boundary rule is needed (positions are clipped only against float rounding).
* `GaussianWalk`: i.i.d. Gaussian steps with RMS speed `speed`: per-axis standard
  deviation speed dt / sqrt(2), so E|step|^2 = (speed dt)^2 and E|step| = speed dt
  sqrt(pi) / 2. Positions are reflected at the walls (which keeps the uniform distribution
  stationary).

Both: `State.init(key, positions [N, 2], area, speed) -> state`,
`State.step(state, key, dt) -> state` (dt in seconds), `state.positions [N, 2]`.
`speed` (m/s) is a scalar or per node [N]; `area` the side of the square (m).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from pfedwn_jax._checks import check_finite, check_range, check_shape, is_concrete
from pfedwn_jax.wireless._inputs import float_dtype


def _check_common(positions: Any, area: Any, speed: Any) -> tuple[Any, Any, Any]:
    """Validated (positions [N, 2], area, speed) as float arrays; checks skip tracers."""
    check_shape("positions", positions, (None, 2), "[N, 2]")
    for name, x in (("positions", positions), ("area", area), ("speed", speed)):
        check_finite(name, x)
    check_range("area", area, 0.0, None, low_inclusive=False)
    check_range("speed", speed, 0.0, None)
    n = np.shape(positions)[0]
    if np.shape(speed) not in ((), (n,)):
        raise ValueError(
            f"speed must be a scalar or have shape [N] = ({n},); got {np.shape(speed)}"
        )
    if is_concrete(positions) and is_concrete(area):
        xy = np.asarray(positions, float)
        if np.any(xy < 0) or np.any(xy > float(np.max(area))):
            raise ValueError(f"positions must lie in [0, area]^2 with area = {area}")
    dtype = float_dtype()
    return jnp.asarray(positions, dtype), jnp.asarray(area, dtype), jnp.asarray(speed, dtype)


def _check_dt(dt: Any) -> None:
    check_finite("dt", dt)
    check_range("dt", dt, 0.0, None)


def _per_node(speed: Any) -> Any:
    """speed [N, 1] or [1, 1] for broadcasting against positions [N, 2]."""
    return jnp.reshape(speed, (-1, 1))


def reflect(x: Any, area: Any) -> Any:
    """x folded into [0, area] by reflection at both walls (any distance outside)."""
    y = jnp.mod(x, 2.0 * area)
    return jnp.where(y > area, 2.0 * area - y, y)


class GaussianWalk(struct.PyTreeNode):
    """Gaussian random walk, reflected at the walls: positions [N, 2], area, speed."""

    positions: Any
    area: Any
    speed: Any

    @classmethod
    def init(cls, key: Any, positions: Any, area: Any, speed: Any) -> GaussianWalk:
        """Start at `positions` ([N, 2] in [0, area]^2); `key` is unused (same signature)."""
        del key
        return cls(*_check_common(positions, area, speed))

    def step(self, key: Any, dt: Any) -> GaussianWalk:
        """Move every node by N(0, (speed dt)^2 / 2 I_2), reflected into the area."""
        _check_dt(dt)
        sd = _per_node(self.speed) * dt / jnp.sqrt(2.0)
        z = jax.random.normal(key, self.positions.shape, self.positions.dtype)
        return self.replace(positions=reflect(self.positions + sd * z, self.area))


def _advance(pos: Any, goal: Any, travel: Any) -> tuple[Any, Any, Any]:
    """Walk up to `travel` [N, 1] from pos [N, 2] towards goal [N, 2].

    Returns (new pos [N, 2], leftover travel [N, 1], reached [N, 1]).
    """
    vec = goal - pos
    dist = jnp.sqrt(jnp.sum(vec * vec, axis=-1, keepdims=True))
    reached = dist <= travel
    frac = travel / jnp.where(reached, 1.0, dist)
    new = jnp.where(reached, goal, pos + frac * vec)
    return new, jnp.where(reached, travel - dist, 0.0), reached


class RandomWaypoint(struct.PyTreeNode):
    """Random waypoint without pauses: positions, waypoints [N, 2], area, speed."""

    positions: Any
    waypoints: Any
    area: Any
    speed: Any

    @classmethod
    def init(cls, key: Any, positions: Any, area: Any, speed: Any) -> RandomWaypoint:
        """Start at `positions` ([N, 2] in [0, area]^2) with uniform first waypoints."""
        xy, area, speed = _check_common(positions, area, speed)
        goal = jax.random.uniform(key, xy.shape, xy.dtype) * area
        return cls(xy, goal, area, speed)

    def step(self, key: Any, dt: Any) -> RandomWaypoint:
        """Walk speed dt along the waypoint path (a new waypoint on each arrival)."""
        _check_dt(dt)
        travel = _per_node(self.speed) * dt
        pos, left, arrived = _advance(self.positions, self.waypoints, travel)
        fresh = jax.random.uniform(key, pos.shape, pos.dtype) * self.area
        goal = jnp.where(arrived, fresh, self.waypoints)
        pos, _, _ = _advance(pos, goal, left)  # a second arrival in one step waits for the next
        return self.replace(positions=jnp.clip(pos, 0.0, self.area), waypoints=goal)
