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

Which data clients (`criterion`). The paper's cases are targets whose selected neighbors differ
in data: its Case 1 target has a neighbor with a "similar" label distribution (neighbor 5) and
one that is "totally different" (neighbor 10, none of the target's labels). The selection counts
alone do not give that (on full MNIST the first network's Case 3 target shares 0% and 4% of
its label mass with its two selected neighbors), so `criterion="similarity"` also chooses the
targets:

- similarity of two clients' label distributions `p`, `q` (over the partition's samples, train,
  validation and test together): their overlap `sum_y min(p(y), q(y)) = 1 - TV(p, q)`, the
  share of label mass they have in common (1: the same distribution, 0: no class in common);
  `label_overlap`;
- a case qualifies when its target's selected neighbors include one with overlap
  `>= SIMILAR` (0.4) and one with overlap `<= DIFFERENT` (0.1) (`meets_criterion`), and the
  target holds at least `MIN_TARGET_SAMPLES` (100) samples: a target's accuracy is measured
  on its own test split (25% of its samples), and below 100 samples one test sample is more
  than 4 points (full MNIST's client 6, 20 samples, 5 test samples, would otherwise be a
  Case 2 target whose accuracy moves in steps of 20 points);
- the search takes the topology seeds in order, as above: the first seed whose centre selects
  the wanted counts and on which every case has a qualifying target (the cases' targets
  distinct, the first such in data-client order); only if no seed has them all is each case
  searched on its own;
- `case_rows` lists, per case, the criterion, the target and its size, its neighbors and
  their overlaps (for a report).

