"""Naturally federated data from LEAF json files (FEMNIST by writer), NumPy only.

No TFDS dataset carries writer ids (TFDS `emnist` has only `image` and `label`; the
writer-split "federated EMNIST" lives in TensorFlow Federated and LEAF), so the natural
partition reads LEAF's own output: `ROOT/train/*.json` and optionally `ROOT/test/*.json`, each

    {"users": [u, ...], "num_samples": [...],
     "user_data": {u: {"x": [[p_0, ..., p_{H*W-1}], ...], "y": [label, ...]}}}

with pixels in [0, 1] (stored as `round(255 p)`, not inverted) and square grey images. Writers
are numbered by their sorted names over both splits, so a writer keeps its id across splits.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from pfedwn_jax.data.arrays import Dataset, as_labels, inferred_num_classes

LEAF_PREFIX = "leaf:"


def _json_files(name: str, folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.json"))
    if not files:
        raise ValueError(f"dataset {name!r}: no .json files in {str(folder)!r}")
    return files


def _read_file(name: str, path: Path) -> dict[str, Any]:
    try:
        with path.open() as f:
            raw = json.load(f)
        users, data = raw["users"], raw["user_data"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"dataset {name!r}: {str(path)!r} is not a LEAF json file with 'users' and "
            f"'user_data' ({type(e).__name__}: {e})"
        ) from e
    return {u: data[u] for u in users}


def _user_arrays(name: str, user: str, entry: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """One writer's `x [m, side, side, 1]` uint8 and `y [m]` from its json entry."""
    x = np.asarray(entry.get("x", []), dtype=np.float32)
    y = np.asarray(entry.get("y", []))
    side = math.isqrt(x.shape[-1]) if x.ndim == 2 else 0
    if x.ndim != 2 or side * side != x.shape[1] or len(y) != len(x) or not len(x):
        raise ValueError(
            f"dataset {name!r}: writer {user!r} must have x [m, side*side] and y [m] with m >= 1; "
            f"got x {x.shape}, y {y.shape}"
        )
    if x.min() < 0 or x.max() > 1:
        raise ValueError(f"dataset {name!r}: writer {user!r} has pixels outside [0, 1]")
    pixels = np.rint(x * 255).astype(np.uint8).reshape(len(x), side, side, 1)
    return pixels, y


def _read_split(name: str, folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """`{writer name: (x, y)}` of every json file in `folder` (converted file by file)."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for path in _json_files(name, folder):
        for user, entry in _read_file(name, path).items():
            if user in out:
                raise ValueError(f"dataset {name!r}: writer {user!r} appears twice in {folder}")
            out[user] = _user_arrays(name, user, entry)
    return out


def _stack(name: str, split: str, users: dict, ids: dict[str, int], shape: tuple) -> tuple:
    if not users:
        return np.zeros((0, *shape), np.uint8), np.zeros(0, np.int32), np.zeros(0, np.int64)
    x = np.concatenate([v[0] for v in users.values()])
    y = as_labels(name, f"y_{split}", np.concatenate([v[1] for v in users.values()]))
    w = np.concatenate([np.full(len(v[1]), ids[u], np.int64) for u, v in users.items()])
    return x, y, w


def load_leaf(path: str | Path, name: str | None = None, num_classes: int | None = None) -> Dataset:
    """Load LEAF json (e.g. FEMNIST) with writer ids: `ROOT/train/*.json[, ROOT/test/*.json]`.

    Args:
      path: the LEAF data folder holding `train/` (and optionally `test/`).
      name: the dataset's name (default `leaf:PATH`).
      num_classes: C (default `max(label) + 1`; FEMNIST has 62).

    Returns:
      A `Dataset` with `writer_train`, `writer_test`; partition it with `scheme="natural"`.
      Reading json is slow for the full FEMNIST: convert once with `save_npz` and load `npz:`.
    """
    root = Path(path).expanduser()
    name = name or f"{LEAF_PREFIX}{root}"
    if not (root / "train").is_dir():
        raise ValueError(f"dataset {name!r}: {str(root / 'train')!r} is not a folder")
    train = _read_split(name, root / "train")
    test = _read_split(name, root / "test") if (root / "test").is_dir() else {}
    ids = {u: i for i, u in enumerate(sorted(set(train) | set(test)))}
    shape = next(iter(train.values()))[0].shape[1:] if train else (0, 0, 1)
    x_tr, y_tr, w_tr = _stack(name, "train", train, ids, shape)
    x_te, y_te, w_te = _stack(name, "test", test, ids, shape)
    if num_classes is None:
        num_classes = inferred_num_classes(name, y_tr, y_te)
    return Dataset(x_tr, y_tr, x_te, y_te, num_classes, name, w_tr, w_te)
