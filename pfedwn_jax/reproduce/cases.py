"""The paper's target-client cases (Table II: Case 1-3; Table III: the 20-neighbor network).

The paper's Case 1, 2, 3 select 4, 3 and 2 of 10 neighbors at `gamma_th` 5, 10 and 15
(eps 0.05, Table I channel); Table III's target selects 3 of 20 at `gamma_th` 10. The paper
does not give its node positions, so `paper_cases` searches topology seeds, in order, for the
first placement whose centre node selects exactly the paper's counts.

How a case maps onto a run: in single-target mode the target sits at the placement's centre
node (`place_network(topology_seed, n)`), and `ExperimentConfig.target` only says which *data
client* sits there (neighbor k of the placement is the k-th other data client). So the count
of selected neighbors depends on the topology seed and `gamma_th`, never on the target. The
preferred search ("shared") finds one seed whose centre selects 4/3/2 at 5/10/15 at once: the
three cases are then one network, as in the paper, with three different target data clients
(default 0, 1, 2). Only if no seed in `search_seeds` does is each case searched on its own.

Seeds whose links lie within `margin` of `eps` are skipped, so the count is the same in float32,
float64 and the scipy reference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax._checks import check_float, check_int
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.federation import channel_params, single_target_federation
from pfedwn_jax.wireless import error_probability, place_uniform, topology_keys

#: The paper's Table II cases: selected-neighbor counts and their SINR thresholds.
PAPER_WANTED = (4, 3, 2)
PAPER_GAMMAS = (5.0, 10.0, 15.0)


@dataclasses.dataclass(frozen=True)
class Case:
    """One target-client case.

    Attributes:
      name: "Case 1", ... (or e.g. "20-neighbor").
      gamma_th: SINR threshold of the case.
      target: data client at the placement's centre node (the target).
      topology_seed: seed of `place_network`.
      num_neighbors: neighbors around the target (10 or 20 in the paper).
      selected: 1-based ids of the selected neighbors in placement order (the labels of
        `pfedwn neighbors` and Fig. 4).
      selected_clients: data clients of the selected neighbors (the run's slots 1..).
      num_selected: `len(selected)`.
      perr: `[num_neighbors]` P_err of each neighbor to the target (placement order).
      shared: True when all cases of the search share this topology seed.
    """

    name: str
    gamma_th: float
    target: int
    topology_seed: int
    num_neighbors: int
    selected: tuple[int, ...]
    selected_clients: tuple[int, ...]
    num_selected: int
    perr: tuple[float, ...]
    shared: bool = True

    def config(self, base: ExperimentConfig) -> ExperimentConfig:
        """`base` with this case's gamma_th, target, topology_seed and num_neighbors."""
        return dataclasses.replace(
            base,
            gamma_th=self.gamma_th,
            target=self.target,
            topology_seed=self.topology_seed,
            num_neighbors=self.num_neighbors,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly fields."""
        out = dataclasses.asdict(self)
        for k in ("selected", "selected_clients", "perr"):
            out[k] = list(out[k])
        return out


def seed_perr(
    config: ExperimentConfig, seeds: Sequence[int], neighbors: int, gammas: Sequence[float]
) -> np.ndarray:
    """`[G, S, n]` P_err of the centre node's neighbors for every topology seed and gamma_th,
    one vectorised call (the placement is `place_network(seed, n)`'s, vmapped over seeds)."""
    params = channel_params(config)
    place = jax.vmap(lambda k: place_uniform(k, neighbors, params))
    keys = jnp.stack([topology_keys(int(s))[0] for s in seeds])
    centre, others = place(keys)  # [S, 2], [S, n, 2]
    gam = jnp.asarray(np.asarray(gammas, np.float64))[:, None]  # [G, 1]
    perr = error_probability(centre, others, gam, params, moments=config.moments)
    return np.asarray(perr, np.float64)


def _check_args(
    neighbors: int, wanted: Sequence[int], gammas: Sequence[float], margin: float
) -> tuple[int, tuple[int, ...], tuple[float, ...], float]:
    n = check_int("neighbors", neighbors, 1, 10_000)
    wanted = tuple(check_int("wanted", w, 0, n) for w in wanted)
    gammas = tuple(check_float("gammas", g, 0.0, None, low_inclusive=False) for g in gammas)
    if len(wanted) != len(gammas) or not wanted:
        raise ValueError(
            f"wanted and gammas must be non-empty and of equal length (one count per case); "
            f"got wanted={wanted}, gammas={gammas}"
        )
    return n, wanted, gammas, check_float("margin", margin, 0.0, 0.5)


def _matches(perr: np.ndarray, eps: float, wanted: Sequence[int], margin: float) -> np.ndarray:
    """`[G, S]` bool: seed s selects `wanted[g]` at gamma g, no link within `margin` of eps."""
    counts = (perr < eps).sum(-1)
    clear = (np.abs(perr - eps) >= margin).all(-1)
    return (counts == np.asarray(wanted)[:, None]) & clear


def _make_case(
    config: ExperimentConfig, name: str, gamma: float, seed: int, target: int, shared: bool
) -> Case:
    """The case as the run builds it (`single_target_federation`, the runner's own path)."""
    cfg = dataclasses.replace(config, gamma_th=gamma, topology_seed=seed, target=target)
    fed = single_target_federation(cfg)
    ids = np.flatnonzero(fed.selected) + 1
    return Case(
        name=name,
        gamma_th=float(gamma),
        target=int(target),
        topology_seed=int(seed),
        num_neighbors=int(cfg.num_neighbors),
        selected=tuple(int(i) for i in ids),
        selected_clients=tuple(int(c) for c in fed.data_client[1:]),
        num_selected=len(ids),
        perr=tuple(float(p) for p in fed.perr),
        shared=shared,
    )


def paper_cases(
    config: ExperimentConfig,
    neighbors: int = 10,
    wanted: Sequence[int] = PAPER_WANTED,
    gammas: Sequence[float] = PAPER_GAMMAS,
    search_seeds: Iterable[int] = range(64),
    *,
    targets: Sequence[int] | None = None,
    margin: float = 1e-4,
    names: Sequence[str] | None = None,
) -> list[Case]:
    """Cases whose targets select `wanted[i]` neighbors at `gammas[i]` (the paper's 4/3/2).

    Channel, eps and moments come from `config`. Searches `search_seeds` in order: the first
    seed that gives every count at once (one network for all cases), else per case the first
    seed that gives its count. `targets` (default 0, 1, 2, ...): the data client of each case.
    Raises ValueError naming the counts when no seed in `search_seeds` gives a case's count.
    """
    n, wanted, gammas, margin = _check_args(neighbors, wanted, gammas, margin)
    seeds = [check_int("search_seeds", s, 0, 2**32 - 1) for s in search_seeds]
    if not seeds:
        raise ValueError("search_seeds must hold at least one topology seed; got none")
    base = dataclasses.replace(config, num_neighbors=n, target=0)
    targets = tuple(range(len(wanted))) if targets is None else tuple(targets)
    targets = tuple(t % base.num_clients for t in targets)
    names = names or tuple(f"Case {i + 1}" for i in range(len(wanted)))
    if len(targets) != len(wanted) or len(names) != len(wanted):
        raise ValueError(
            f"targets and names need one entry per case ({len(wanted)}); got "
            f"targets={targets}, names={tuple(names)}"
        )
    ok = _matches(seed_perr(base, seeds, n, gammas), base.eps, wanted, margin)  # [G, S]
    both = np.flatnonzero(ok.all(0))
    shared = both.size > 0
    chosen = [
        both[0] if shared else _first(ok[g], seeds, wanted[g], gammas[g])
        for g in range(len(wanted))
    ]
    cases = [
        _make_case(base, names[g], gammas[g], seeds[chosen[g]], targets[g], shared)
        for g in range(len(wanted))
    ]
    for case, w in zip(cases, wanted, strict=True):
        if case.num_selected != w:  # the runner's path disagrees with the batched search
            raise RuntimeError(f"{case.name}: the federation selects {case.num_selected}, not {w}")
    return cases


def _first(ok: np.ndarray, seeds: list[int], want: int, gamma: float) -> int:
    """Index of the first matching seed; ValueError naming the search otherwise."""
    hit = np.flatnonzero(ok)
    if hit.size == 0:
        raise ValueError(
            f"no topology seed in search_seeds ({seeds[0]}..{seeds[-1]}, {len(seeds)} seeds) "
            f"selects exactly {want} neighbors at gamma_th={gamma:g}; search more seeds"
        )
    return int(hit[0])


def network20_case(
    config: ExperimentConfig, search_seeds: Iterable[int] = range(64), **kw: Any
) -> Case:
    """Table III's target: 3 of 20 neighbors selected at gamma_th 10 (`paper_cases` options)."""
    kw.setdefault("names", ("20-neighbor",))
    return paper_cases(config, 20, (3,), (10.0,), search_seeds, **kw)[0]