The thresholds are arguments (`similar`, `different`, `min_target_samples`): the paper
partition of a dataset with many classes among few clients may hold no pair that similar (the
quick preset's CIFAR-100 subset over 11 clients: every overlap at most 0.21), where the search
says so instead of relaxing them.
`criterion="counts"` (the default) keeps the cases chosen by the counts only (targets 0, 1,
2), for comparison.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax import api
from pfedwn_jax._checks import check_choice, check_float, check_int
from pfedwn_jax.data.federate import client_label_counts
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.federation import channel_params, single_target_federation
from pfedwn_jax.experiment.setup import load_data, setup
from pfedwn_jax.results.sweep import SweepResult
from pfedwn_jax.wireless import error_probability, place_uniform, topology_keys

#: The paper's Table II cases: selected-neighbor counts and their SINR thresholds.
PAPER_WANTED = (4, 3, 2)
PAPER_GAMMAS = (5.0, 10.0, 15.0)
#: How `paper_cases` chooses the cases: by the selection counts only, or also by the
#: neighbors' label similarity (see the module docstring).
CRITERIA = ("counts", "similarity")
#: `criterion="similarity"`: a neighbor with at least this overlap with the target ...
SIMILAR = 0.4
#: ... and one with at most this overlap; its target holds at least this many samples.
DIFFERENT = 0.1
MIN_TARGET_SAMPLES = 100


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
      similarity: label overlap (`label_overlap`) of each selected neighbor with the target,
        in `selected_clients` order; empty when the search had no label counts.
      criterion: how the target was chosen (`CRITERIA`).
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
    similarity: tuple[float, ...] = ()
    criterion: str = "counts"

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
        for k in ("selected", "selected_clients", "perr", "similarity"):
            out[k] = list(out[k])
        return out


def label_overlap(counts: Any) -> np.ndarray:
    """`[N, N]` overlap `sum_y min(p_a(y), p_b(y))` (= 1 - total variation) of the clients'
    label distributions, from class counts `counts [N, C]`; a client without samples has
    overlap 0 with every client."""
    c = np.asarray(counts, np.float64)
    if c.ndim != 2 or not np.isfinite(c).all() or (c < 0).any():
        raise ValueError(f"counts must be [clients, classes] counts >= 0; got shape {c.shape}")
    total = c.sum(1, keepdims=True)
    p = np.divide(c, total, out=np.zeros_like(c), where=total > 0)
    return np.minimum(p[:, None, :], p[None, :, :]).sum(-1)


def meets_criterion(
    overlaps: Sequence[float], similar: float = SIMILAR, different: float = DIFFERENT
) -> bool:
    """Whether a target's selected neighbors, with label overlaps `overlaps [M]` with the
    target, include one with overlap `>= similar` and one with overlap `<= different`."""
    o = np.asarray(overlaps, np.float64)
    return bool(o.size >= 2 and o.max() >= similar and o.min() <= different)


def config_label_counts(config: ExperimentConfig) -> np.ndarray:
    """`[N, C]` class counts of each data client of `config`'s partition (train, validation
    and test together), the data exactly as a run of `config` loads it."""

    return client_label_counts(load_data(config)[0], "all")


def case_rows(
    cases: Sequence[Case],
    label_counts: Any,
    similar: float = SIMILAR,
    different: float = DIFFERENT,
) -> list[dict[str, Any]]:
    """Per case a row for a report: `case`, `criterion`, `topology_seed`, `target`,
    `target_samples` (all splits), `neighbors` (their data clients), `similarity` (each
    neighbor's label overlap with the target), `role` ("similar", "different" or "" per
    neighbor, by the thresholds) and `meets` (`meets_criterion`, overlaps only)."""
    overlap = label_overlap(label_counts)
    sizes = np.asarray(label_counts).sum(1)
    rows = []
    for case in cases:
        sim = [float(overlap[case.target, c]) for c in case.selected_clients]
        role = ["similar" if v >= similar else "different" if v <= different else "" for v in sim]
        rows.append(
            {
                "case": case.name,
                "criterion": case.criterion,
                "topology_seed": case.topology_seed,
                "target": case.target,
                "target_samples": int(sizes[case.target]),
                "neighbors": list(case.selected_clients),
                "similarity": sim,
                "role": role,
                "meets": meets_criterion(sim, similar, different),
            }
        )
    return rows


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
    config: ExperimentConfig,
    name: str,
    gamma: float,
    seed: int,
    target: int,
    shared: bool,
    overlap: np.ndarray | None = None,
    criterion: str = "counts",
) -> Case:
    """The case as the run builds it (`single_target_federation`, the runner's own path)."""
    cfg = dataclasses.replace(config, gamma_th=gamma, topology_seed=seed, target=target)
    fed = single_target_federation(cfg)
    ids = np.flatnonzero(fed.selected) + 1
    nbrs = fed.data_client[1:]
    sim = () if overlap is None else tuple(float(overlap[target, c]) for c in nbrs)
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
        similarity=sim,
        criterion=criterion,
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
    criterion: str = "counts",
    label_counts: Any = None,
    similar: float = SIMILAR,
    different: float = DIFFERENT,
    min_target_samples: int = MIN_TARGET_SAMPLES,
) -> list[Case]:
    """Cases whose targets select `wanted[i]` neighbors at `gammas[i]` (the paper's 4/3/2).

    Channel, eps and moments come from `config`. Searches `search_seeds` in order: the first
    seed that gives every count at once (one network for all cases), else per case the first
    seed that gives its count. With `criterion="counts"` the targets are `targets` (default
    0, 1, 2, ...: the data client of each case); with `"similarity"` the search also picks
    the targets, distinct, such that every case `meets_criterion(similar, different)` and
    holds at least `min_target_samples` samples (see the module docstring; `targets` must
    be None). `label_counts [N, C]`: the clients' class
    counts (default: `config_label_counts(config)`, loaded only for `"similarity"`); given,
    they also fill `Case.similarity` of `"counts"` cases.
    Raises ValueError naming the counts (and thresholds) when no seed gives a case.
    """
    n, wanted, gammas, margin = _check_args(neighbors, wanted, gammas, margin)
    criterion = check_choice("criterion", criterion, CRITERIA)
    seeds = [check_int("search_seeds", s, 0, 2**32 - 1) for s in search_seeds]
    if not seeds:
        raise ValueError("search_seeds must hold at least one topology seed; got none")
    base = dataclasses.replace(config, num_neighbors=n, target=0)
    names = names or tuple(f"Case {i + 1}" for i in range(len(wanted)))
    perr = seed_perr(base, seeds, n, gammas)  # [G, S, n]
    ok = _matches(perr, base.eps, wanted, margin)  # [G, S]
    min_target_samples = check_int("min_target_samples", min_target_samples, 0, None)
    counts = _counts(base, label_counts, criterion)
    overlap = None if counts is None else label_overlap(counts)
    if criterion == "counts":
        chosen, targets, shared = _by_counts(ok, seeds, wanted, gammas, targets, base.num_clients)
    elif targets is not None:
        raise ValueError("criterion='similarity' chooses the targets; pass targets=None")
    else:
        assert counts is not None and overlap is not None  # criterion="similarity" counts
        big = counts.sum(1) >= min_target_samples
        found = _by_similarity(perr < base.eps, ok, overlap, big, (similar, different))
        limits = (similar, different, min_target_samples)
        chosen, targets, shared = _or_raise(found, seeds, wanted, gammas, limits)
    if len(names) != len(wanted):
        raise ValueError(f"names need one entry per case ({len(wanted)}); got {tuple(names)}")
    cases = [
        _make_case(
            base, names[g], gammas[g], seeds[chosen[g]], targets[g], shared, overlap, criterion
        )
        for g in range(len(wanted))
    ]
    for case, w in zip(cases, wanted, strict=True):
        if case.num_selected != w:  # the runner's path disagrees with the batched search
            raise RuntimeError(f"{case.name}: the federation selects {case.num_selected}, not {w}")
        if criterion == "similarity" and not meets_criterion(case.similarity, similar, different):
            raise RuntimeError(f"{case.name}: the federation's neighbors miss the criterion")
    return cases


def _counts(config: ExperimentConfig, label_counts: Any, criterion: str) -> np.ndarray | None:
    """`[N, C]` class counts: the given ones, or the config's data for `"similarity"`."""
    if label_counts is None and criterion == "counts":
        return None
    counts = config_label_counts(config) if label_counts is None else np.asarray(label_counts)
    if counts.ndim != 2 or counts.shape[0] != config.num_clients:
        raise ValueError(
            f"label_counts must be [clients, classes] with {config.num_clients} clients "
            f"({config.num_neighbors} neighbors + the target); got shape {counts.shape}"
        )
    return counts


