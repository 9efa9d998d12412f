"""Cost per save: `state_store` (orbax-checkpoint) against `experiment.checkpoint` (np.savez).

States measured (each saved `--saves` times per way, one fresh step each; median and min ms):

- `run-default`: the state `pfedwn run` checkpoints every round (default config, pfedwn),
  captured from a 1-round run; its progress JSON as the metadata;
- `W MB`: a `[runs, slots, ...]` float32 state of about W MB (`--sizes`), placed over every
  device with `distributed.shard_runs`, as a sweep would hold it.

Ways: `npz` = `checkpoint.save(dir, progress, state)` (gathers to the host, one atomic file);
`orbax` = `state_store.save(dir, step, state, progress)` (every shard written by its device's
host, temporary directory renamed, the latest 2 steps kept). Also the restore of each.

    python benchmarks/bench_state_store.py [--saves 20] [--sizes 4,40] [--out ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from pfedwn_jax import distributed, state_store
from pfedwn_jax.devices import use_cpu_devices
from pfedwn_jax.experiment import ExperimentConfig, run
from pfedwn_jax.experiment import checkpoint as ckpt
from pfedwn_jax.io import atomic_write_json


def run_state() -> tuple[Any, dict[str, Any], float]:
    """`(state, progress, round_s)` of the default `pfedwn run`'s per-round checkpoint (pfedwn;
    round_s: the median compute seconds of a round, compilation and saves excluded)."""
    captured: dict[str, Any] = {}
    real = ckpt.save

    def capture(directory: Any, progress: dict, state: Any, rows: Any = ()) -> int:
        if state is not None:
            # the runner donates the state to the next round: keep a copy (same sharding)
            captured.update(state=jax.tree.map(lambda x: x.copy(), state), progress=progress)
        return real(directory, progress, state, rows)

    ckpt.save = capture
    try:
        with tempfile.TemporaryDirectory() as d:
            cfg = ExperimentConfig(rounds=6, algorithms=("pfedwn",))
            res = run(cfg, progress=False, checkpoint=Path(d) / "ck")
    finally:
        ckpt.save = real
    round_s = statistics.median(res.methods["pfedwn"]["timings"]["round_s"][1:])
    return captured["state"], captured["progress"], round_s


def sized_state(megabytes: float) -> Any:
    """A `[runs, slots, P]` float32 state of about `megabytes` MB split over every device."""
    runs, slots = 2 * jax.device_count(), 8
    width = max(1, int(megabytes * 1e6 / 4 / runs / slots / 2))
    rng = np.random.default_rng(0)
    tree = {
        "params": rng.normal(size=(runs, slots, width)).astype(np.float32),
        "opt": rng.normal(size=(runs, slots, width)).astype(np.float32),
    }
    return distributed.shard_runs(tree, distributed.make_mesh())


def timed(fn: Any, times: int) -> list[float]:
    """Seconds of `times` calls of `fn(i)`."""
    out = []
    for i in range(times):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def measure(name: str, state: Any, progress: dict, saves: int, workdir: Path) -> dict[str, Any]:
    """Save and restore times of both ways for one state."""
    mb = sum(np.asarray(x).nbytes for x in jax.tree.leaves(state)) / 1e6
    npz_dir, orbax_dir = workdir / f"{name}-npz", workdir / f"{name}-orbax"
    npz = timed(lambda i: ckpt.save(npz_dir, progress, state), saves)
    orb = timed(lambda i: state_store.save(orbax_dir, i + 1, state, progress), saves)
    npz_load = timed(
        lambda i: ckpt.restore_state(state, ckpt.read_state(npz_dir / ckpt.STATE)[1]), 3
    )
    orb_load = timed(lambda i: state_store.restore(orbax_dir, state), 3)
    ms = lambda xs: round(1e3 * statistics.median(xs), 1)
    return {
        "state": name,
        "MB": round(mb, 2),
        "npz_save_ms": ms(npz),
        "orbax_save_ms": ms(orb),
        "npz_save_min_ms": round(1e3 * min(npz), 1),
        "orbax_save_min_ms": round(1e3 * min(orb), 1),
        "ratio": round(statistics.median(orb) / statistics.median(npz), 2),
        "npz_restore_ms": ms(npz_load),
        "orbax_restore_ms": ms(orb_load),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saves", type=int, default=20)
    ap.add_argument("--sizes", default="0.01,4,40", help="MB of the synthetic sharded states")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/bench_state_store.json"))
    args = ap.parse_args(argv)
    use_cpu_devices()
    state, progress, round_s = run_state()
    cases = [("run-default", state, progress)]
    cases += [(f"{mb}MB", sized_state(float(mb)), progress) for mb in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as d:
        rows = [measure(n, s, p, args.saves, Path(d)) for n, s, p in cases]
    head = ("state", "MB", "npz ms", "orbax ms", "ratio", "npz load", "orbax load")
    print("".join(f"{h:>12}" for h in head))
    for r in rows:
        vals = [r[k] for k in ("state", "MB", "npz_save_ms", "orbax_save_ms", "ratio")]
        vals += [r["npz_restore_ms"], r["orbax_restore_ms"]]
        print("".join(f"{v:>12}" for v in vals))
    print(f"a round of the default run (pfedwn, no save): {1e3 * round_s:.0f} ms")
    machine = {"platform": platform.platform(), "jax": jax.__version__, "devices": jax.devices()}
    atomic_write_json(
        args.out,
        {
            "results": rows,
            "round_ms": 1e3 * round_s,
            "machine": json.loads(json.dumps(machine, default=str)),
        },
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
