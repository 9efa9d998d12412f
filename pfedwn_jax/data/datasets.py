"""Datasets as host NumPy arrays: the embedded default, local files, user `.npz`, LEAF, TFDS.

`load_dataset(name)` returns a `Dataset` with inputs (`uint8 [n, H, W, C]` images, or float32
features for arrays registered from memory) and int32 labels.
Names: `DEFAULT_DATASET` (a real MNIST subset shipped in the package, NumPy only),
`FILE_DATASETS` (e.g. `mnist_full`: a known `.npz` file read from a data directory, no
download), `npz:PATH` (a user's own arrays, optionally with writer ids), `leaf:PATH` (LEAF json
such as FEMNIST, by writer), the TFDS names in `TFDS_NAMES` (read through
`pfedwn_jax.data.tfds_source`, needs the optional `tfds` extra and a prepared dataset) and the
names given to arrays in memory with `register_dataset` (`pfedwn_jax.data.registry`).
"""

from __future__ import annotations

import logging
import os
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pfedwn_jax.data import registry
from pfedwn_jax.data.arrays import (
    Dataset,
    as_images,
    as_labels,
    as_writers,
    fingerprint,
    inferred_num_classes,
    writer_ids,
)
from pfedwn_jax.data.leaf import LEAF_PREFIX, load_leaf
from pfedwn_jax.data.tfds_source import TFDS_NAMES, DatasetUnavailableError, load_tfds
from pfedwn_jax.io import write_npz

log = logging.getLogger("pfedwn_jax")

DEFAULT_DATASET = "mnist_embedded"
EMBEDDED_DIR = Path(__file__).resolve().parent / "embedded"
EMBEDDED = {DEFAULT_DATASET: EMBEDDED_DIR / "mnist_embedded.npz"}
NPZ_PREFIX = "npz:"
DATA_DIR_ENV = "PFEDWN_DATA_DIR"


class FileDataset(NamedTuple):
    """A named dataset read from `file` in a data directory; the sizes identify the right file."""

    file: str
    num_train: int
    num_test: int
    what: str


# Named local files (the repository's shared data folder `../shared/data` holds them).
FILE_DATASETS = {
    "mnist_full": FileDataset("mnist.npz", 60_000, 10_000, "the full MNIST (60,000 + 10,000)"),
}
registry.reserve(*EMBEDDED, *FILE_DATASETS, *TFDS_NAMES)


def available_datasets() -> list[str]:
    """Names `load_dataset` understands: built in, registered, `npz:PATH` and `leaf:PATH`."""
    return [
        *EMBEDDED,
        *FILE_DATASETS,
        *TFDS_NAMES,
        *registry.registered_datasets(),
        f"{NPZ_PREFIX}PATH",
        f"{LEAF_PREFIX}PATH",
    ]


def _read_archive(path: Path, name: str) -> dict[str, np.ndarray]:
    """Every array of an `.npz` (no pickles); `ValueError` naming the file otherwise."""
    if not path.is_file():
        raise ValueError(f"dataset {name!r}: file {str(path)!r} not found")
    unreadable = (OSError, ValueError, zipfile.BadZipFile, EOFError)
    try:
        loaded = np.load(path, allow_pickle=False)
    except unreadable as e:
        raise _unreadable(name, path, e) from e
    if not hasattr(loaded, "files"):  # a single array: a .npy file
        raise ValueError(
            f"dataset {name!r}: {str(path)!r} holds one array ({loaded.dtype} "
            f"{list(loaded.shape)}), not an .npz archive; save the splits with "
            "np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)"
        )
    try:
        with loaded as f:
            return {key: f[key] for key in f.files}
    except unreadable as e:
        raise _unreadable(name, path, e) from e


def _unreadable(name: str, path: Path, e: Exception) -> ValueError:
    return ValueError(
        f"dataset {name!r}: cannot read {str(path)!r} as an .npz archive of plain arrays "
        f"({type(e).__name__}: {e})"
    )


def _num_classes(name: str, raw: dict[str, np.ndarray], y_train, y_test) -> int:
    if "num_classes" not in raw:
        return inferred_num_classes(name, y_train, y_test)
    stored = raw["num_classes"]
    if stored.shape != () or stored.dtype.kind not in "iu":
        raise ValueError(
            f"dataset {name!r}: num_classes must be an integer scalar; "
            f"got {stored.dtype} {stored.shape}"
        )
    return int(stored)


