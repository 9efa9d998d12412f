"""Who trains with whom: the federation built from the wireless neighbor selection.

Single-target mode (the paper's setting): the target and `num_neighbors` neighbors are placed
with `place_network(topology_seed, ...)` (the network `pfedwn neighbors --seed` shows); each
neighbor's error probability to the target is computed (the other neighbors interfere) and
those with `P_err < eps` are selected. Slots are the target (slot 0)
and its selected neighbors; the group is fully connected (every baseline trains inside it).

Network-wide mode: the same placement; every client is a target. Row `i` of the
`[N, N]` P_err matrix is client `i`'s error probability from every other client (all the
others interfere); client `i` receives client `j`'s model iff `P_err[i, j] < eps`.

Data clients: the partition has `num_neighbors + 1` clients. In single-target mode the target
is data client `config.target`, and neighbor `k` of the placement is the `k`-th of the other
data clients in increasing order. In network mode node `c` of the placement (node 0 = the
placement's centre node) is data client `c`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
import numpy as np

from pfedwn_jax.algorithms import dense_adjacency
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.wireless import (
    ChannelParams,
    candidate_neighbors,
    error_probability,
    place_network,
    select_neighbors,
    shadowing_db,
    sparse_error_probability,
    topology_keys,
)
from pfedwn_jax.wireless.params import channel_params_from

log = logging.getLogger("pfedwn_jax")


@dataclasses.dataclass(frozen=True)
class Federation:
    """A federation on the host (NumPy), the runner turns it into a `RoundContext`.

    Attributes:
      mode: "single" or "network".
      data_client: `[S]` int, data client of each model slot.
      adjacency: `[S, S]` bool, `adjacency[i, j]`: slot i receives slot j's model.
      is_target: `[S]` bool.
      target: data client of the target (single mode) or -1 (network mode).
      neighbors: `[n]` data clients of the target's neighbors in placement order (single)
        or `[N]` all data clients (network).
      perr: `[n]` P_err of each neighbor to the target (single), or `[N, N]` with
        `perr[i, j]` the error probability of link j -> i (diagonal 0) (network).
      selected: bool, same shape as `perr` (network: diagonal True).
      positions: `[N, 2]` metres, position of each data client.
      neighbor_lists: `[S, K]` int, row s: s itself (column 0), then the slots whose models it
        receives, in increasing order, padded with s; set for large (candidate-list) networks
        and derivable from `adjacency` otherwise.
      neighbor_mask: `[S, K]` bool, the real entries of `neighbor_lists`.
      neighbor_perr: `[S, K]` P_err of each listed link (with `neighbor_lists`).
    """

    mode: str
    data_client: np.ndarray
    adjacency: np.ndarray | None
    is_target: np.ndarray
    target: int
    neighbors: np.ndarray
    perr: np.ndarray
    selected: np.ndarray
    positions: np.ndarray
    neighbor_lists: np.ndarray | None = None
    neighbor_mask: np.ndarray | None = None
    neighbor_perr: np.ndarray | None = None

    @property
    def num_slots(self) -> int:
        return int(self.data_client.shape[0])

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly description (the `network` entry of the results file); a large
        network (no dense `adjacency`) stores its neighbor lists and `perr [S, K]`."""
        if self.adjacency is None:
            assert self.neighbor_lists is not None and self.neighbor_mask is not None
            return {
                "mode": self.mode,
                "num_slots": self.num_slots,
                "neighbor_lists": self.neighbor_lists.tolist(),
                "neighbor_mask": self.neighbor_mask.tolist(),
                "perr": self.perr.tolist(),
                "positions": self.positions.tolist(),
            }
        out = {
            "mode": self.mode,
            "num_slots": self.num_slots,
            "slot_client": self.data_client.tolist(),
            "is_target": self.is_target.tolist(),
            "adjacency": self.adjacency.tolist(),
            "target": self.target,
            "neighbors": self.neighbors.tolist(),
            "perr": self.perr.tolist(),
            "selected": self.selected.tolist(),
            "positions": self.positions.tolist(),
        }
        if self.mode == "single":
            out["selected_neighbors"] = self.neighbors[self.selected].tolist()
        return out


def channel_params(config: ExperimentConfig) -> ChannelParams:
    """`ChannelParams` with the config's overrides (unknown fields name `channel`), its fading
    model and shadowing deviation; with `node_density`, the area's side is
    `sqrt(clients / density)`."""
    overrides = dict(config.channel)
    if config.node_density is not None:
        overrides["area_m"] = float(np.sqrt(config.num_clients / config.node_density))
    return channel_params_from(overrides, config.fading, config.fading_param, config.shadowing_db)


