"""Node placement in the square area: uniform target + n neighbors, and Poisson point process.

`place_network(seed, n)` is the one placement of a topology seed: `pfedwn neighbors --seed S`
and `run(ExperimentConfig(topology_seed=S))` both use it, so they show the same network.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_finite, check_int, check_range
from pfedwn_jax.wireless._inputs import float_dtype
from pfedwn_jax.wireless.params import ChannelParams


def _check_key(key: Any) -> None:
    if not isinstance(key, jax.Array) or not (
        jnp.issubdtype(key.dtype, jax.dtypes.prng_key) or key.shape[-1:] == (2,)
    ):
        raise ValueError("key must be a jax.random key (jax.random.key / PRNGKey)")


def place_uniform(
    key: Any, num_neighbors: int, params: ChannelParams | None = None
) -> tuple[jax.Array, jax.Array]:
    """Target [2] and `num_neighbors` neighbors [n, 2], i.i.d. uniform in [0, area]^2.

    vmap over keys for batches: `jax.vmap(place_uniform, (0, None))(keys, n)`.
    """
    params = ChannelParams() if params is None else params
    n = check_int("num_neighbors", num_neighbors, 1, None)
    xy = jax.random.uniform(key, (n + 1, 2), float_dtype()) * params.area_m
    return xy[0], xy[1:]


def topology_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """`(placement key, spare key)` of topology seed `seed`: `split(key(seed))`, typed keys
    (their key data equal `split(PRNGKey(seed))`'s, so the draws are those of raw keys).

    The spare key draws whatever else belongs to the topology (the experiment's random target).
    """
    seed = check_int("seed", seed, 0)
    k_place, k_spare = jax.random.split(jax.random.key(seed))
    return k_place, k_spare


def place_network(
    seed: int, num_neighbors: int, params: ChannelParams | None = None
) -> tuple[jax.Array, jax.Array]:
    """The network of topology seed `seed`: target (centre node) [2] and neighbors [n, 2].

    `place_uniform` with the placement key of `topology_keys(seed)`; the same seed gives the
    same network in `pfedwn neighbors` and in `run()` (`ExperimentConfig.topology_seed`).
    """
    return place_uniform(topology_keys(seed)[0], num_neighbors, params)


def sample_ppp(
    key: Any, density: Any, params: ChannelParams | None = None, max_nodes: int = 64
) -> tuple[jax.Array, jax.Array]:
    """Poisson point process of `density` nodes/m^2 in the area, padded to `max_nodes`.

    Returns (xy [max_nodes, 2], valid [max_nodes] bool). The node count is Poisson with mean
    density * area^2, truncated at `max_nodes` (choose max_nodes well above the mean; the
    count is `valid.sum()`). Given the count, nodes are i.i.d. uniform. Jittable / vmappable
    over keys and densities (a traced density is not checked).
    """
    params = ChannelParams() if params is None else params
    check_finite("density", density)
    check_range("density", density, 0.0, None)
    m = check_int("max_nodes", max_nodes, 1, None)
    k_count, k_xy = jax.random.split(key)
    dtype = float_dtype()
    mean = jnp.asarray(density, dtype) * jnp.asarray(params.area_m, dtype) ** 2
    count = jax.random.poisson(k_count, mean)
    xy = jax.random.uniform(k_xy, (m, 2), dtype) * params.area_m
    return xy, jnp.arange(m) < count
