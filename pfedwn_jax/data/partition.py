"""Non-IID partitions of a labelled pool into clients (paper Sec. V-A and common PFL schemes).

`partition(labels, num_clients, scheme, seed=...)` returns one index array per client; every
index lands in exactly one client (an exact cover), and the result is a pure function of the
arguments (NumPy `default_rng(seed)`). Unbalanced client sizes are expected, not an error.

Schemes:
- `"paper"`: client n draws a number of classes `c_n ~ U{1..C}` (`U{1..max_classes}` when
  `max_classes` is set) and a random set of `c_n` classes; a class nobody drew is given to one
  uniformly random client (so every sample has a holder; that client then holds one more
  class than it drew). Each class is split among its
  holders by Dirichlet(alpha) proportions.
- `"dirichlet"`: every class is split among all clients by Dirichlet(alpha) proportions
  (Hsu et al. 2019; Lin et al. 2020), the paper's reference [lin2020ensemble].
- `"pathological"`: each client holds exactly `classes_per_client` classes (assigned in
  wrapped blocks of a random class order so every class has a holder); a class is split
  evenly among its holders (McMahan et al. 2017 style).
- `"iid"`: a uniform random split into near-equal parts.
- `"natural"` (`partition_natural`, not `partition`): a naturally federated dataset such as
  FEMNIST, one client per writer, from writer ids rather than labels.

Minimum size (`"paper"`, `"dirichlet"`): before the Dirichlet split each client receives
`min_samples` samples drawn uniformly from the still-unassigned samples of the classes it
holds (in the rare case those are exhausted, it takes on further random classes until they
suffice); the rest follows the Dirichlet proportions. This guarantees the minimum in one pass
(rejection sampling, the other common choice, almost never succeeds with small alpha and
tens of clients). `"iid"` and `"pathological"` are near-balanced by construction and only
check it. Too few samples for the clients or the minimum is a `ValueError` that names the
numbers and what would fit (`check_enough_samples`).
"""

from __future__ import annotations

import numpy as np

from pfedwn_jax._checks import check_choice, check_finite, check_int, check_range

SCHEMES = ("paper", "dirichlet", "pathological", "iid")  # label-based: `partition`
NATURAL = "natural"  # one client per writer: `partition_natural`, needs writer ids
ALL_SCHEMES = (*SCHEMES, NATURAL)  # what `make_federated` accepts
DEFAULT_MIN_SAMPLES = 20


def _check_labels(labels: np.ndarray, num_classes: int | None) -> tuple[np.ndarray, int]:
    labels = np.asarray(labels)
    if labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
        raise ValueError(f"labels must be a 1-D integer array; got {labels.dtype} {labels.shape}")
    if labels.size and labels.min() < 0:
        raise ValueError(f"labels must be >= 0; got {labels.min()}")
    inferred = int(labels.max(initial=-1)) + 1
    if num_classes is None:
        num_classes = inferred
    num_classes = check_int("num_classes", num_classes, low=max(1, inferred))
    return labels.astype(np.int64), num_classes


def _split_by_counts(rng: np.random.Generator, idx: np.ndarray, counts: np.ndarray) -> list:
    """Shuffle `idx` and cut it into consecutive pieces of the given sizes."""
    idx = rng.permutation(idx)
    return np.split(idx, np.cumsum(counts)[:-1])


def _holders_paper(
    rng: np.random.Generator, num_clients: int, num_classes: int, max_classes: int
) -> np.ndarray:
    """`[clients, classes]` bool: the paper's random class sets (`U{1..max_classes}` classes
    each), every class with a holder."""
    holds = np.zeros((num_clients, num_classes), bool)
    for n in range(num_clients):
        c = rng.integers(1, max_classes + 1)
        holds[n, rng.choice(num_classes, size=c, replace=False)] = True
    for k in np.flatnonzero(~holds.any(0)):
        holds[rng.integers(num_clients), k] = True
    return holds


def _holders_pathological(
    rng: np.random.Generator, num_clients: int, num_classes: int, k: int
) -> np.ndarray:
    """Client n holds classes `order[(n*k + j) % C]`, j < k: distinct, and all covered."""
    order = rng.permutation(num_classes)
    holds = np.zeros((num_clients, num_classes), bool)
    for n in range(num_clients):
        holds[n, order[(n * k + np.arange(k)) % num_classes]] = True
    return holds