def place_nodes(config: ExperimentConfig) -> tuple[np.ndarray, np.ndarray, jax.Array]:
    """Placement from the topology seed: `(centre_xy [2], others_xy [n, 2], spare key)`."""
    seed = config.topology_seed
    centre, others = place_network(seed, config.num_neighbors, channel_params(config))
    spare = topology_keys(seed)[1]
    return np.asarray(centre, np.float64), np.asarray(others, np.float64), spare


#: Folded into the topology's spare key for the shadowing draws.
SHADOW_SALT = 0x5AD0


def shadow_key(config: ExperimentConfig) -> jax.Array:
    """The key of the topology's shadowing draws (`wireless.shadowing_db`), from its seed."""
    return jax.random.fold_in(topology_keys(config.topology_seed)[1], SHADOW_SALT)


def shadow_matrix(config: ExperimentConfig, n: int) -> np.ndarray | None:
    """`[n, n]` shadowing (dB) of link j <-> i between the network's nodes (client indices),
    drawn from the topology seed (`wireless.shadowing_db`; symmetric); None without it."""
    if config.shadowing_db == 0:
        return None
    key = shadow_key(config)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return np.asarray(shadowing_db(key, i, j, config.shadowing_db), np.float64)


def _select(config: ExperimentConfig, perr: np.ndarray, valid: Any = None) -> np.ndarray:
    """Channel-aware selection `P_err < eps` (among `valid`), or, with `selection=False`,
    every neighbor in range (the channel-unaware variant)."""
    if not config.selection:
        return np.ones(perr.shape, bool) if valid is None else np.asarray(valid, bool)
    return np.asarray(select_neighbors(perr, config.eps, valid=valid), bool)


def resolve_target(config: ExperimentConfig, key: jax.Array) -> int:
    """The target's data client: `config.target`, or drawn uniformly if "random"."""
    if config.target == "random":
        return int(jax.random.randint(key, (), 0, config.num_clients))
    return int(config.target)


def single_target_federation(config: ExperimentConfig) -> Federation:
    """The target plus its selected neighbors, fully connected (see module docstring)."""
    params = channel_params(config)
    centre, others_xy, key = place_nodes(config)
    target = resolve_target(config, key)
    others = np.array([c for c in range(config.num_clients) if c != target], dtype=np.int64)
    shadow = shadow_matrix(config, config.num_clients)
    perr = np.asarray(
        error_probability(
            centre,
            others_xy,
            config.gamma_th,
            params,
            moments=config.moments,
            shadow_db=None if shadow is None else shadow[target, others],
        ),
        np.float64,
    )
    selected = _select(config, perr)
    data_client = np.concatenate([[target], others[selected]]).astype(np.int64)
    slots = len(data_client)
    positions = np.zeros((config.num_clients, 2))
    positions[target] = centre
    positions[others] = others_xy
    return Federation(
        mode="single",
        data_client=data_client,
        adjacency=np.ones((slots, slots), bool),
        is_target=np.arange(slots) == 0,
        target=target,
        neighbors=others,
        perr=perr,
        selected=selected,
        positions=positions,
    )


