"""Stacked, padded per-client arrays: the layout a vmapped training step indexes.

This module is the contract between the data pipeline and the training engine.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np


class ClientData(NamedTuple):
    """One split (train or test) of every client's data, padded to a common length.

    Attributes:
      x: `[clients, max_samples, ...]` inputs: uint8 images `[..., H, W, C]` (normalised inside
        the model) or float32 features (`[..., d]` for vectors).
      y: `[clients, max_samples]` int32 labels (0 in padded slots).
      mask: `[clients, max_samples]` bool, True for real samples.
      count: `[clients]` int32, the number of real samples (= mask.sum(-1)).

    Real samples of client n occupy slots `0 .. count[n]-1`; padding follows.
    Host (NumPy) arrays as built by the data pipeline, device arrays once placed
    (`stacking.to_device`). A NamedTuple is a pytree, so `ClientData` passes through jit/vmap
    unchanged.
    """

    x: jax.Array | np.ndarray
    y: jax.Array | np.ndarray
    mask: jax.Array | np.ndarray
    # shadows `tuple.count`; a public field name older than the type check
    count: jax.Array | np.ndarray  # type: ignore[assignment]

    @property
    def num_clients(self) -> int:
        return int(self.y.shape[0])

    @property
    def max_samples(self) -> int:
        return int(self.y.shape[1])


class FederatedData(NamedTuple):
    """A partitioned dataset: train and test `ClientData` over the same clients, and `val`,
    a validation split carved from each client's training samples (None: no validation)."""

    train: ClientData
    test: ClientData
    num_classes: int
    name: str
    val: ClientData | None = None
