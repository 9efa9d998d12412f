"""Worker of `test_sharding.py`: a sweep on a 2 x 2 ("runs", "slots") mesh of 4 CPU devices
against the same sweep on one device; prints the largest difference of each column."""

from __future__ import annotations

import sys

import jax
import numpy as np
from helpers import VARIED_RUN
from jax.sharding import Mesh

import pfedwn_jax
from pfedwn_jax.engine import sharding

pfedwn_jax.use_cpu_devices(4)
TRACED: list[int] = []  # slots per device of every hand-split block traced
COLUMNS = ("target_accuracy", "target_loss", "mean_client_accuracy")


def rows(config: pfedwn_jax.ExperimentConfig, shape: tuple[int, int]) -> dict:
    devices = np.array(jax.devices()[: shape[0] * shape[1]]).reshape(shape)
    result = pfedwn_jax.sweep(
        config, seeds="0-3", mesh=Mesh(devices, ("runs", "slots")), progress=False
    )
    return result.rows


def _spy(own_block):
    def spied(fn, replicated, padded, block):
        TRACED.append(block)
        return own_block(fn, replicated, padded, block)

    return spied


def main(methods: list[str]) -> None:
    assert len(jax.devices()) == 4, jax.devices()
    sharding._own_block = _spy(sharding._own_block)
    config = pfedwn_jax.ExperimentConfig(
        **VARIED_RUN,
        algorithms=tuple(methods),
    )
    split, one = rows(config, (2, 2)), rows(config, (1, 1))
    print("split_blocks", len(TRACED))
    for k in COLUMNS:
        print(k, float(np.max(np.abs(np.asarray(split[k]) - np.asarray(one[k])))))


if __name__ == "__main__":
    main(sys.argv[1:])
