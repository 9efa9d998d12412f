"""Datasets as host NumPy arrays: the embedded default, user `.npz` files and TFDS.

`load_dataset(name)` returns a `Dataset` with `uint8 [n, H, W, C]` images and int32 labels.
Names: `DEFAULT_DATASET` (a real MNIST subset shipped in the package, NumPy only),
`npz:PATH` (a user's own arrays), and the TFDS names in `TFDS_NAMES` (read through
`pfedwn_jax.data.tfds_source`, needs the optional `tfds` extra and a prepared dataset).
"""

from __future__ import annotations

import dataclasses
import zipfile
from pathlib import Path

import numpy as np

DEFAULT_DATASET = "mnist_embedded"
EMBEDDED_DIR = Path(__file__).resolve().parent / "embedded"
EMBEDDED = {DEFAULT_DATASET: EMBEDDED_DIR / "mnist_embedded.npz"}
# TFDS name -> number of classes (the paper's three datasets plus Fashion-MNIST).
TFDS_NAMES = {"mnist": 10, "fashion_mnist": 10, "cifar10": 10, "cifar100": 100}
NPZ_PREFIX = "npz:"


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """A labelled image dataset held in host memory.

    Attributes:
      x_train: `[n_train, H, W, C]` uint8 images.
      y_train: `[n_train]` int32 labels in `[0, num_classes)`.
      x_test: `[n_test, H, W, C]` uint8 images (`n_test` may be 0).
      y_test: `[n_test]` int32 labels.
      num_classes: number of classes C.
      name: the name it was loaded under.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    name: str

    def __post_init__(self) -> None:
        validate_arrays(
            self.name, self.x_train, self.y_train, self.x_test, self.y_test, self.num_classes
        )

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """`(H, W, C)` of one image."""
        return tuple(int(s) for s in self.x_train.shape[1:])  # type: ignore[return-value]

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, train={len(self.y_train)}, test={len(self.y_test)}, "
            f"input_shape={self.input_shape}, num_classes={self.num_classes})"
        )


def available_datasets() -> list[str]:
    """Names `load_dataset` understands (plus `npz:PATH`)."""
    return [*EMBEDDED, *TFDS_NAMES, f"{NPZ_PREFIX}PATH"]


def validate_arrays(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    num_classes: int,
) -> None:
    """Raise `ValueError` naming the dataset unless the arrays form a valid `Dataset`."""
    if isinstance(num_classes, bool) or int(num_classes) != num_classes or num_classes < 2:
        raise ValueError(
            f"dataset {name!r}: num_classes must be an integer >= 2; got {num_classes!r}"
        )
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if x.dtype != np.uint8:
            raise ValueError(f"dataset {name!r}: x_{split} must be uint8; got {x.dtype}")
        if x.ndim != 4:
            raise ValueError(
                f"dataset {name!r}: x_{split} must have shape [n, H, W, C]; got {x.shape}"
            )
        if y.dtype != np.int32 or y.ndim != 1:
            raise ValueError(
                f"dataset {name!r}: y_{split} must be a 1-D int32 array; got {y.dtype} {y.shape}"
            )
        if len(x) != len(y):
            raise ValueError(
                f"dataset {name!r}: x_{split} has {len(x)} images but y_{split} {len(y)} labels"
            )
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            bad = y[(y < 0) | (y >= num_classes)][0]
            raise ValueError(
                f"dataset {name!r}: y_{split} labels must be in [0, {num_classes}); got {bad}"
            )
    if len(y_train) == 0:
        raise ValueError(f"dataset {name!r}: the train split is empty")
    if len(y_test) and x_test.shape[1:] != x_train.shape[1:]:
        raise ValueError(
            f"dataset {name!r}: train images {x_train.shape[1:]} and test images "
            f"{x_test.shape[1:]} differ in shape"
        )


def as_images(name: str, key: str, x: np.ndarray) -> np.ndarray:
    """`[n, H, W]` or `[n, H, W, C]` integer pixels in 0..255 -> uint8 `[n, H, W, C]`."""
    x = np.asarray(x)
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4:
        raise ValueError(
            f"dataset {name!r}: {key} must have shape [n, H, W] or [n, H, W, C]; got {x.shape}"
        )
    if x.dtype == np.uint8:
        return x
    if x.dtype.kind not in "iu":
        raise ValueError(
            f"dataset {name!r}: {key} must hold integer pixels (uint8); got dtype {x.dtype}"
        )
    if x.size and (x.min() < 0 or x.max() > 255):
        raise ValueError(f"dataset {name!r}: {key} pixels must be in [0, 255]")
    return x.astype(np.uint8)


def as_labels(name: str, key: str, y: np.ndarray) -> np.ndarray:
    """Integer labels `[n]` -> int32 `[n]`."""
    y = np.asarray(y)
    if y.ndim != 1 or (y.size and y.dtype.kind not in "iu"):
        raise ValueError(
            f"dataset {name!r}: {key} must be a 1-D integer array; got {y.dtype} {y.shape}"
        )
    if y.size and (y.min() < 0 or y.max() > np.iinfo(np.int32).max):
        raise ValueError(f"dataset {name!r}: {key} labels must be >= 0; got {y.min()}")
    return y.astype(np.int32)


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
        from pfedwn_jax.data.tfds_source import load_tfds

        return load_tfds(name, data_dir=data_dir, download=download)
    raise ValueError(f"unknown dataset {name!r}; available: {available_datasets()}")
