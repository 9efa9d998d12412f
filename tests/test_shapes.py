"""Program shapes: single-mode sample counts are bucketed so seeds share a compiled program."""

from __future__ import annotations

import numpy as np
from helpers import TINY_RUN

import pfedwn_jax
from pfedwn_jax.data import ClientData
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.setup import setup
from pfedwn_jax.runner.batch import Shapes, bucket, pad_client_data, stack_data


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


def test_stack_data_pads_each_run_into_the_stack_and_keeps_one_partition_once():
    """Runs' data splits of different sizes are the stack of each padded on its own (ghost
    client and samples zero, masked); the same split in every run is kept once."""
    a, b = (setup(ExperimentConfig(**TINY_RUN, seed=s)).data.train for s in (0, 1))
    clients, samples = max(a.num_clients, b.num_clients) + 1, 2 * max(a.max_samples, b.max_samples)
    stacked, axes = stack_data([a, b], clients, samples)
    assert axes == ClientData(0, 0, 0, 0)
    for r, split in enumerate((a, b)):
        alone = pad_client_data(split, clients, samples)
        for got, want in zip(stacked, alone, strict=True):
            np.testing.assert_array_equal(got[r], want)
    once, axes = stack_data([a, a, a], clients, samples)
    assert axes == ClientData(None, None, None, None) and once.x.shape[:2] == (clients, samples)
    assert stack_data([None, None], clients, samples) == (None, None)
