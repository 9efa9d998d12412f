"""The `Dataset` container and the checks that turn raw arrays into one.

Shared by every source (`pfedwn_jax.data.datasets` for the embedded default and `.npz`
files, `pfedwn_jax.data.tfds_source` for TFDS, `pfedwn_jax.data.registry` for arrays in
memory), which depend on it and not on each other.

Inputs are either uint8 pixels (images `[n, H, W, C]`, normalised to [0, 1] inside the model,
so the stacked client arrays stay 4x smaller than float32) or float32 features of any shape
`[n, ...]` (tabular data, channel-state vectors), which the model takes as they are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging

import numpy as np

# The input dtypes a `Dataset` holds: uint8 pixels or float32 features.
INPUT_DTYPES = ("uint8", "float32")


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """A labelled dataset held in host memory.

    Attributes:
      x_train: `[n_train, ...]` inputs: uint8 images `[n_train, H, W, C]` or finite float32
        features of any shape (`[n_train, d]` for vectors).
      y_train: `[n_train]` int32 labels in `[0, num_classes)`.
      x_test: `[n_test, ...]` inputs like `x_train` (`n_test` may be 0).
      y_test: `[n_test]` int32 labels.
      num_classes: number of classes C.
      name: the name it was loaded under.
      writer_train: `[n_train]` int64 natural owner of each sample (FEMNIST: its writer),
        or None for a dataset that is not naturally federated.
      writer_test: `[n_test]` int64, present exactly when `writer_train` is.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    name: str
    writer_train: np.ndarray | None = None
    writer_test: np.ndarray | None = None

    def __post_init__(self) -> None:
        validate_arrays(
            self.name, self.x_train, self.y_train, self.x_test, self.y_test, self.num_classes
        )
        validate_writers(self.name, self.writer_train, self.writer_test, self.y_train, self.y_test)

    @property
    def has_writers(self) -> bool:
        """True for a naturally federated dataset (writer ids, `scheme="natural"`)."""
        return self.writer_train is not None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input: `(H, W, C)` of an image, `(d,)` of a feature vector."""
        return tuple(int(s) for s in self.x_train.shape[1:])

    @property
    def input_dtype(self) -> str:
        """ "uint8" (pixels) or "float32" (features)."""
        return str(self.x_train.dtype)

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, train={len(self.y_train)}, test={len(self.y_test)}, "
            f"input_shape={self.input_shape}, num_classes={self.num_classes}"
            + (f", writers={num_writers(self)})" if self.has_writers else ")")
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
        check_inputs(name, f"x_{split}", x)
        if y.dtype != np.int32 or y.ndim != 1:
            raise ValueError(
                f"dataset {name!r}: y_{split} must be a 1-D int32 array; got {y.dtype} {y.shape}"
            )
        if len(x) != len(y):
            raise ValueError(
                f"dataset {name!r}: x_{split} has {len(x)} samples but y_{split} {len(y)} labels"
            )
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            bad = y[(y < 0) | (y >= num_classes)][0]
            raise ValueError(
                f"dataset {name!r}: y_{split} labels must be in [0, {num_classes}); got {bad}"
            )
    if len(y_train) == 0:
        raise ValueError(f"dataset {name!r}: the train split is empty")
    if len(y_test) and (x_test.shape[1:], x_test.dtype) != (x_train.shape[1:], x_train.dtype):
        raise ValueError(
            f"dataset {name!r}: train inputs {x_train.dtype} {x_train.shape[1:]} and test "
            f"inputs {x_test.dtype} {x_test.shape[1:]} differ in shape or dtype"
        )


def check_inputs(name: str, key: str, x: np.ndarray) -> None:
    """Raise `ValueError` unless `x` is uint8 or finite float32 of shape `[n, ...]`."""
    if str(x.dtype) not in INPUT_DTYPES:
        raise ValueError(
            f"dataset {name!r}: {key} must be uint8 (pixels) or float32 (features); got {x.dtype}"
        )
    if x.ndim < 2:
        raise ValueError(
            f"dataset {name!r}: {key} must have shape [n, ...] with at least one feature axis "
            f"(one feature per sample: x[:, None]); got {x.shape}"
        )
    if x.dtype == np.float32 and not np.isfinite(x).all():
        raise ValueError(f"dataset {name!r}: {key} must be finite; it holds NaN or infinity")


def validate_writers(
    name: str,
    writer_train: np.ndarray | None,
    writer_test: np.ndarray | None,
    y_train: np.ndarray,
    y_test: np.ndarray,
) -> None:
    """Raise `ValueError` unless the writer ids are both None or both int64 `[n]` per split."""
    if (writer_train is None) != (writer_test is None):
        raise ValueError(f"dataset {name!r}: give both writer_train and writer_test, or neither")
    if writer_train is None or writer_test is None:
        return
    for split, w, y in (("train", writer_train, y_train), ("test", writer_test, y_test)):
        if w.dtype != np.int64 or w.shape != y.shape:
            raise ValueError(
                f"dataset {name!r}: writer_{split} must be int64 of shape {y.shape} like "
                f"y_{split}; got {w.dtype} {w.shape}"
            )


def writer_ids(dataset: Dataset) -> tuple[np.ndarray, np.ndarray] | None:
    """`(writer_train, writer_test)`, or None for a dataset without writer ids."""
    if dataset.writer_train is None or dataset.writer_test is None:
        return None  # both or neither (`validate_writers`)
    return dataset.writer_train, dataset.writer_test


def num_writers(dataset: Dataset) -> int:
    """Distinct writers over both splits (0 for a dataset without writer ids)."""
    ids = writer_ids(dataset)
    if ids is None:
        return 0
    return int(np.unique(np.concatenate(ids)).size)


def as_writers(name: str, key: str, w: np.ndarray, num: int) -> np.ndarray:
    """Integer writer ids `[num]` -> int64 `[num]`."""
    w = np.asarray(w)
    if w.shape != (num,) or (w.size and w.dtype.kind not in "iu"):
        raise ValueError(
            f"dataset {name!r}: {key} must be a 1-D integer array of length {num} (one writer id "
            f"per sample); got {w.dtype} {w.shape}"
        )
    return w.astype(np.int64)


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


def fingerprint(dataset: Dataset) -> str:
    """`"sha256:<hex>"` of the dataset's arrays (dtype, shape and bytes of every split, the
    writer ids, `num_classes`), not its name: equal data gives equal fingerprints, so a result
    can say which arrays a name stood for."""
    digest = hashlib.sha256(f"num_classes={dataset.num_classes}".encode())
    arrays = [dataset.x_train, dataset.y_train, dataset.x_test, dataset.y_test]
    ids = writer_ids(dataset)
    if ids is not None:
        arrays += ids
    for a in arrays:
        a = np.ascontiguousarray(a)
        digest.update(f"|{a.dtype.str}{a.shape}|".encode())
        digest.update(a.data)
    return f"sha256:{digest.hexdigest()}"


def inferred_num_classes(name: str, y_train: np.ndarray, y_test: np.ndarray) -> int:
    """The class count read off the largest label (labels 0..K-1), for a dataset that does
    not give one. A single distinct label is a `ValueError` (nothing to classify; it was
    silently made two classes); labels that leave classes without a sample (one stray label
    1000 among 0..9 makes a 1001-class model) are logged as a warning naming the count."""
    labels = np.concatenate([np.ravel(y_train), np.ravel(y_test)])
    present = np.unique(labels)
    if present.size == 0:
        raise ValueError(f"dataset {name!r}: no labels; give at least one sample")
    if present.size == 1:
        raise ValueError(
            f"dataset {name!r}: every label is {int(present[0])}, a single class: nothing to "
            "classify (give num_classes to train on it anyway)"
        )
    num_classes = int(present[-1]) + 1
    if present.size < num_classes:
        logging.getLogger("pfedwn_jax").warning(
            "dataset %r: the largest label is %d, so the model gets %d classes, but only %d "
            "distinct labels occur (%d classes have no sample); relabel to 0..%d or give "
            "num_classes",
            name,
            num_classes - 1,
            num_classes,
            present.size,
            num_classes - present.size,
            present.size - 1,
        )
    return num_classes
