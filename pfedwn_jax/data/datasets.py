"""Datasets as host NumPy arrays: the embedded default, user `.npz` files and TFDS.

`load_dataset(name)` returns a `Dataset` with `uint8 [n, H, W, C]` images and int32 labels.
Names: `DEFAULT_DATASET` (a real MNIST subset shipped in the package, NumPy only),
`npz:PATH` (a user's own arrays), and the TFDS names in `TFDS_NAMES` (read through
`pfedwn_jax.data.tfds_source`, needs the optional `tfds` extra and a prepared dataset).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from pfedwn_jax.data.arrays import Dataset, as_images, as_labels
from pfedwn_jax.data.tfds_source import TFDS_NAMES, load_tfds

DEFAULT_DATASET = "mnist_embedded"
EMBEDDED_DIR = Path(__file__).resolve().parent / "embedded"
EMBEDDED = {DEFAULT_DATASET: EMBEDDED_DIR / "mnist_embedded.npz"}
NPZ_PREFIX = "npz:"


def available_datasets() -> list[str]:
    """Names `load_dataset` understands (plus `npz:PATH`)."""
    return [*EMBEDDED, *TFDS_NAMES, f"{NPZ_PREFIX}PATH"]


def load_npz(path: str | Path, name: str | None = None) -> Dataset:
    """Load a user's `.npz`: keys `x_train, y_train[, x_test, y_test][, num_classes]`.

    Images `[n, H, W]` (a channel axis is added) or `[n, H, W, C]`, integer pixels in 0..255;
    labels integers >= 0. Without `num_classes`, it is `max(label) + 1`. Without a test
    split the test arrays are empty (partition with `pool="union"` or `"train"`).
    """
    path = Path(path).expanduser()
    name = name or f"{NPZ_PREFIX}{path}"
    if not path.is_file():
        raise ValueError(f"dataset {name!r}: file {str(path)!r} not found")
    try:
        with np.load(path, allow_pickle=False) as f:
            raw = {key: f[key] for key in f.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise ValueError(
            f"dataset {name!r}: cannot read {str(path)!r} as an .npz archive of plain arrays "
            f"({type(e).__name__}: {e})"
        ) from e
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
    if "num_classes" in raw:
        num_classes = raw["num_classes"]
        if num_classes.shape != () or num_classes.dtype.kind not in "iu":
            raise ValueError(
                f"dataset {name!r}: num_classes must be an integer scalar; "
                f"got {num_classes.dtype} {num_classes.shape}"
            )
        num_classes = int(num_classes)
    else:
        num_classes = max(int(y_train.max(initial=-1)), int(y_test.max(initial=-1))) + 1
    return Dataset(x_train, y_train, x_test, y_test, num_classes, name)


def load_dataset(
    name: str = DEFAULT_DATASET, data_dir: str | Path | None = None, download: bool = False
) -> Dataset:
    """Load a dataset by name (see module docstring) into host memory.

    Args:
      name: `DEFAULT_DATASET`, one of `TFDS_NAMES`, or `npz:PATH`.
      data_dir: TFDS data directory (default: `$TFDS_DATA_DIR` or `~/tensorflow_datasets`);
        ignored for the embedded default and `npz:`.
      download: let TFDS download and prepare a missing dataset (needs TensorFlow and
        network); by default a missing dataset raises `DatasetUnavailableError`.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"dataset name must be a non-empty string; got {name!r}")
    if name in EMBEDDED:
        return load_npz(EMBEDDED[name], name=name)
    if name.startswith(NPZ_PREFIX):
        return load_npz(name[len(NPZ_PREFIX) :], name=name)
    if name in TFDS_NAMES:
        return load_tfds(name, data_dir=data_dir, download=download)
    raise ValueError(f"unknown dataset {name!r}; available: {available_datasets()}")