def network_perr(
    positions: np.ndarray,
    gamma_th: float,
    params: ChannelParams,
    moments: str,
    max_elements: int = 1 << 24,
    shadow: np.ndarray | None = None,
) -> np.ndarray:
    """`[N, N]` error probabilities, `perr[i, j]` for link j -> i with all others interfering
    (`shadow`: `[N, N]` shadowing in dB of each pair, `shadow_matrix`, or None).

    Diagonal is 0. Batched `error_probability` calls over chunks of targets; a target's
    interference terms take `[N-1, N-1]` floats, so chunks keep about `max_elements` in memory.
    """
    n = positions.shape[0]
    # others[i] = every node but i, in increasing order: [N, N-1]
    others = np.array([[j for j in range(n) if j != i] for i in range(n)], dtype=np.int64)
    chunk = max(1, min(n, max_elements // max(1, (n - 1) ** 2)))
    out = np.zeros((n, n))
    for lo in range(0, n, chunk):
        rows = np.arange(lo, min(n, lo + chunk))
        p = error_probability(
            positions[rows],
            positions[others[rows]],
            gamma_th,
            params,
            moments=moments,
            shadow_db=None if shadow is None else shadow[rows[:, None], others[rows]],
        )
        out[rows[:, None], others[rows]] = np.asarray(p, np.float64)
    return out


def network_federation(config: ExperimentConfig) -> Federation:
    """Every client a target with its own selected neighbors (see module docstring)."""
    params = channel_params(config)
    centre, others_xy, _ = place_nodes(config)
    positions = np.concatenate([centre[None], others_xy], axis=0)
    n = positions.shape[0]
    shadow = shadow_matrix(config, n)
    perr = network_perr(positions, config.gamma_th, params, config.moments, shadow=shadow)
    offdiag = ~np.eye(n, dtype=bool)
    selected = _select(config, perr) & offdiag
    adjacency = selected | ~offdiag
    return Federation(
        mode="network",
        data_client=np.arange(n, dtype=np.int64),
        adjacency=adjacency,
        is_target=np.ones(n, bool),
        target=-1,
        neighbors=np.arange(n, dtype=np.int64),
        perr=perr,
        selected=adjacency,
        positions=positions,
    )


#: Largest network that also gets the dense `[S, S]` adjacency (tests, small studies).
DENSE_VIEW_MAX = 2_000


def sparse_network_federation(config: ExperimentConfig) -> Federation:
    """Network mode over candidate lists: each node's `candidates` nearest nodes, P_err only
    for those links (interference within `interference_cutoff`), selection `P_err < eps`.

    Nothing is `[N, N]` (but the dense adjacency view of a network of at most
    `DENSE_VIEW_MAX` nodes). Memory and time O(N K I).
    """
    params = channel_params(config)
    centre, others_xy, _ = place_nodes(config)
    positions = np.concatenate([centre[None], others_xy], axis=0)
    idx, cmask = candidate_neighbors(positions, k=config.candidates)
    cut = config.interference_cutoff
    perr = np.asarray(
        sparse_error_probability(
            positions,
            idx,
            cmask,
            config.gamma_th,
            params,
            moments=config.moments,
            interference="all" if cut is None else "radius",
            cutoff=cut,
            tail="none" if cut is None else config.interference_tail,
            shadow_key=None if config.shadowing_db == 0 else shadow_key(config),
        ),
        np.float64,
    )
    selected = _select(config, perr, np.asarray(cmask))
    lists, mask, list_perr = _lists_from_selection(np.asarray(idx), selected, perr)
    n = positions.shape[0]
    return Federation(
        mode="network",
        data_client=np.arange(n, dtype=np.int64),
        adjacency=np.asarray(dense_adjacency(lists, mask, n)) if n <= DENSE_VIEW_MAX else None,
        is_target=np.ones(n, bool),
        target=-1,
        neighbors=np.arange(n, dtype=np.int64),
        perr=perr,
        selected=selected,
        positions=positions,
        neighbor_lists=lists,
        neighbor_mask=mask,
        neighbor_perr=list_perr,
    )


def _lists_from_selection(
    idx: np.ndarray, selected: np.ndarray, perr: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`[N, K']` lists (the node itself, then its selected candidates in increasing order),
    their mask and each listed link's P_err (0 for the node itself)."""
    n = idx.shape[0]
    k = int(selected.sum(1).max(initial=0)) + 1
    key = np.where(selected, idx.astype(np.int64), np.iinfo(np.int64).max)
    order = np.argsort(key, axis=1, kind="stable")[:, : k - 1]
    chosen = np.take_along_axis(key, order, 1)
    mask = np.concatenate([np.ones((n, 1), bool), chosen != np.iinfo(np.int64).max], axis=1)
    own = np.arange(n)[:, None]
    lists = np.concatenate([own, np.where(mask[:, 1:], chosen, own)], axis=1)
    link_perr = np.concatenate([np.zeros((n, 1)), np.take_along_axis(perr, order, 1)], axis=1)
    return lists.astype(np.int64), mask, np.where(mask, link_perr, 0.0)


def build_federation(config: ExperimentConfig) -> Federation:
    """The federation for `config.mode` (network mode with `candidates`: candidate lists).

    A federation in which no client receives any model is built, with a warning: every
    method then trains each client alone, so the methods compare identical local training.
    """
    if config.mode == "network" and config.candidates is not None:
        fed = sparse_network_federation(config)
    elif config.mode == "network":
        fed = network_federation(config)
    else:
        fed = single_target_federation(config)
    if selected_links(fed) == 0:
        log.warning(
            "no neighbor is selected (P_err < eps=%g; the smallest P_err is %.4g): every "
            "method trains each client alone, as Local; raise eps, lower gamma_th or place "
            "the nodes closer%s",
            config.eps,
            _smallest_perr(fed),
            "" if config.mobility == "none" else " (re-selection may add neighbors later)",
        )
    return fed


def selected_links(fed: Federation) -> int:
    """The links along which some client receives a model (self links not counted)."""
    if fed.mode == "single":
        return int(np.sum(fed.selected))
    if fed.neighbor_mask is not None:
        return int(np.sum(fed.neighbor_mask[:, 1:]))
    assert fed.adjacency is not None  # a federation holds lists or an adjacency
    return int(np.sum(fed.adjacency) - np.trace(fed.adjacency))


def _smallest_perr(fed: Federation) -> float:
    """The smallest P_err of a real (non-self) link."""
    perr = np.asarray(fed.perr, np.float64)
    if fed.mode == "network" and fed.neighbor_lists is None:
        perr = perr[~np.eye(perr.shape[0], dtype=bool)]
    return float(perr.min(initial=1.0))
