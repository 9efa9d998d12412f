"""Program shapes: single-mode sample counts are bucketed so seeds share a compiled program."""

from __future__ import annotations

import numpy as np
from helpers import TINY_RUN

import pfedwn_jax
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.setup import setup
from pfedwn_jax.runner.batch import Shapes, bucket


def test_bucket_rounds_up_by_less_than_half_and_is_monotone():
    sizes = [bucket(n) for n in range(0, 5000)]
    assert sizes[:5] == [0, 1, 2, 3, 4]
    assert all(n <= b < 1.5 * n for n, b in enumerate(sizes) if n > 4)
    assert all(np.diff(sizes) >= 0)
    assert (bucket(1199), bucket(1038), bucket(1306), bucket(400)) == (1536, 1536, 1536, 512)


def test_single_mode_is_bucketed_network_mode_exact():
    single = setup(ExperimentConfig(**TINY_RUN, seed=0))
    assert Shapes([single]).train == bucket(single.data.train.max_samples)
    network = setup(ExperimentConfig(**TINY_RUN, seed=0, mode="network"))
    assert Shapes([network]).train == network.data.train.max_samples


def test_a_loop_over_seeds_compiles_once():
    compile_s = []
    for seed in (0, 1):
        config = ExperimentConfig(**TINY_RUN, seed=seed, algorithms=("fedavg",))
        compile_s.append(pfedwn_jax.run(config, progress=False).methods["fedavg"]["timings"])
    first, second = (t["compile_s"] for t in compile_s)
    assert second < 0.2 * first  # the second seed's program comes from the jit cache
