"""The persistent compilation cache: a study run twice, each time in a fresh process.

`pfedwn --compile-cache DIR sweep --seeds 0-15 --rounds 10 --algorithms pfedwn` (the default
config otherwise), three processes one after another:

- `no cache`: without the cache (what every process paid before);
- `first`: with an empty cache directory (compiles, and writes the programs);
- `second`: the same command again (reads the programs instead of compiling them).

Each row is the process's wall seconds (Python start, imports, data, set-up, compile and the
rounds), and the compile seconds the sweep reports (`meta.timings.compile_s` of
`sweep.json`). Repeated `--repeats` times with a new cache directory each time.

    python benchmarks/bench_compile_cache.py [--seeds 0-15] [--repeats 2] [--out FILE]
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


def one(cache: str | None, out: Path, seeds: str, rounds: int) -> dict:
    """Wall and compile seconds of one `pfedwn sweep` process (`cache` None: no cache)."""
    flags = [] if cache is None else ["--compile-cache", cache]
    cmd = [sys.executable, "-m", "pfedwn_jax", *flags, "sweep", "--seeds", seeds]
    cmd += ["--rounds", str(rounds), "--algorithms", "pfedwn", "--out", str(out)]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    meta = json.loads((out / "sweep.json").read_text())["meta"]
    return {"wall_s": wall, "compile_s": meta["timings"]["compile_s"], "load": load}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-15")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/...)")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            cache = str(Path(tmp) / f"xla{rep}")
            for way, directory in (("no cache", None), ("first", cache), ("second", cache)):
                row = one(directory, Path(tmp) / f"{rep}-{way}", args.seeds, args.rounds)
                rows.append({"repeat": rep, "way": way, **row})
                print(
                    f"{rep} {way:9s} wall {row['wall_s']:6.1f} s  compile "
                    f"{row['compile_s']:6.1f} s  load {row['load']:.1f}",
                    flush=True,
                )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M")
    out = args.out or f"benchmarks/results/bench_compile_cache_{stamp}.json"
    write_json(out, {"settings": vars(args), "machine": machine(), "rows": rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
