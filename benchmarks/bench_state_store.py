"""Cost of checkpoints: a run's per-round overhead, and per save `state_store` (orbax) against
the single `.npz` that `experiment.checkpoint` wrote before it moved to orbax.

Per round (`--rounds`, default config, pfedwn): the wall seconds between successive rounds
(`run`'s callback, which runs after the round's save) with no checkpoint, with
`checkpoint_every=1` as `run` saves now (`async/1`: orbax, the save overlapping the next round)
and with synchronous orbax saves (`sync/1`), the ways interleaved `--repeats` times in one
process; the median over rounds 2.. of each run, then the median over the repeats.

States measured (each saved `--saves` times per way, one fresh step each; median and min ms):

- `run-default`: the state `pfedwn run` checkpoints every round (default config, pfedwn),
  captured from a 1-round run; its progress JSON as the metadata;
- `W MB`: a `[runs, slots, ...]` float32 state of about W MB (`--sizes`), placed over every
  device with `distributed.shard_runs`, as a sweep would hold it.

Ways: `npz` = the earlier `checkpoint.save` (gathers to the host, one atomic `.npz`; kept here
as `npz_save`); `orbax` = `state_store.save(dir, step, state, progress)` (every shard written by
its device's host, temporary directory renamed, the latest 2 steps kept). Also the restore of
each.

    python benchmarks/bench_state_store.py [--saves 20] [--sizes 4,40] [--rounds 20] [--out ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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
from pfedwn_jax.io import atomic_write_json, atomic_write_with


def run_state() -> tuple[Any, dict[str, Any], float]:
    """`(state, progress, round_s)` of the default `pfedwn run`'s per-round checkpoint (pfedwn;
    round_s: the median compute seconds of a round, compilation and saves excluded)."""
    captured: dict[str, Any] = {}
    real = ckpt.save

    def capture(directory: Any, progress: dict, state: Any, rows: Any = (), w: Any = None) -> int:
        if state is not None:
            # the runner donates the state to the next round: keep a copy (same sharding)
            captured.update(state=jax.tree.map(lambda x: x.copy(), state), progress=progress)
        return real(directory, progress, state, rows, w)

    ckpt.save = capture
    try:
        with tempfile.TemporaryDirectory() as d:
            cfg = ExperimentConfig(rounds=6, algorithms=("pfedwn",))
            res = run(cfg, progress=False, checkpoint=Path(d) / "ck")
    finally:
        ckpt.save = real
    round_s = statistics.median(res.methods["pfedwn"]["timings"]["round_s"][1:])
    return captured["state"], captured["progress"], round_s


def round_gaps(way: str, rounds: int, workdir: Path) -> float:
    """Median wall seconds between successive rounds (2..) of a default pfedwn run checkpointed
    the `way` given (`none`, `async/K`, `sync/K`)."""
    stamps: list[float] = []
    kind, _, every = way.partition("/")
    directory = None if kind == "none" else workdir / way.replace("/", "-")
    real = ckpt.writer
    if kind == "sync":  # no writer: `checkpoint.save` returns when the step is on disk
        ckpt.writer = lambda d: contextlib.nullcontext()
    try:
        cfg = ExperimentConfig(rounds=rounds, algorithms=("pfedwn",))
        run(
            cfg,
            progress=False,
            checkpoint=directory,
            checkpoint_every=int(every or 1),
            callback=lambda *a: stamps.append(time.perf_counter()),
        )
    finally:
        ckpt.writer = real
    return statistics.median(np.diff(stamps[1:]))


def overhead(rounds: int, repeats: int, workdir: Path) -> list[dict[str, Any]]:
    """Per-round seconds of each way, the ways interleaved `repeats` times."""
    ways = ("none", "async/1", "sync/1", "async/5")
    gaps: dict[str, list[float]] = {w: [] for w in ways}
    for _ in range(repeats):
        for way in ways:
            gaps[way].append(round_gaps(way, rounds, workdir))
    base = statistics.median(gaps["none"])
    return [
        {
            "way": way,
            "round_ms": round(1e3 * statistics.median(g), 1),
            "runs_ms": [round(1e3 * x, 1) for x in g],
            "overhead": round(statistics.median(g) / base - 1, 3),
        }
        for way, g in gaps.items()
    ]


def npz_save(directory: Path, progress: dict, state: Any) -> None:
    """The earlier `checkpoint.save`: every leaf gathered to the host, one atomic `.npz`."""
    leaves = distributed.gather_to_host(jax.tree_util.tree_leaves(state))
    arrays = {"progress": np.array(json.dumps(progress))}
    arrays.update({f"leaf_{i:05d}": leaf for i, leaf in enumerate(leaves)})
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_with(directory / "state.npz", lambda f: np.savez(f, **arrays))


def npz_restore(directory: Path, template: Any) -> Any:
    """The earlier restore: the `.npz` leaves into `template`'s structure."""
    with np.load(directory / "state.npz", allow_pickle=False) as z:
        leaves = [jax.numpy.asarray(z[k]) for k in sorted(z.files) if k != "progress"]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), leaves)


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
    npz = timed(lambda i: npz_save(npz_dir, progress, state), saves)
    orb = timed(lambda i: state_store.save(orbax_dir, i + 1, state, progress), saves)
    npz_load = timed(lambda i: npz_restore(npz_dir, state), 3)
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
    ap.add_argument("--rounds", type=int, default=20, help="rounds of each overhead run")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs of each way")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/bench_state_store.json"))
    args = ap.parse_args(argv)
    use_cpu_devices()
    state, progress, round_s = run_state()
    cases = [("run-default", state, progress)]
    cases += [(f"{mb}MB", sized_state(float(mb)), progress) for mb in args.sizes.split(",")]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        per_round = overhead(args.rounds, args.repeats, Path(d))
        rows = [measure(n, s, p, args.saves, Path(d)) for n, s, p in cases]
    load_after = os.getloadavg()
    print(f"per round, default pfedwn run, {args.rounds} rounds x {args.repeats} interleaved:")
    for r in per_round:
        print(f"{r['way']:>10} {r['round_ms']:>8} ms  {100 * r['overhead']:+.1f}%  {r['runs_ms']}")
    head = ("state", "MB", "npz ms", "orbax ms", "ratio", "npz load", "orbax load")
    print("".join(f"{h:>12}" for h in head))
    for r in rows:
        vals = [r[k] for k in ("state", "MB", "npz_save_ms", "orbax_save_ms", "ratio")]
        vals += [r["npz_restore_ms"], r["orbax_restore_ms"]]
        print("".join(f"{v:>12}" for v in vals))
    print(f"a round of the default run (pfedwn, no save): {1e3 * round_s:.0f} ms")
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}")
    machine = {"platform": platform.platform(), "jax": jax.__version__, "devices": jax.devices()}
    atomic_write_json(
        args.out,
        {
            "results": rows,
            "per_round": per_round,
            "round_ms": 1e3 * round_s,
            "loadavg_before_after": [load_before, load_after],
            "machine": json.loads(json.dumps(machine, default=str)),
        },
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
