"""The robustness study of one tree against another's, side by side on this machine.

`scripts/robustness.py --preset small` (60 distinct runs: gamma_th, eps, link loss and node
speed, with and without selection, 3 seeds, six methods) in a fresh process from this
checkout and from `--before` (another checkout of the project, e.g. a `git worktree` of an
older commit), alternately, `--repeats` times. Each row: the process's wall seconds (Python
start to the files written), the load average before it, and the programs the study
compiled (`robustness.json` `meta.programs`, one per shape group; each method compiles its
own). Ratio = before / this, per pair (the two runs of a pair follow each other).

    python benchmarks/bench_robustness.py --before ../before [--repeats 2] [--only gamma]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench_engine import machine, write_json

HERE = Path(__file__).resolve().parents[1]


def one(tree: Path, out: Path, only: str | None) -> dict:
    """Wall seconds and programs of one `robustness.py --preset small` process on `tree`."""
    cmd = [sys.executable, str(tree / "scripts" / "robustness.py"), "--preset", "small"]
    cmd += ["--out", str(out)] + (["--only", only] if only else [])
    env = {**os.environ, "PYTHONPATH": str(tree)}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=tree)
    wall = time.perf_counter() - t0
    meta = json.loads((out / "robustness.json").read_text())["meta"]
    return {"wall_s": wall, "load": load, "programs": meta.get("programs")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="the other checkout's root directory")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--only", default=None, help="axes, e.g. gamma,speed (default: all)")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/...)")
    args = p.parse_args(argv)
    before = Path(args.before).resolve()
    if not (before / "scripts" / "robustness.py").is_file():
        p.error(f"--before {args.before!r}: no scripts/robustness.py there; give a checkout")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            pair = {}
            for name, tree in (("before", before), ("this", HERE)):
                pair[name] = one(tree, Path(tmp) / f"{rep}-{name}", args.only)
                row = pair[name]
                print(f"{rep} {name:6s} wall {row['wall_s']:6.1f} s  programs "
                      f"{row['programs']}  load {row['load']:.1f}", flush=True)  # fmt: skip
            ratio = pair["before"]["wall_s"] / pair["this"]["wall_s"]
            rows.append({"repeat": rep, **pair, "ratio": ratio})
            print(f"{rep} before / this: {ratio:.2f}x", flush=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M")
    out = args.out or str(HERE / f"benchmarks/results/bench_robustness_{stamp}.json")
    write_json(out, {"settings": vars(args), "machine": machine(), "rows": rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
