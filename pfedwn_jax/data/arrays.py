"""The `Dataset` container and the checks that turn raw arrays into one.

Shared by every source (`pfedwn_jax.data.datasets` for the embedded default and `.npz`
files, `pfedwn_jax.data.tfds_source` for TFDS), which depend on it and not on each other.
"""

from __future__ import annotations

import dataclasses

import numpy as np


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
