"""Time of the round's cost accounting (`wireless.cost.round_cost`) for a large network.

All slots' links at once, as inside a round: S slots, K - 1 listed neighbors each (random),
ARQ retries and a deadline, the MLP's payload, lognormal device speeds. Compile excluded;
the median of --repeats calls (each on a new key), for the parallel and serial reception.
Compare with a round's time of the same network (benchmarks/RESULTS.md, large networks).

    python benchmarks/bench_cost.py [--slots 10000] [--k 11] [--repeats 20]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax.wireless import ChannelParams
from pfedwn_jax.wireless.compute import draw_devices
from pfedwn_jax.wireless.cost import CostParams, CostSetup, make_cost_setup, round_cost

MLP_PARAMS, MLP_FLOPS = 199_210, 8.8e5  # the MLP on MNIST (experiment.cost_setup.model_costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=10_000)
    parser.add_argument("--k", type=int, default=11)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    s, k = args.slots, args.k
    rng = np.random.default_rng(0)
    own = np.arange(s)[:, None]
    nbr = jnp.asarray(np.concatenate([own, rng.integers(0, s, (s, k - 1))], 1), jnp.int32)
    listed = jnp.ones((s, k), bool)
    perr = jnp.asarray(rng.uniform(0.0, 0.3, (s, k)), jnp.float32)
    received = jnp.asarray(rng.uniform(size=(s, k)) >= np.asarray(perr))
    devices = draw_devices(0, s, "lognormal", ["smartphone"])
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {jax.devices()}")
    for reception in ("parallel", "serial"):
        params = CostParams(reception=reception, retries=3, deadline_s=0.5)
        setup = make_cost_setup(params, MLP_PARAMS * 32, devices, MLP_FLOPS, jnp.full(s, 600), 1)
        median = _median_s(setup, (nbr, listed, received, perr), args.repeats)
        print(f"{reception:8s} {s} slots x {k}: median {median * 1e3:.2f} ms a round")


def _median_s(setup: CostSetup, links: tuple, repeats: int) -> float:
    """Median seconds of one `round_cost` call (compiled first, a new key each call)."""

    def cost(key: jax.Array, setup: CostSetup, *links: jax.Array) -> Any:
        return round_cost(key, setup, ChannelParams(), 10.0, *links)

    fn = jax.jit(cost)
    jax.block_until_ready(fn(jax.random.key(0), setup, *links))
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(jax.random.key(i + 1), setup, *links))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


if __name__ == "__main__":
    main()