def _dirichlet_split(
    rng: np.random.Generator,
    labels: np.ndarray,
    holds: np.ndarray,
    alpha: float,
    min_samples: int,
) -> list[np.ndarray]:
    """Reserve `min_samples` per client from its classes, then Dirichlet-split the rest."""
    num_clients, num_classes = holds.shape
    free = np.ones(labels.shape[0], bool)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    if min_samples > 0:
        for n in rng.permutation(num_clients):
            cand = np.flatnonzero(free & holds[n][labels])
            while cand.size < min_samples:  # its classes are exhausted: it takes on another
                avail = np.bincount(labels[free], minlength=num_classes) > 0
                holds[n, rng.choice(np.flatnonzero(avail & ~holds[n]))] = True
                cand = np.flatnonzero(free & holds[n][labels])
            take = rng.choice(cand, size=min_samples, replace=False)
            free[take] = False
            parts[n].append(take)
    for k in range(num_classes):
        idx = np.flatnonzero(free & (labels == k))
        owners = np.flatnonzero(holds[:, k])
        if idx.size == 0:
            continue
        p = rng.dirichlet(np.full(owners.size, alpha)) if owners.size > 1 else np.ones(1)
        if not np.all(np.isfinite(p)) or p.sum() <= 0:  # alpha so small that all mass underflows
            p = np.eye(owners.size)[rng.integers(owners.size)]
        counts = rng.multinomial(idx.size, p / p.sum())
        for n, piece in zip(owners, _split_by_counts(rng, idx, counts), strict=True):
            parts[n].append(piece)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in parts]


def _even_split(rng: np.random.Generator, labels: np.ndarray, holds: np.ndarray) -> list:
    """Split each class evenly (up to one sample) among its holders, at random."""
    num_clients, num_classes = holds.shape
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k in range(num_classes):
        owners = np.flatnonzero(holds[:, k])
        idx = rng.permutation(np.flatnonzero(labels == k))
        for n, piece in zip(owners, np.array_split(idx, owners.size), strict=True):
            parts[n].append(piece)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in parts]


def partition(
    labels: np.ndarray,
    num_clients: int,
    scheme: str = "paper",
    *,
    seed: int,
    alpha: float = 0.1,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    classes_per_client: int = 2,
    num_classes: int | None = None,
    max_classes: int | None = None,
) -> list[np.ndarray]:
    """Split sample indices `0..len(labels)-1` among clients.

    Args:
      labels: `[n]` integer class labels of the pool.
      num_clients: number of clients N >= 1.
      scheme: one of `SCHEMES` (see the module docstring).
      seed: integer seed; the same arguments always give the same partition.
      alpha: Dirichlet concentration (> 0) for `"paper"` and `"dirichlet"`; smaller is
        more skewed (the paper uses 0.1).
      min_samples: every client gets at least this many samples.
      classes_per_client: classes per client for `"pathological"`, in `1..C`.
      num_classes: C (default: `max(labels) + 1`).
      max_classes: `"paper"` only: each client draws its number of classes from
        `U{1..max_classes}`, in `1..C` (default None: C, the paper's "between 1 and C").

    Returns:
      N sorted int64 index arrays whose concatenation is a permutation of `0..n-1`.
    """
    check_choice("scheme", scheme, SCHEMES)
    labels, num_classes = _check_labels(labels, num_classes)
    n = labels.shape[0]
    num_clients = check_int("num_clients", num_clients, low=1)
    min_samples = check_int("min_samples", min_samples, low=0)
    seed = check_int("seed", seed, low=0)
    check_finite("alpha", alpha)
    check_range("alpha", alpha, low=0.0, low_inclusive=False)
    check_enough_samples(n, num_clients, min_samples)
    if max_classes is not None:
        if scheme != "paper":
            raise ValueError(f"max_classes applies to scheme='paper' only; got scheme={scheme!r}")
        max_classes = check_int("max_classes", max_classes, low=1, high=num_classes)
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        parts = [np.sort(p) for p in np.array_split(rng.permutation(n), num_clients)]
    elif scheme == "pathological":
        k = check_int("classes_per_client", classes_per_client, low=1, high=num_classes)
        if num_clients * k < num_classes:
            raise ValueError(
                f"pathological: num_clients * classes_per_client = {num_clients} * {k} must be "
                f">= num_classes = {num_classes} so that every class has a holder"
            )
        parts = _even_split(rng, labels, _holders_pathological(rng, num_clients, num_classes, k))
    else:
        holds = (
            _holders_paper(rng, num_clients, num_classes, max_classes or num_classes)
            if scheme == "paper"
            else np.ones((num_clients, num_classes), bool)
        )
        parts = _dirichlet_split(rng, labels, holds, float(alpha), min_samples)
    sizes = np.array([p.size for p in parts])
    if sizes.min() < min_samples:
        raise ValueError(
            f"{scheme}: client {int(sizes.argmin())} got {int(sizes.min())} samples < "
            f"min_samples={min_samples} ({n} samples over {num_clients} clients); lower "
            "min_samples or use fewer clients"
        )
    return parts


