"""Reading (and preparing) real datasets through tensorflow-datasets.

Reading uses `tfds.data_source(..., download=False)` over array_record files: it needs the
optional `tfds` extra but no TensorFlow. Preparing (`prepare_tfds`, CLI `pfedwn data prepare`)
runs `download_and_prepare(file_format="array_record")`, which needs TensorFlow and either
network access or the original archives in a manual directory.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from pfedwn_jax.data.arrays import Dataset, as_images, as_labels

# TFDS name -> number of classes: the paper's three datasets, Fashion-MNIST, and EMNIST (large
# pools for thousands of clients: ByClass 814,255 images of 62 classes, Balanced 131,600 of 47,
# Digits 280,000 of 10). TFDS's EMNIST has no writer ids (only `image`, `label`; images
# transposed as in the original): for FEMNIST by writer see `pfedwn_jax.data.leaf`.
TFDS_NAMES = {
    "mnist": 10,
    "fashion_mnist": 10,
    "cifar10": 10,
    "cifar100": 100,
    "emnist": 62,
    "emnist/balanced": 47,
    "emnist/digits": 10,
}
INSTALL_HINT = "pip install 'pfedwn-jax[tfds]' tensorflow"


class DatasetUnavailableError(ValueError):
    """A dataset is not available locally; the message says how to make it available."""


def default_data_dir() -> Path:
    """Where TFDS looks by default: `$TFDS_DATA_DIR`, else `~/tensorflow_datasets`."""
    return Path(os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets").expanduser()


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """`data_dir` with `~` expanded, or `default_data_dir()` when it is None."""
    return default_data_dir() if data_dir is None else Path(data_dir).expanduser()


def unavailable(name: str, data_dir: Path, reason: str) -> DatasetUnavailableError:
    """The one error for a missing dataset: what, where, and the commands that fix it."""
    return DatasetUnavailableError(
        f"dataset {name!r} is not available in {str(data_dir)!r} ({reason}). To make it "
        f"available, on a machine with internet access run: `{INSTALL_HINT}` then "
        f"`pfedwn data prepare {name} --data-dir {data_dir}` (offline: put the original "
        f"archives in a folder M and add `--manual-dir M`). The embedded default "
        f"'mnist_embedded' needs no download."
    )


def _import_tfds(name: str, data_dir: Path) -> Any:
    """The `tensorflow_datasets` module, or `DatasetUnavailableError` when not installed."""
    if importlib.util.find_spec("tensorflow_datasets") is None:
        raise unavailable(name, data_dir, "tensorflow-datasets is not installed")
    # Deferred: tensorflow_datasets is an optional extra and slow to import.
    import tensorflow_datasets as tfds

    return tfds


READ_BATCH = 1024  # examples per batched read of a data source


def _to_arrays(
    name: str, split: str, source: Any, batch: int = READ_BATCH
) -> tuple[np.ndarray, np.ndarray]:
    """Read every example of a TFDS data source into `x [n, H, W, C]`, `y [n]`.

    Batched: `source.__getitems__(keys)` (the data sources' batch read; array_record reads the
    records of a batch together) for `batch` examples at a time, each batch stacked into the
    preallocated arrays, with a progress bar on a terminal.
    """
    n = len(source)
    if n == 0:
        return np.zeros((0, 0, 0, 0), np.uint8), np.zeros((0,), np.int32)
    x = y = None
    with tqdm(total=n, desc=f"{name}/{split}", leave=False, disable=None) as bar:
        for start in range(0, n, batch):
            examples = source.__getitems__(list(range(start, min(start + batch, n))))
            images = np.stack([np.asarray(ex["image"]) for ex in examples])
            labels = np.array([ex["label"] for ex in examples], np.int64)
            if x is None or y is None:
                x, y = np.empty((n, *images.shape[1:]), images.dtype), np.empty(n, np.int64)
            x[start : start + len(examples)] = images
            y[start : start + len(examples)] = labels
            bar.update(len(examples))
    assert x is not None and y is not None  # n > 0: the loop ran
    return as_images(name, f"x_{split}", x), as_labels(name, f"y_{split}", y)


def load_tfds(name: str, data_dir: str | Path | None = None, download: bool = False) -> Dataset:
    """Load a prepared TFDS dataset (`train` and `test` splits) into host memory.

    Raises `DatasetUnavailableError` (a `ValueError`) naming the dataset, the directory
    searched and the commands that make it available when it cannot be read.
    """
    if name not in TFDS_NAMES:
        raise ValueError(f"unknown TFDS dataset {name!r}; supported: {sorted(TFDS_NAMES)}")
    where = resolve_data_dir(data_dir)
    tfds = _import_tfds(name, where)
    if not download and not where.is_dir():
        # Checked before calling TFDS: it would otherwise create the folder and report a
        # misleading file-format error.
        raise unavailable(name, where, "the data directory does not exist")
    try:
        sources = tfds.data_source(
            name, split=["train", "test"], data_dir=str(where), download=download
        )
    except (OSError, RuntimeError, ValueError, AssertionError) as e:
        # NotImplementedError (a RuntimeError) is TFDS's answer for "not prepared as
        # array_record"; FileNotFoundError and friends for missing files.
        raise unavailable(name, where, f"{type(e).__name__}: {str(e).splitlines()[0]}") from e
    (x_train, y_train), (x_test, y_test) = (
        _to_arrays(name, split, src) for split, src in zip(("train", "test"), sources, strict=True)
    )
    if len(y_train) == 0:
        raise unavailable(name, where, "the prepared train split is empty")
    if len(y_test) == 0:
        x_test = np.zeros((0, *x_train.shape[1:]), np.uint8)
    return Dataset(x_train, y_train, x_test, y_test, TFDS_NAMES[name], name)


def prepare_tfds(
    name: str, data_dir: str | Path | None = None, manual_dir: str | Path | None = None
) -> Path:
    """Download (or read from `manual_dir`) and prepare `name` as array_record files.

    Needs TensorFlow (TFDS' builders use it to prepare) and network access unless the
    original archives are in `manual_dir`. Returns the data directory.
    """
    if name not in TFDS_NAMES:
        raise ValueError(f"unknown TFDS dataset {name!r}; supported: {sorted(TFDS_NAMES)}")
    where = resolve_data_dir(data_dir)
    tfds = _import_tfds(name, where)
    if importlib.util.find_spec("tensorflow") is None:
        raise ValueError(
            f"preparing {name!r} needs TensorFlow, which is not installed; run `{INSTALL_HINT}` "
            "(reading a prepared dataset does not need TensorFlow)"
        )
    config = tfds.download.DownloadConfig(
        manual_dir=None if manual_dir is None else str(Path(manual_dir).expanduser())
    )
    builder = tfds.builder(name, data_dir=str(where))
    builder.download_and_prepare(download_config=config, file_format="array_record")
    return where
