"""From a dataset to `FederatedData`: pool, partition, per-client train/test split, stack."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import numpy as np

from pfedwn_jax._checks import check_choice, check_finite, check_float, check_int, check_range
from pfedwn_jax.data.arrays import Dataset, writer_ids
from pfedwn_jax.data.client_data import FederatedData
from pfedwn_jax.data.datasets import load_dataset
from pfedwn_jax.data.partition import (
    ALL_SCHEMES,
    DEFAULT_MIN_SAMPLES,
    NATURAL,
    cap_parts,
    partition,
    partition_natural,
)
from pfedwn_jax.data.stacking import stack_clients, to_device

POOLS = ("union", "train")


def pool_arrays(dataset: Dataset, pool: str = "union") -> tuple[np.ndarray, np.ndarray]:
    """The samples to partition: `"union"` of train and test (as PFL libraries do), or
    `"train"` only (the dataset's test split is then unused)."""
    check_choice("pool", pool, POOLS)
    if pool == "train" or len(dataset.y_test) == 0:
        return dataset.x_train, dataset.y_train
    return (
        np.concatenate([dataset.x_train, dataset.x_test]),
        np.concatenate([dataset.y_train, dataset.y_test]),
    )


def pool_writers(dataset: Dataset, pool: str = "union") -> np.ndarray:
    """`[n]` writer ids of the samples `pool_arrays` returns (same order)."""
    check_choice("pool", pool, POOLS)
    ids = writer_ids(dataset)
    if ids is None:
        raise ValueError(
            f"scheme={NATURAL!r} needs a naturally federated dataset with writer ids "
            f"(npz keys writer_train/writer_test, or 'leaf:PATH'); {dataset.name!r} has none"
        )
    if pool == "train" or len(dataset.y_test) == 0:
        return ids[0]
    return np.concatenate(ids)


def partition_pool(
    dataset: Dataset, num_clients: int, scheme: str, *, seed: int, pool: str = "union", **kw
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Pool `(x, y)` and its partition `parts` (`kw`: `partition`'s alpha, min_samples,
    classes_per_client); errors name the dataset, pool and pool size."""
    check_choice("scheme", scheme, ALL_SCHEMES)
    x, y = pool_arrays(dataset, pool)
    try:
        if scheme == NATURAL:
            parts, _ = partition_natural(
                pool_writers(dataset, pool), num_clients, seed=seed, min_samples=kw["min_samples"]
            )
        else:
            parts = partition(
                y, num_clients, scheme, seed=seed, num_classes=dataset.num_classes, **kw
            )
    except ValueError as e:
        raise ValueError(
            f"dataset {dataset.name!r} (pool={pool!r}, {len(y)} samples): {e}"
        ) from None
    return x, y, parts


def split_train_test(
    parts: list[np.ndarray], train_frac: float, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Randomly split each client's indices: `round(train_frac * n)` train, the rest test,
    clipped so a client with >= 2 samples keeps at least one of each."""
    rng = np.random.default_rng([seed, 1])  # a stream independent of the partition's
    train, test = [], []
    for p in parts:
        n = len(p)
        n_train = int(np.clip(round(train_frac * n), min(1, n), max(n - 1, min(1, n))))
        perm = rng.permutation(p)
        train.append(perm[:n_train])
        test.append(perm[n_train:])
    return train, test


def split_validation(
    train_parts: list[np.ndarray], val_fraction: float, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Carve a validation part from each client's training indices: `round(val_fraction * n)`
    samples, at least one when `val_fraction > 0` and the client has >= 2 training samples,
    never all (a client keeps at least one training sample). Returns `(train, val)`; with
    `val_fraction = 0` the training parts are returned unchanged and every val part is empty.
    """
    val_fraction = check_float("val_fraction", val_fraction, 0.0, 1.0, high_inclusive=False)
    if val_fraction == 0.0:
        return list(train_parts), [np.zeros(0, np.int64) for _ in train_parts]
    rng = np.random.default_rng([seed, 4])  # independent of the partition's and the split's
    train, val = [], []
    for p in train_parts:
        n = len(p)
        n_val = int(np.clip(round(val_fraction * n), min(1, n - 1), max(n - 1, 0)))
        perm = rng.permutation(p)
        val.append(np.sort(perm[:n_val]))
        train.append(np.sort(perm[n_val:]))
    return train, val


class ClassOptions(TypedDict, total=False):
    """`partition`'s class-count keyword of a scheme (`class_options`)."""

    max_classes: int
    classes_per_client: int


def class_options(scheme: str, classes_per_client: int | None) -> ClassOptions:
    """`partition`'s keyword for an experiment's `classes_per_client`: `"paper"` -> the upper
    end `max_classes` of the per-client draw, `"pathological"` -> the exact count; None -> the
    scheme's default (the paper's `U{1..C}`; 2). Other schemes take no class count."""
    if classes_per_client is None:
        return {}
    if scheme == "paper":
        return {"max_classes": classes_per_client}
    if scheme == "pathological":
        return {"classes_per_client": classes_per_client}
    raise ValueError(
        f"classes_per_client applies to partition 'paper' or 'pathological'; got {scheme!r}"
    )


def _check_cap(cap: int | None, min_samples: int) -> int | None:
    """`max_samples_per_client` as an int >= `min_samples` (or None)."""
    if cap is None:
        return None
    cap = check_int("max_samples_per_client", cap)
    if cap < min_samples:
        raise ValueError(
            f"max_samples_per_client={cap} is below min_samples={min_samples}; every client "
            "must be able to keep its minimum"
        )
    return cap


def make_federated(
    dataset: Dataset | str,
    num_clients: int,
    scheme: str = "paper",
    *,
    seed: int = 0,
    alpha: float = 0.1,
    train_frac: float = 0.75,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    pool: str = "union",
    classes_per_client: int = 2,
    data_dir: str | Path | None = None,
    device: bool = True,
    max_samples_per_client: int | None = None,
    max_classes: int | None = None,
    val_fraction: float = 0.0,
) -> FederatedData:
    """Partition a dataset among clients and stack each client's train and test samples.

    Args:
      dataset: a `Dataset` or a name for `load_dataset` (e.g. `DEFAULT_DATASET`).
      num_clients: number of clients N.
      scheme: one of `ALL_SCHEMES`: a label-based scheme of `partition`, or `"natural"`
        (one client per writer, `partition_natural`; needs a dataset with writer ids).
      alpha, min_samples, classes_per_client, max_classes: see `partition`.
      seed: seeds the partition and the per-client split (deterministic).
      train_frac: share of each client's samples used for training, in (0, 1); the
        paper uses 0.75.
      pool: `"union"` (train + test of the dataset) or `"train"`.
      data_dir: TFDS data directory when `dataset` is a TFDS name.
      device: put the arrays on the default JAX device (else keep host NumPy arrays).
      max_samples_per_client: if set, a client with more samples keeps a uniform random
        subset of this many (before the train/test split; the rest is unused). This
        **changes the data** and bounds the padded length: `train.x` is then at most
        `[N, round(train_frac * cap), ...]`. None (default) keeps every sample.
      val_fraction: share of each client's *training* samples moved to a validation split
        (`split_validation`), in [0, 1); 0 (default): no validation split, and everything
        else is exactly as without it. The test split is never touched.

    Returns:
      `FederatedData(train, test, num_classes, name, val)`; `train.x` is
      `[N, max_train, H, W, C]` uint8, `test.x` `[N, max_test, H, W, C]`, `val` None or
      `[N, max_val, H, W, C]`.
    """
    check_finite("train_frac", train_frac)
    check_range("train_frac", train_frac, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    check_choice("pool", pool, POOLS)
    check_choice("scheme", scheme, ALL_SCHEMES)
    min_samples = check_int("min_samples", min_samples, low=2)
    cap = _check_cap(max_samples_per_client, min_samples)
    if not isinstance(dataset, Dataset):
        dataset = load_dataset(dataset, data_dir=data_dir)
    x, y, parts = partition_pool(
        dataset,
        num_clients,
        scheme,
        seed=seed,
        pool=pool,
        alpha=alpha,
        min_samples=min_samples,
        classes_per_client=classes_per_client,
        **({} if max_classes is None else {"max_classes": max_classes}),
    )
    if cap is not None:
        parts = cap_parts(parts, cap, seed)
    train_parts, test_parts = split_train_test(parts, float(train_frac), seed)
    train_parts, val_parts = split_validation(train_parts, val_fraction, seed)
    train, test = stack_clients(x, y, train_parts), stack_clients(x, y, test_parts)
    val = stack_clients(x, y, val_parts) if val_fraction > 0 else None
    if device:
        train, test = to_device(train), to_device(test)
        val = None if val is None else to_device(val)
    return FederatedData(train, test, dataset.num_classes, dataset.name, val)


def client_label_counts(data: FederatedData, split: str = "all") -> np.ndarray:
    """`[clients, classes]` class counts of each client (`split`: "train", "test", "val" or
    "all" = train + val + test)."""
    check_choice("split", split, ("train", "test", "val", "all"))
    if split == "all":
        splits = [cd for cd in (data.train, data.val, data.test) if cd is not None]
    elif split == "val" and data.val is None:
        raise ValueError("split='val': this FederatedData has no validation split")
    else:
        splits = [getattr(data, split)]
    total = np.zeros((splits[0].num_clients, data.num_classes), np.int64)
    for cd in splits:
        y, mask = np.asarray(cd.y), np.asarray(cd.mask)
        total += np.stack(
            [np.bincount(y[n][mask[n]], minlength=data.num_classes) for n in range(y.shape[0])]
        )
    return total
