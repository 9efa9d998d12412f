"""Checkpoint overhead as a share of round time: the old single-file format vs the new one.

One experiment (default: network mode, 21 clients, 60 rounds, FedAvg, the `mlp` model) run
once per way of checkpointing, in one process:

- `none`: no checkpoint;
- `old`: the single-`.npz` format this replaced, reproduced here: every round the whole metrics
  history (`to_jsonable`, JSON) plus the state, written atomically (fsync) to one file, so a
  save grows with the round;
- `new/1`, `new/K`: `pfedwn_jax.experiment.checkpoint` (state replaced, the new rounds' metrics
  appended) every round and every K rounds.

`checkpoint.save` is wrapped (timed; for `old` replaced by the old writer), so save seconds are
exact (for `new`, whose state goes to orbax asynchronously, the time until the host copy is
taken, and the bytes are the metrics rows only; `bench_state_store.py` measures the per-round
overhead side by side); round seconds are the runner's `timings.round_s` (compute, without saves).
Overhead = save seconds / round seconds of the same run, so a busy machine slows both alike.
Prints a table and writes JSON (--out).

    python benchmarks/bench_checkpoint.py [--rounds 60] [--neighbors 20] [--every 5] [--out ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from pfedwn_jax.devices import use_cpu_devices
from pfedwn_jax.experiment import ExperimentConfig, run
from pfedwn_jax.experiment import checkpoint as ckpt
from pfedwn_jax.experiment.results import to_jsonable
from pfedwn_jax.io import atomic_write_json, atomic_write_with

NEW_SAVE = ckpt.save


def old_saver(history: list[dict[str, Any]]):
    """The replaced format's save: the whole history so far plus the state in one `.npz`."""

    def save(
        directory: Path, progress: dict, state: Any, rows: list[dict] = (), writer: Any = None
    ) -> int:
        history.extend(rows)
        path = Path(directory) / "checkpoint.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        everything = to_jsonable({**progress, "history": history})  # as the old writer did
        arrays = {"progress": np.array(json.dumps(everything))}
        if state is not None:
            for i, leaf in enumerate(jax.tree_util.tree_leaves(state)):
                arrays[f"leaf_{i:05d}"] = np.asarray(leaf)
        atomic_write_with(path, lambda f: np.savez(f, **arrays))
        return path.stat().st_size

    return save


def timed(save, log: list[tuple[float, int]]):
    def wrapper(*args: Any) -> int:
        t0 = time.perf_counter()
        written = save(*args)
        log.append((time.perf_counter() - t0, written))
        return written

    return wrapper


def measure(cfg: ExperimentConfig, way: str, every: int, workdir: Path) -> dict[str, Any]:
    """One run of `cfg` checkpointed the `way` given; save and round seconds, bytes."""
    log: list[tuple[float, int]] = []
    ckpt.save = timed(old_saver([]) if way == "old" else NEW_SAVE, log)
    directory = None if way == "none" else workdir / f"{way}{every}"
    try:
        res = run(cfg, progress=False, checkpoint=directory, checkpoint_every=every)
    finally:
        ckpt.save = NEW_SAVE
    round_s = sum(sum(m["timings"]["round_s"]) for m in res.methods.values())
    save_s = sum(s for s, _ in log)
    return {
        "way": way if way == "none" else f"{way}/{every}",
        "saves": len(log),
        "save_s": save_s,
        "round_s": round_s,
        "overhead": save_s / round_s,
        "ms_per_save": 1e3 * save_s / max(len(log), 1),
        "bytes_written": int(sum(b for _, b in log)),
        "bytes_first_last": [log[0][1], log[-2][1]] if len(log) > 1 else [],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--neighbors", type=int, default=20, help="network of neighbors + 1 nodes")
    ap.add_argument("--algorithms", default="fedavg", help="comma-separated methods")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--every", type=int, default=5, help="K of the `new/K` run")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_checkpoint.json"))
    args = ap.parse_args(argv)
    use_cpu_devices()
    cfg = ExperimentConfig(
        mode="network",
        num_neighbors=args.neighbors,
        rounds=args.rounds,
        model=args.model,
        algorithms=tuple(args.algorithms.split(",")),
    )
    ways = [("none", 1), ("old", 1), ("new", 1), ("new", args.every)]
    with tempfile.TemporaryDirectory(
        dir=args.out.parent if args.out.parent.exists() else None
    ) as d:
        rows = [measure(cfg, way, every, Path(d)) for way, every in ways]
    print(f"{cfg.num_clients} clients, network mode, {cfg.rounds} rounds, {args.algorithms}")
    print(
        f"{'way':<8}{'saves':>6}{'save s':>9}{'round s':>9}{'overhead':>10}{'ms/save':>9}{'MB':>9}"
    )
    for r in rows:
        print(
            f"{r['way']:<8}{r['saves']:>6}{r['save_s']:>9.2f}{r['round_s']:>9.2f}"
            f"{100 * r['overhead']:>9.1f}%{r['ms_per_save']:>9.1f}{r['bytes_written'] / 1e6:>9.1f}"
        )
    machine = {"platform": platform.platform(), "jax": jax.__version__, "devices": jax.devices()}
    atomic_write_json(
        args.out,
        {
            "config": cfg.to_dict(),
            "results": rows,
            "machine": json.loads(json.dumps(machine, default=str)),
        },
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
