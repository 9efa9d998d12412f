"""How the slots of a federation are executed: all at once, one by one, or in chunks.

- "vmap": one vectorized program over all S slots (best on accelerators while memory lasts).
- "map": slots one after another inside one compiled loop (`lax.map`-style); each slot skips
  its own trailing empty steps.
- "chunked": chunks of `chunk_size` vmapped slots, one chunk after another; slots are sorted by
  data size first so a chunk's trailing empty steps are skipped together, and memory holds only
  one chunk's temporaries.
- "auto": "map" on a CPU (measured fastest, see `benchmarks/RESULTS.md`); "chunked" with
  `ACCELERATOR_CHUNK` slots per chunk elsewhere (a memory-bounded default, not a measurement).
"""

from __future__ import annotations

import jax

from pfedwn_jax._checks import check_choice, check_int

STRATEGIES = ("auto", "vmap", "map", "chunked")

# "auto" on a CPU is "map", one slot at a time per device (engine.sharding runs one device per
# core in parallel). Vmapping slots brings no arithmetic gain on XLA:CPU (per-slot matmuls stay
# per-slot matmuls): with equal-size clients map, chunked and vmap ran at the same speed for the
# MLP, and vmap/chunked were 10-25% slower for the CNN; with unequal clients vmap also pays the
# largest client's step count, while map skips each slot's own padded steps
# (benchmarks/bench_engine.py).
# "auto" elsewhere (GPU, TPU) is "chunked" with wide chunks, bounded by memory: the CNN needs
# about 29 MiB of temporaries per slot at batch 32, so 256 slots hold about 7 GiB. Not yet
# measured on an accelerator.
ACCELERATOR_CHUNK = 256
# Chunk size of an explicit "chunked" without `chunk_size`.
DEFAULT_CHUNK = 16


def resolve_strategy(strategy: str, chunk_size: int | None, num_slots: int) -> tuple[str, int]:
    """Validate and resolve `(strategy, chunk_size)` to a concrete choice for `num_slots` slots.

    Returns `("vmap", S)`, `("map", 1)` or `("chunked", C)` with `1 <= C <= S`.
    """
    check_choice("strategy", strategy, STRATEGIES)
    if chunk_size is not None:
        chunk_size = check_int("chunk_size", chunk_size, 1)
    if strategy == "auto" and jax.default_backend() == "cpu":
        strategy = "map"
    elif strategy == "auto":
        strategy, chunk_size = "chunked", chunk_size or ACCELERATOR_CHUNK
    if strategy == "vmap":
        return "vmap", num_slots
    if strategy == "map":
        return "map", 1
    chunk = min(chunk_size or DEFAULT_CHUNK, num_slots)
    if chunk >= num_slots:
        return "vmap", num_slots
    return "chunked", chunk
