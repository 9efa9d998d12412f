"""Arrays in memory as named datasets: `register_dataset(name, x_train, y_train, ...)`.

A registered name is loaded by `load_dataset(name)` like a built-in one, so an
`ExperimentConfig(dataset=name)` stays plain data (a string) while the arrays stay in the
process. The registry lives in the Python process: register before `run`/`sweep` (in every
process of a multi-process run), e.g. at import time of your own module (`pfedwn --import`).

The arrays are copied and made read-only, so the data a name stands for cannot change behind
its back and `dataset_fingerprint(name)` (a SHA-256 of the arrays, computed once) stays true.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pfedwn_jax.data.arrays import (
    Dataset,
    as_labels,
    as_writers,
    check_inputs,
    fingerprint,
    inferred_num_classes,
)

_DATASETS: dict[str, Dataset] = {}
_FINGERPRINTS: dict[str, str] = {}
_RESERVED: set[str] = set()  # the built-in names (`reserve`, called by `data.datasets`)


def reserve(*names: str) -> None:
    """Keep `names` (built-in datasets) from being registered."""
    _RESERVED.update(names)


def registered_datasets() -> list[str]:
    """Names added by `register_dataset`, sorted."""
    return sorted(_DATASETS)


def get_registered(name: str) -> Dataset | None:
    """The `Dataset` registered under `name`, or None."""
    return _DATASETS.get(name)


def register_dataset(
    name: str,
    x_train: Any,
    y_train: Any,
    x_test: Any = None,
    y_test: Any = None,
    *,
    num_classes: int | None = None,
    writer_train: Any = None,
    writer_test: Any = None,
) -> Dataset:
    """Make arrays in memory the dataset `name` (for `load_dataset` and `ExperimentConfig`).

    Args:
      name: a new name: non-empty, no whitespace, no ':' (kept for `npz:`/`leaf:` paths), not
        a built-in dataset nor already registered (`unregister_dataset` first).
      x_train: `[n, ...]` inputs: uint8 pixels (images `[n, H, W, C]`, normalised to [0, 1]
        inside the model) or real-valued features of any shape (`[n, d]` for vectors), stored
        as float32 and given to the model unchanged (standardise them yourself).
      y_train: `[n]` integer labels >= 0.
      x_test, y_test: an optional test split like the train split (both or neither).
      num_classes: default `max(label) + 1` over both splits.
      writer_train, writer_test: optional integer owner ids per sample (`scheme="natural"`).

    Returns the registered `Dataset`. Raises `ValueError` naming the argument: a bad or taken
    name, inputs that are not uint8/real arrays `[n, ...]`, non-finite features, labels that
    are not non-negative integers, lengths that differ, splits of different shape or dtype.
    """
    _check_name(name)
    if (x_test is None) != (y_test is None):
        raise ValueError(f"dataset {name!r}: give both x_test and y_test, or neither")
    x_tr, y_tr = _inputs(name, "x_train", x_train), as_labels(name, "y_train", y_train)
    if x_test is None:
        x_te, y_te = np.zeros((0, *x_tr.shape[1:]), x_tr.dtype), np.zeros(0, np.int32)
    else:
        x_te, y_te = _inputs(name, "x_test", x_test), as_labels(name, "y_test", y_test)
    writers = _writers(name, writer_train, writer_test, len(y_tr), len(y_te))
    if num_classes is None:
        num_classes = inferred_num_classes(name, y_tr, y_te)
    dataset = Dataset(x_tr, y_tr, x_te, y_te, num_classes, name, *writers)
    for array in (x_tr, y_tr, x_te, y_te, *(w for w in writers if w is not None)):
        array.flags.writeable = False
    _DATASETS[name] = dataset
    return dataset


def unregister_dataset(name: str) -> None:
    """Remove a dataset added by `register_dataset` (then the name can be registered again)."""
    if name not in _DATASETS:
        raise ValueError(
            f"dataset {name!r} is not registered; registered datasets: {registered_datasets()}"
        )
    del _DATASETS[name]
    _FINGERPRINTS.pop(name, None)


def registered_fingerprint(name: str) -> str:
    """`fingerprint` of a registered dataset, computed once (its arrays are read-only)."""
    if name not in _FINGERPRINTS:
        _FINGERPRINTS[name] = fingerprint(_DATASETS[name])
    return _FINGERPRINTS[name]


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name or name != "".join(name.split()) or ":" in name:
        raise ValueError(
            f"dataset name must be a non-empty string without spaces or ':'; got {name!r}"
        )
    if name in _RESERVED:
        raise ValueError(f"dataset name {name!r} is a built-in dataset; choose another name")
    if name in _DATASETS:
        raise ValueError(
            f"dataset {name!r} is already registered; call unregister_dataset({name!r}) first "
            "to replace it"
        )


def _inputs(name: str, key: str, x: Any) -> np.ndarray:
    """uint8 -> a uint8 copy; real numbers -> a float32 copy; anything else a `ValueError`."""
    x = np.asarray(x)
    if x.dtype == np.uint8:
        out = x.copy()
    elif x.dtype.kind == "f":
        out = x.astype(np.float32)  # a copy
    else:
        raise ValueError(
            f"dataset {name!r}: {key} must be uint8 pixels or real-valued features (float); "
            f"got {x.dtype} (cast it: x.astype(np.float32) for features, np.uint8 for pixels)"
        )
    check_inputs(name, key, out)
    return out


def _writers(
    name: str, writer_train: Any, writer_test: Any, n_train: int, n_test: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    if writer_train is None and writer_test is None:
        return None, None
    if writer_train is None:
        raise ValueError(f"dataset {name!r}: writer_test needs writer_train")
    test = np.zeros(0, np.int64) if writer_test is None else writer_test
    return (
        as_writers(name, "writer_train", writer_train, n_train),
        as_writers(name, "writer_test", test, n_test),
    )