def _by_counts(
    ok: np.ndarray,
    seeds: list[int],
    wanted: tuple[int, ...],
    gammas: tuple[float, ...],
    targets: Sequence[int] | None,
    num_clients: int,
) -> tuple[list[int], tuple[int, ...], bool]:
    """`(seed index per case, targets, shared)` of the counts-only search."""
    targets = tuple(range(len(wanted))) if targets is None else tuple(targets)
    if len(targets) != len(wanted):
        raise ValueError(f"targets need one entry per case ({len(wanted)}); got targets={targets}")
    both = np.flatnonzero(ok.all(0))
    shared = both.size > 0
    chosen = [
        int(both[0]) if shared else _first(ok[g], seeds, wanted[g], gammas[g])
        for g in range(len(wanted))
    ]
    return chosen, tuple(t % num_clients for t in targets), shared


def _by_similarity(
    sel: np.ndarray,
    ok: np.ndarray,
    overlap: np.ndarray,
    big: np.ndarray,
    thresholds: tuple[float, float],
) -> tuple[list[int | None], list[int | None], bool]:
    """`(seed index per case, targets, shared)` of the similarity search; None where a case
    has no seed. `sel [G, S, n]`: placement neighbor k selected at gamma g on seed s; `big
    [N]`: the data clients large enough to be a target."""
    clients = overlap.shape[0]
    others = [np.array([c for c in range(clients) if c != t]) for t in range(clients)]

    def fits(g: int, s: int) -> list[int]:
        return [
            t
            for t in range(clients)
            if big[t] and meets_criterion(overlap[t, others[t][sel[g, s]]], *thresholds)
        ]

    for s in np.flatnonzero(ok.all(0)):  # one network: distinct targets, first in order
        for pick in itertools.product(*(fits(g, int(s)) for g in range(ok.shape[0]))):
            if len(set(pick)) == len(pick):
                return [int(s)] * len(pick), list(pick), True
    chosen: list[int | None] = []
    picked: list[int | None] = []
    for g in range(ok.shape[0]):  # per case: first seed with a target not taken yet
        hits = ((int(s), t) for s in np.flatnonzero(ok[g]) for t in fits(g, int(s)))
        seed, target = next(((s, t) for s, t in hits if t not in picked), (None, None))
        chosen.append(seed)
        picked.append(target)
    return chosen, picked, False


def _or_raise(
    found: tuple[list[int | None], list[int | None], bool],
    seeds: list[int],
    wanted: tuple[int, ...],
    gammas: tuple[float, ...],
    limits: tuple[float, float, int],
) -> tuple[list[int], tuple[int, ...], bool]:
    """`found` when every case has a seed; else a ValueError naming the first case without."""
    chosen, targets, shared = found
    for g, s in enumerate(chosen):
        if s is None:
            raise ValueError(
                f"no topology seed in search_seeds ({seeds[0]}..{seeds[-1]}, {len(seeds)} "
                f"seeds) selects exactly {wanted[g]} neighbors at gamma_th={gammas[g]:g} "
                f"for a target (not already taken, at least {limits[2]} samples) whose "
                f"neighbors include one with label overlap >= {limits[0]:g} and one <= "
                f"{limits[1]:g}; search more seeds or change the thresholds"
            )
    # no None left: refused above, and a case with a seed has its target (picked together)
    found_seeds = [int(s) for s in chosen if s is not None]
    return found_seeds, tuple(int(t) for t in targets if t is not None), shared


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


def target_test_samples(config: ExperimentConfig) -> int:
    """The test samples of a run's target (slot 0's data client): the test-set term of its
    paired intervals (`results.paired.paired_t`)."""
    exp = setup(config)
    return int(np.asarray(exp.test.count)[int(np.asarray(exp.ctx.data_client)[0])])


def case_sweep(folder: Path, configs: Sequence[ExperimentConfig], labels: Sequence[dict],
               records: Sequence[str]) -> SweepResult:  # fmt: skip
    """A study's sweep of ``configs`` (named by ``labels``, keeping ``records``), saved under
    ``folder``; reloaded from there instead when a previous call saved it."""
    if (folder / "sweep.json").exists():
        return SweepResult.load(folder)
    res = api.sweep(list(configs), labels=list(labels), progress=True, records=tuple(records))
    res.save(folder)
    return res


def study_footer(module: str, argv: Sequence[str] | None, res: SweepResult, t0: float) -> dict:
    """How a study's summary was made: its command, the sweep's wall seconds (set-up,
    compile, run) and this call's (``t0``: its `time.perf_counter` at the start)."""
    shown = sys.argv[1:] if argv is None else list(argv)
    return {
        "command": f"python -m pfedwn_jax.reproduce.{module} " + " ".join(shown),
        "sweep_wall_s": round(sum(res.meta.get("timings", {}).values()), 1),
        "this_call_s": round(time.perf_counter() - t0, 1),
    }
