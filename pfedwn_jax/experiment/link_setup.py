"""The link model of a run, built on the host: `build_links(fed, config) -> Links | None`.

`Links` holds what a round's draw of every slot's incoming links needs (each listed link's
P_err, the slot positions, the channel, the fixed failure probability) and, with mobility,
`Motion` (how the nodes move and their lists are re-selected; `SparseMotion` on a network of
candidate lists). `mobile_federation` makes every client a slot of a single-target run that
moves. The traced half, the draw inside the round, is `runner.links`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax.algorithms import neighbor_lists
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.federation import (
    Federation,
    channel_params,
    network_perr,
    shadow_key,
    shadow_matrix,
)
from pfedwn_jax.wireless import ChannelParams, grid
from pfedwn_jax.wireless._inputs import float_dtype
from pfedwn_jax.wireless.fading import Fading, shadowing_db, traced_fading
from pfedwn_jax.wireless.perr import default_num_nodes


class Motion(flax.struct.PyTreeNode):
    """What moving the nodes and re-selecting their neighbors needs (`mobility` set).

    Attributes:
      speed: `[]` m/s. dt: `[]` seconds per round. area: `[]` side of the square (m).
      eps: `[]` selection threshold (inf without channel-aware selection: every node in
        range; an array, so runs with and without selection share a program).
      width: `[]` int32, neighbors a re-selection may list (the run's own list width - 1; a
        sweep pads the lists of several runs to the widest).
      model: "waypoint" or "gaussian". Static.
      reselect_every: rounds between re-selections (0: never). Static.
      single: single-target mode (slot 0 selects, its group is fully connected). Static.
      moments: moment mode of the P_err formula. Static.
      track_perr: recompute the listed links' P_err every round (bernoulli with P_err). Static.
      sparse: `SparseMotion` on a network of candidate lists (`candidates`), else None
        (dense: every slot a candidate and an interferer). Static.
    """

    speed: jax.Array
    dt: jax.Array
    area: jax.Array
    eps: jax.Array
    width: jax.Array
    model: str = flax.struct.field(pytree_node=False)
    reselect_every: int = flax.struct.field(pytree_node=False)
    single: bool = flax.struct.field(pytree_node=False)
    moments: str = flax.struct.field(pytree_node=False)
    track_perr: bool = flax.struct.field(pytree_node=False)
    sparse: Any = flax.struct.field(pytree_node=False, default=None)


@dataclasses.dataclass(frozen=True)
class SparseMotion:
    """Mobility over candidate lists: each round the `candidates` nearest slots are found
    again (`wireless.grid.nearest` on `near`), interfered by the slots within `cutoff`
    metres (`wireless.grid.within` on `far`; None: every slot) plus, with `tail`, the
    mean-field rest; `num_nodes` quadrature nodes per link (the weakest link of the area)."""

    candidates: int
    near: grid.Grid
    far: grid.Grid | None
    cutoff: float | None
    tail: bool
    num_nodes: int


class Shadow(flax.struct.PyTreeNode):
    """The topology's log-normal shadowing, as the round's draws and P_err see it.

    Attributes:
      key: `[2]` uint32 key data of the topology's shadowing key (`federation.shadow_key`).
      ids: `[S]` int32 network node (client index) of each slot: the pair of slots (i, j)
        has the shadowing of nodes (ids[i], ids[j]), the value the selection saw.
      sigma: `[]` float32 standard deviation (dB): runs that differ only in it share a
        program.
    """

    key: jax.Array
    ids: jax.Array
    sigma: jax.Array

    def pairs(self, rows: Any, cols: Any) -> jax.Array:
        """Shadowing (dB) of the slot pairs `(rows, cols)` (broadcast together)."""
        rows, cols = jnp.broadcast_arrays(self.ids[rows], self.ids[cols])
        return shadowing_db(self.key, rows, cols, self.sigma)


class Links(flax.struct.PyTreeNode):
    """What a draw of every slot's incoming links needs (the links themselves are the
    context's neighbor lists).

    Attributes:
      perr: `[S, K]` float32 P_err of each listed link (0 for column 0 and padding).
      positions: `[S, 2]` float32 slot positions (m).
      active: `[S]` bool, slots that transmit (every real slot; False on a sweep's padding).
      gamma_th: `[]` float32 SINR threshold.
      failure: `[]` float32 fixed failure probability, or None (each link's P_err).
      params: `ChannelParams` (physical model). Static (the sub-channel count sets shapes);
        its fading is the kind's default, the run's is `fading`.
      fading: the run's `wireless.fading.Fading` with its parameter and mean power `[]`
        float32 leaves (runs that differ only in them share a program), or None (Rayleigh:
        all in `params`); see `channel`.
      model: "ideal" (only with mobility), "bernoulli" or "physical". Static.
      stale: keep the last received model per link (`LinkTrack.cache`). Static.
      radio: `{"tx_power_w", "bandwidth_hz"}` `[]` float32 leaves of the run's channel (runs
        that differ only in them share a program; `params` holds the defaults), or None.
      cost: `wireless.cost.CostSetup`: count each round's bits, airtime, energy and clock,
        with ARQ retries and a deadline deciding what arrives; or None.
      motion: `Motion` (nodes move, lists re-selected) or None.
      shadow: `Shadow` (log-normal shadowing of the path loss) or None.
      cache: inside a round with `stale`: `[S * K, ...]` the last model received over each
        listed link (row `s * K + k`), else None.
      source: inside a round with `stale`: `[S, K]` int32 index of each listed link's model
        in `concat(params, cache)` (the fresh one if it arrived, else its stale copy).
      reselected: inside a round with `motion`: `[]` bool, the lists changed this round.
      listed: inside a round: `[S, K]` bool, the lists' mask before the draw (the links
        that were to deliver; the context's `neighbor_mask` holds those that did).
    """

    perr: jax.Array
    positions: jax.Array
    active: jax.Array
    gamma_th: jax.Array
    failure: Any
    params: ChannelParams = flax.struct.field(pytree_node=False)
    fading: Any = None
    model: str = flax.struct.field(pytree_node=False, default="bernoulli")
    stale: bool = flax.struct.field(pytree_node=False, default=False)
    radio: Any = None
    cost: Any = None
    motion: Any = None
    shadow: Any = None
    cache: Any = None
    source: Any = None
    reselected: Any = None
    listed: Any = None

    def channel(self) -> ChannelParams:
        """The run's `ChannelParams`: `params` with the (traced) `fading`, `radio` and
        shadowing deviation."""
        params = self.params if self.fading is None else self.params.replace(fading=self.fading)
        if self.shadow is not None:
            params = params.replace(shadowing_db=self.shadow.sigma)
        return params if self.radio is None else params.replace(**self.radio)


def slot_perr(fed: Federation, config: ExperimentConfig) -> np.ndarray:
    """`[S, S]` P_err of link j -> i between the slots (all network nodes interfering)."""
    if fed.mode == "network":
        return np.asarray(fed.perr)
    params, n = channel_params(config), len(fed.positions)
    shadow = shadow_matrix(config, n)
    full = network_perr(fed.positions, config.gamma_th, params, config.moments, shadow=shadow)
    return full[np.ix_(fed.data_client, fed.data_client)]


def build_links(fed: Federation, config: ExperimentConfig) -> Links | None:
    """The `Links` of a federation (None for `link_model="ideal"` without mobility or cost;
    the cost set-up, `Links.cost`, is attached by the caller)."""
    if config.link_model == "ideal" and config.mobility == "none" and not config.cost:
        return None
    if fed.neighbor_lists is not None:  # a large network: its lists and their P_err
        assert fed.neighbor_mask is not None and fed.neighbor_perr is not None  # set together
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
        **_channel_split(config),
        model=config.link_model,
        stale=config.stale,
        motion=_motion(fed, config, lists.shape[1] - 1),
        shadow=_shadow(fed, config),
    )


def _shadow(fed: Federation, config: ExperimentConfig) -> Shadow | None:
    """The `Shadow` of a run's slots (None without shadowing)."""
    if config.shadowing_db == 0:
        return None
    return Shadow(
        key=jax.random.key_data(shadow_key(config)),
        ids=jnp.asarray(fed.data_client, jnp.int32),
        sigma=jnp.float32(config.shadowing_db),
    )


def _channel_split(config: ExperimentConfig) -> dict[str, Any]:
    """`params` (static) and `fading`, `radio` (dynamic) of the `Links` of `config`: Rayleigh,
    which has no shape parameter, stays all static (None); the transmit power and bandwidth
    are leaves (`RADIO`), `params` holds their defaults."""
    params = channel_params(config)
    radio = {k: jnp.float32(getattr(params, k)) for k in RADIO}
    static, fading = params.replace(**_RADIO_DEFAULTS, shadowing_db=0.0), None
    if params.fading.kind != "rayleigh":
        static, fading = (
            static.replace(fading=Fading.of(params.fading.kind)),
            traced_fading(params.fading),
        )
    return {"params": static, "fading": fading, "radio": radio}


#: The channel's numbers a run's program takes as leaves (`Links.radio`): sweeping them
#: (grid keys "channel.tx_power_w", "channel.bandwidth_hz") shares one program.
RADIO = ("tx_power_w", "bandwidth_hz")
_RADIO_DEFAULTS = {k: getattr(ChannelParams(), k) for k in RADIO}


def _motion(fed: Federation, config: ExperimentConfig, width: int) -> Motion | None:
    if config.mobility == "none":
        return None
    return Motion(
        speed=jnp.float32(config.speed),
        dt=jnp.float32(config.round_seconds),
        area=jnp.float32(channel_params(config).area_m),
        eps=jnp.float32(config.eps if config.selection else np.inf),
        width=jnp.int32(width),
        model=config.mobility,
        reselect_every=config.reselect_every,
        single=fed.mode == "single",
        moments=config.moments,
        track_perr=config.link_model == "bernoulli" and config.link_failure is None,
        sparse=_sparse_motion(fed, config),
    )


def _sparse_motion(fed: Federation, config: ExperimentConfig) -> SparseMotion | None:
    """The `SparseMotion` of a network of candidate lists (None otherwise)."""
    if fed.neighbor_lists is None or config.candidates is None:
        return None
    params, n, k = channel_params(config), fed.num_slots, config.candidates
    area, cut = float(params.area_m), config.interference_cutoff
    corners = np.array([[0.0, 0.0], [area, area]])  # the weakest link a move can make
    dtype = jnp.dtype(float_dtype()).name
    return SparseMotion(
        candidates=k,
        near=grid.make_grid(n, area, grid.knn_radius(n, area, k)),
        far=None if cut is None else grid.make_grid(n, area, cut),
        cutoff=cut,
        tail=cut is not None and config.interference_tail == "mean",
        num_nodes=default_num_nodes(corners[:1], corners[1:], config.gamma_th, params, dtype),
    )


def mobile_federation(fed: Federation, config: ExperimentConfig) -> Federation:
    """The federation a run with `mobility` trains: single mode makes every client a slot
    (target, its selected neighbors, then the others, who train locally until selected), so
    a re-selection can bring anyone in; the slots of `fed` keep their indices (and keys)."""
    if config.mobility == "none" or fed.mode != "single":
        return fed
    rest = fed.neighbors[~np.asarray(fed.selected, bool)]
    data_client = np.concatenate([fed.data_client, rest]).astype(np.int64)
    n, s0 = len(data_client), fed.num_slots
    adjacency = np.eye(n, dtype=bool)
    adjacency[:s0, :s0] = True
    return dataclasses.replace(
        fed, data_client=data_client, adjacency=adjacency, is_target=np.arange(n) == 0
    )