def load_npz(path: str | Path, name: str | None = None) -> Dataset:
    """Load a user's `.npz`: keys `x_train, y_train[, x_test, y_test][, num_classes]`
    `[, writer_train, writer_test]`.

    Images `[n, H, W]` (a channel axis is added) or `[n, H, W, C]`, integer pixels in 0..255;
    labels integers >= 0. Without `num_classes`, it is `max(label) + 1`. Without a test
    split the test arrays are empty (partition with `pool="union"` or `"train"`). Writer ids
    (integers, one per sample of each split) make it naturally federated (`scheme="natural"`).
    """
    path = Path(path).expanduser()
    name = name or f"{NPZ_PREFIX}{path}"
    raw = _read_archive(path, name)
    missing = {"x_train", "y_train"} - set(raw)
    if missing or (("x_test" in raw) != ("y_test" in raw)):
        raise ValueError(
            f"dataset {name!r}: {str(path)!r} must contain arrays x_train, y_train "
            f"(and optionally both x_test, y_test); found {sorted(raw)}"
        )
    x_train = as_images(name, "x_train", raw["x_train"])
    y_train = as_labels(name, "y_train", raw["y_train"])
    if "x_test" in raw:
        x_test = as_images(name, "x_test", raw["x_test"])
        y_test = as_labels(name, "y_test", raw["y_test"])
    else:
        x_test = np.zeros((0, *x_train.shape[1:]), np.uint8)
        y_test = np.zeros((0,), np.int32)
    writers: list[np.ndarray | None] = [None, None]
    if "writer_test" in raw and "writer_train" not in raw:
        raise ValueError(f"dataset {name!r}: {str(path)!r} has writer_test but no writer_train")
    if "writer_train" in raw:
        test_w = raw.get("writer_test", np.zeros(0, np.int64))
        writers = [
            as_writers(name, "writer_train", raw["writer_train"], len(y_train)),
            as_writers(name, "writer_test", test_w, len(y_test)),
        ]
    num_classes = _num_classes(name, raw, y_train, y_test)
    return Dataset(x_train, y_train, x_test, y_test, num_classes, name, *writers)


def save_npz(dataset: Dataset, path: str | Path) -> Path:
    """Write `dataset` as an `.npz` that `load_npz` reads back (writer ids included), e.g. to
    convert LEAF json once. Uncompressed: loading is then a plain read."""
    path = Path(path).expanduser()
    arrays = {
        "x_train": dataset.x_train,
        "y_train": dataset.y_train,
        "x_test": dataset.x_test,
        "y_test": dataset.y_test,
        "num_classes": np.asarray(dataset.num_classes, np.int64),
    }
    ids = writer_ids(dataset)
    if ids is not None:
        arrays |= {"writer_train": ids[0], "writer_test": ids[1]}
    with path.open("wb") as f:
        write_npz(f, arrays)
    return path


def load_file_dataset(name: str, data_dir: str | Path | None = None) -> Dataset:
    """Load one of `FILE_DATASETS` from `data_dir`, else `$PFEDWN_DATA_DIR` (never downloads)."""
    spec = FILE_DATASETS[name]
    where = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV)
    hint = (
        f"dataset {name!r} ({spec.what}) is read from {spec.file} in a data directory: pass "
        f"data_dir (CLI --data-dir, config data_dir) or set ${DATA_DIR_ENV} to the folder "
        f"holding it (the repository's ../shared/data), or load any copy as 'npz:PATH'"
    )
    if where is None:
        raise DatasetUnavailableError(f"{hint}; no data directory was given")
    path = Path(where).expanduser() / spec.file
    if not path.is_file():
        raise DatasetUnavailableError(f"{hint}; {str(path)!r} does not exist")
    dataset = load_npz(path, name=name)
    sizes = (len(dataset.y_train), len(dataset.y_test))
    if sizes != (spec.num_train, spec.num_test):
        raise ValueError(
            f"dataset {name!r}: {str(path)!r} has {sizes[0]} train and {sizes[1]} test "
            f"samples, not {spec.what}; load a different file as 'npz:PATH'"
        )
    return dataset


def load_dataset(
    name: str = DEFAULT_DATASET, data_dir: str | Path | None = None, download: bool = False
) -> Dataset:
    """Load a dataset by name (see module docstring) into host memory.

    Args:
      name: `DEFAULT_DATASET`, one of `FILE_DATASETS` or `TFDS_NAMES`, a name given to arrays
        with `register_dataset`, `npz:PATH` or `leaf:PATH`.
      data_dir: the folder holding a `FILE_DATASETS` file (default `$PFEDWN_DATA_DIR`), or
        the TFDS data directory (default: `$TFDS_DATA_DIR` or `~/tensorflow_datasets`);
        ignored for the embedded default, registered datasets, `npz:` and `leaf:`.
      download: let TFDS download and prepare a missing dataset (needs TensorFlow and
        network); by default a missing dataset raises `DatasetUnavailableError`.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"dataset name must be a non-empty string; got {name!r}")
    if name in EMBEDDED:
        return load_npz(EMBEDDED[name], name=name)
    if (registered := registry.get_registered(name)) is not None:
        return registered
    if name in FILE_DATASETS:
        return load_file_dataset(name, data_dir)
    if name.startswith(NPZ_PREFIX):
        return load_npz(name[len(NPZ_PREFIX) :], name=name)
    if name.startswith(LEAF_PREFIX):
        return load_leaf(name[len(LEAF_PREFIX) :], name=name)
    if name in TFDS_NAMES:
        return load_tfds(name, data_dir=data_dir, download=download)
    raise ValueError(f"unknown dataset {name!r}; available: {available_datasets()}")


def dataset_fingerprint(name: str = DEFAULT_DATASET, data_dir: str | Path | None = None) -> str:
    """`"sha256:<hex>"` of the arrays `load_dataset(name, data_dir)` returns (`fingerprint`):
    what a result records beside the name, so two runs can tell whether they saw the same
    data. Computed once for a registered dataset, by loading the dataset otherwise."""
    if registry.get_registered(name) is not None:
        return registry.registered_fingerprint(name)
    return fingerprint(load_dataset(name, data_dir=data_dir))
