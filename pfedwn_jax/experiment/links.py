"""Which models arrive this round: the link model of an experiment, drawn inside the round.

A federation says who *may* receive whom (the selected neighbors, the context's neighbor
lists `[S, K]`, column 0 the slot itself). With `link_model="ideal"` every such model arrives
every round (no `Links` at all: the compiled round is the one of a run without the option).
Otherwise the context carries `Links`, each listed link's P_err and what a draw needs, and
`sample_received(key, links, neighbors, neighbor_mask)` draws one round's outcome for all
links of all targets at once: `bernoulli` (independent failures with P_err or a fixed
probability, the draws of `wireless.bernoulli_received` keyed per link) or `physical`
(block fading and interference redrawn, `wireless.links.physical_received`). The round then
trains with `neighbor_mask & received`, so every algorithm combines only what arrived (see
docs/robustness.md for what that means per algorithm).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax.algorithms import neighbor_lists
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.federation import Federation, channel_params, network_perr
from pfedwn_jax.wireless import ChannelParams, physical_received

#: Folded into the round key for the link draw, so training keys stay those of `ideal`.
LINK_SALT = 0x11A5


@flax.struct.dataclass
class Links:
    """What a draw of every slot's incoming links needs (the links themselves are the
    context's neighbor lists).

    Attributes:
      perr: `[S, K]` float32 P_err of each listed link (0 for column 0 and padding).
      positions: `[S, 2]` float32 slot positions (m).
      active: `[S]` bool, slots that transmit (every real slot; False on a sweep's padding).
      gamma_th: `[]` float32 SINR threshold.
      failure: `[]` float32 fixed failure probability, or None (each link's P_err).
      params: `ChannelParams` (physical model). Static (the sub-channel count sets shapes).
      model: "bernoulli" or "physical". Static.
    """

    perr: jax.Array
    positions: jax.Array
    active: jax.Array
    gamma_th: jax.Array
    failure: Any
    params: ChannelParams = flax.struct.field(pytree_node=False)
    model: str = flax.struct.field(pytree_node=False, default="bernoulli")


def slot_perr(fed: Federation, config: ExperimentConfig) -> np.ndarray:
    """`[S, S]` P_err of link j -> i between the slots (all network nodes interfering)."""
    if fed.mode == "network":
        return np.asarray(fed.perr)
    full = network_perr(fed.positions, config.gamma_th, channel_params(config), config.moments)
    return full[np.ix_(fed.data_client, fed.data_client)]


def build_links(fed: Federation, config: ExperimentConfig) -> Links | None:
    """The `Links` of a federation (None for `link_model="ideal"`)."""
    if config.link_model == "ideal":
        return None
    if fed.neighbor_lists is not None:  # a large network: its lists and their P_err
        lists, mask, perr = fed.neighbor_lists, fed.neighbor_mask, fed.neighbor_perr.copy()
    else:  # the runner's lists of the adjacency (`algorithms.neighbor_lists`)
        lists, mask = neighbor_lists(np.asarray(fed.adjacency, bool))
        perr = np.take_along_axis(slot_perr(fed, config), lists, 1)
    s = lists.shape[0]
    perr = np.where(mask, perr, 0.0)  # the runner builds the context's lists the same way
    perr[:, 0] = 0.0
    failure = None if config.link_failure is None else jnp.float32(config.link_failure)
    return Links(
        perr=jnp.asarray(perr, jnp.float32),
        positions=jnp.asarray(fed.positions[fed.data_client], jnp.float32),
        active=jnp.ones((s,), bool),
        gamma_th=jnp.float32(config.gamma_th),
        failure=failure,
        params=channel_params(config),
        model=config.link_model,
    )


def sample_received(
    key: jax.Array, links: Links, neighbors: jax.Array, neighbor_mask: jax.Array
) -> jax.Array:
    """`[S, K]` bool: which listed links (`neighbors`, `neighbor_mask` `[S, K]`, the
    context's) deliver this round (column 0, the slot itself, always)."""
    if links.model == "bernoulli":
        p = links.perr if links.failure is None else links.failure
        got = neighbor_mask & (_link_uniforms(key, *neighbors.shape) >= p)
    else:
        s, k = neighbors.shape
        rx = jnp.broadcast_to(jnp.arange(s)[:, None], (s, k)).reshape(-1)
        got = physical_received(
            key,
            links.positions,
            rx,
            neighbors.reshape(-1),
            links.active,
            links.gamma_th,
            links.params,
        ).reshape(s, k)
        got = got & neighbor_mask
    return got.at[:, 0].set(True)


def _link_uniforms(key: jax.Array, s: int, k: int) -> jax.Array:
    """`[S, K]` U[0, 1) draws, link (i, k) from `fold_in(fold_in(key, i), k)`: a link's draw
    does not depend on how many slots or links are stacked with it (a sweep's padding)."""

    def one(i: jax.Array, j: jax.Array) -> jax.Array:
        return jax.random.uniform(jax.random.fold_in(jax.random.fold_in(key, i), j))

    return jax.vmap(lambda i: jax.vmap(lambda j: one(i, j))(jnp.arange(k)))(jnp.arange(s))
