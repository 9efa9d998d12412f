"""Seconds per round of a network (D-PSGD, the MLP) without the per-round diagnostics, with the
consensus distance only, and with the spectral gap too (`SLOT_METRICS` entries
`consensus_deviation`, `mixing_gap`): each variant jitted, one warm-up round, three timed.

    python benchmarks/bench_diagnostics.py [NODES]      # default 1,000 nodes

Prints the 1-minute load average first: on a shared machine the spread between rounds is
larger than the diagnostics' cost.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_scaling import config_of, experiment

from pfedwn_jax.algorithms import get_algorithm, make_hparams
from pfedwn_jax.results import metrics
from pfedwn_jax.runner.step import init_state, round_step

DIAGNOSTICS = ("consensus_deviation", "mixing_gap")


def seconds_per_round(alg, hp, ctx, evals, rounds: int = 3) -> tuple[list[float], dict]:
    step = jax.jit(lambda st, key: round_step(alg, hp, st, key, ctx, evals))
    state = init_state(alg, hp, jax.random.PRNGKey(0), ctx)
    state, out = step(state, jax.random.PRNGKey(1))
    jax.block_until_ready(out)
    times = []
    for r in range(rounds):
        start = time.perf_counter()
        state, out = step(state, jax.random.PRNGKey(2 + r))
        jax.block_until_ready(out)
        times.append(time.perf_counter() - start)
    return times, {k: float(np.mean(out.metrics[k])) for k in DIAGNOSTICS if k in out.metrics}


def main() -> None:
    nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    exp = experiment(config_of(nodes, "mlp", "dpsgd", 1), nodes)
    ctx = jax.device_put(exp.ctx)
    alg = get_algorithm("dpsgd")
    evals = (jax.device_put(exp.data.test), None)
    full = dict(metrics.SLOT_METRICS)
    cases = {
        "without": [k for k in full if k not in DIAGNOSTICS],
        "consensus only": [k for k in full if k != "mixing_gap"],
        "with both": list(full),
    }
    print(f"load {Path('/proc/loadavg').read_text().split()[0]}, S {ctx.num_slots}")
    try:
        for name, keep in cases.items():
            metrics.SLOT_METRICS.clear()
            metrics.SLOT_METRICS.update({k: full[k] for k in keep})
            times, values = seconds_per_round(alg, make_hparams(alg), ctx, evals)
            print(
                f"{name}: {[round(t, 3) for t in times]} s, median {np.median(times):.3f}, {values}"
            )
    finally:
        metrics.SLOT_METRICS.clear()
        metrics.SLOT_METRICS.update(full)


if __name__ == "__main__":
    main()
