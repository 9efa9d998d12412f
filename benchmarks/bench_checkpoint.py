"""What checkpoints cost a run: wall seconds per round with and without them, side by side.

The default config (single mode, MLP, embedded MNIST) with `--method` (default pFedWN) for
`--rounds` rounds, one round per block (`block=1`: a save can follow every round), in one
process, the ways interleaved `--repeats` times so the machine's drift hits them alike:

- `none`: no checkpoint;
- `every 1`: `checkpoint_every=1`, a committed orbax step after every round (the Python
  API's default);
- `every 5`: `checkpoint_every=5` (the CLI's default).

Each run's figure is its execution seconds per round: the run's wall time minus its setup and
compile seconds (`Result.timings`), divided by the rounds; block files and orbax commits
happen between blocks, so they are in it. Reported: the median over the repeats of each way
and its ratio to `none`, with the load average.

    python benchmarks/bench_checkpoint.py [--rounds 20] [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench_engine import machine, write_json

WAYS = {"none": None, "every 1": 1, "every 5": 5}


def one_run(config, every: int | None) -> float:
    """Execution seconds per round of one `run` (setup and compilation taken out)."""
    import pfedwn_jax

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        res = pfedwn_jax.run(
            config,
            progress=False,
            block=1,
            checkpoint=None if every is None else Path(tmp) / "ck",
            checkpoint_every=every or 1,
        )
        wall = time.perf_counter() - t0
    busy = wall - res.timings["setup_s"] - res.timings["compile_s"]
    return busy / config.rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="pfedwn")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import pfedwn_jax

    pfedwn_jax.use_cpu_devices()
    config = pfedwn_jax.ExperimentConfig(rounds=args.rounds, algorithms=(args.method,))
    one_run(config.replace(rounds=2), None)  # warm-up: the process's one-off costs
    per: dict[str, list[float]] = {w: [] for w in WAYS}
    load0 = os.getloadavg()
    for _ in range(args.repeats):
        for way, every in WAYS.items():
            per[way].append(one_run(config, every))
    med = {w: statistics.median(v) for w, v in per.items()}
    rows = [
        {"way": w, "ms_per_round": 1e3 * med[w], "vs_none": med[w] / med["none"], "all_s": v}
        for w, v in per.items()
    ]
    for r in rows:
        print(f"{r['way']:>8}: {r['ms_per_round']:7.1f} ms a round, {r['vs_none']:.2f}x none")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M")
    out = args.out or Path(__file__).parent / "results" / f"bench_checkpoint_{stamp}.json"
    write_json(out, {"settings": vars(args) | {"out": str(out)}, "machine": machine(),
                     "load": [load0, os.getloadavg()], "rows": rows})  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