def check_enough_samples(num_samples: int, num_clients: int, min_samples: int) -> None:
    """`ValueError` naming the numbers unless `num_samples` can give each of `num_clients`
    clients at least `min_samples` (and at least one) samples, with what would fit."""
    if num_clients > num_samples:
        raise ValueError(
            f"num_clients={num_clients} exceeds the {num_samples} samples to partition (every "
            f"client needs at least one); use at most {num_samples} clients or a larger dataset"
        )
    if num_clients * min_samples > num_samples:
        raise ValueError(
            f"num_clients * min_samples = {num_clients} * {min_samples} = "
            f"{num_clients * min_samples} exceeds the {num_samples} samples to partition; use "
            f"at most {num_samples // min_samples} clients with min_samples={min_samples}, or "
            f"min_samples <= {num_samples // num_clients} with {num_clients} clients, or a "
            "larger dataset"
        )


def partition_natural(
    writers: np.ndarray, num_clients: int, *, seed: int, min_samples: int = DEFAULT_MIN_SAMPLES
) -> tuple[list[np.ndarray], np.ndarray]:
    """The natural partition of a naturally federated dataset: one client per writer.

    `num_clients` writers are drawn uniformly without replacement among those with at least
    `min_samples` samples; client n holds every sample of the n-th drawn writer (in increasing
    writer id). Samples of writers not drawn are unused.

    Args:
      writers: `[n]` integer writer (natural owner) id of every sample, e.g. FEMNIST's writer.
      num_clients: number of clients N >= 1 (at most the number of eligible writers).
      seed: integer seed of the draw.
      min_samples: writers with fewer samples are not eligible.

    Returns:
      `(parts, writer_ids)`: N sorted int64 index arrays and the `[N]` writer id of each client.
    """
    writers = np.asarray(writers)
    if writers.ndim != 1 or (writers.size and writers.dtype.kind not in "iu"):
        raise ValueError(
            f"writers must be a 1-D integer array; got {writers.dtype} {writers.shape}"
        )
    num_clients = check_int("num_clients", num_clients, low=1)
    min_samples = check_int("min_samples", min_samples, low=0)
    seed = check_int("seed", seed, low=0)
    ids, inverse, sizes = np.unique(writers, return_inverse=True, return_counts=True)
    eligible = np.flatnonzero(sizes >= max(min_samples, 1))
    if eligible.size < num_clients:
        raise ValueError(
            f"natural: num_clients={num_clients} exceeds the {eligible.size} writers (of "
            f"{ids.size}) with at least min_samples={min_samples} samples; use at most "
            f"{eligible.size} clients or lower min_samples"
        )
    rng = np.random.default_rng([seed, 3])
    chosen = np.sort(rng.choice(eligible, size=num_clients, replace=False))
    order = np.argsort(inverse, kind="stable")  # sample indices grouped by writer, ascending
    starts = np.concatenate([[0], np.cumsum(sizes)])
    parts = [order[starts[w] : starts[w + 1]].astype(np.int64) for w in chosen]
    return parts, ids[chosen]


def cap_parts(parts: list[np.ndarray], max_size: int, seed: int) -> list[np.ndarray]:
    """Keep at most `max_size` samples per client, a uniform random subset of a larger part.

    This changes the data (the dropped samples are unused; a capped client's label mix is
    kept in expectation only) and bounds the padded length of the stacked arrays.
    """
    max_size = check_int("max_samples_per_client", max_size, low=1)
    rng = np.random.default_rng([seed, 2])  # independent of the partition's stream
    return [
        np.sort(rng.choice(p, size=max_size, replace=False)) if p.size > max_size else p
        for p in parts
    ]


def label_counts(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """`[clients, classes]` int64 class counts of each client's part."""
    labels = np.asarray(labels)
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])


def label_skew(counts: np.ndarray) -> float:
    """Mean total-variation distance between each client's label distribution and the pool's.

    0 for identical distributions, approaching 1 for disjoint ones; weighs clients equally.
    """
    counts = np.asarray(counts, dtype=float)
    pool = counts.sum(0) / counts.sum()
    local = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    return float(0.5 * np.abs(local - pool).sum(1).mean())
