"""One process of the two-process sweep test (`tests/test_distributed.py`).

    python tests/_two_process_sweep_worker.py PORT PROCESS_ID NUM_PROCESSES CKPT_DIR OUT_PREFIX

Every process joins the job (`distributed.initialize`), builds the same global 4-device mesh
(`distributed.make_mesh()`: 2 processes x 2 CPU devices on the run axis) and calls the same
`pfedwn_jax.sweep` of `CONFIG` (every process sets up every run; the runs are split over the
mesh) three times, checkpointing to directories under the one shared `CKPT_DIR`: "full" runs it
through; "resumed" is stopped mid-way through pfedwn's rounds (a KeyboardInterrupt in every
process, as a Ctrl-C would), then resumed from its checkpoint (the sharded state restored from
both processes' files) in the same processes, so no second compile. Each process writes the
rows it got to `OUT_PREFIX{PROCESS_ID}.npz` (`full_*` and `resumed_*`); the parent compares them
with `reference`, the same sweep on one process.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

SEEDS = (0, 1, 2, 3)
METHODS = ("local", "pfedwn")
CONFIG = dict(model="logreg", num_neighbors=3, rounds=2, batch_size=32, gamma_th=1.0, eps=0.5)
COMPARED = ("run", "seed", "method", "round", "target_accuracy", "target_loss")
COMPARED += ("mean_client_accuracy", "diverged")


def run_sweep(mesh: Any = None, **kwargs: Any) -> Any:
    """The sweep under test: `CONFIG` x `METHODS` x `SEEDS`, one round a block."""
    from pfedwn_jax import ExperimentConfig, sweep

    config = ExperimentConfig(**CONFIG, algorithms=METHODS)
    return sweep(config, seeds=SEEDS, block=1, progress=False, mesh=mesh, **kwargs)


def reference() -> dict[str, np.ndarray]:
    """What the workers must produce: the same sweep on this process's own devices."""
    rows = run_sweep().rows
    return {k: np.asarray(rows[k]) for k in COMPARED}


def stop_at(block: int) -> Any:
    """Make the sweep raise KeyboardInterrupt when its table is handed the `block`-th block of
    one run; returns the original `Table.add_block` (to put back)."""
    from pfedwn_jax.results.table import Table

    add_block, calls = Table.add_block, []

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> int:
        calls.append(1)
        if len(calls) == block:
            raise KeyboardInterrupt(f"stopped at block {block}")
        return add_block(self, *args, **kwargs)

    Table.add_block = interrupted
    return add_block


def interrupted_then_resumed(mesh: Any, ckpt: Path) -> Any:
    """The sweep stopped in pfedwn's 2nd round (after pfedwn's 1st round's state was saved:
    local's 2 rounds and pfedwn's first of 4 runs came before), then resumed from `ckpt`."""
    from pfedwn_jax import state_store
    from pfedwn_jax.results.table import Table

    add_block = stop_at(2 * len(SEEDS) + len(SEEDS) + 1)
    try:
        run_sweep(mesh, checkpoint=ckpt)
        raise AssertionError("the sweep was not interrupted")
    except KeyboardInterrupt:
        Table.add_block = add_block
    step = state_store.latest(ckpt / "state")
    shards = sorted(p.name for p in (ckpt / "state" / str(step) / "state").glob("ocdbt.process_*"))
    assert shards == ["ocdbt.process_0", "ocdbt.process_1"], shards  # each wrote its runs
    return run_sweep(mesh, checkpoint=ckpt, resume=True)


def main(port: int, process_id: int, num_processes: int, ckpt: str, out: str) -> None:
    import jax

    from pfedwn_jax import distributed

    distributed.initialize(f"localhost:{port}", num_processes, process_id)
    mesh = distributed.make_mesh()
    print(f"process {process_id}: devices {len(jax.devices())} local {jax.local_device_count()}")
    full = run_sweep(mesh, checkpoint=Path(ckpt) / "full")
    resumed = interrupted_then_resumed(mesh, Path(ckpt) / "resumed")
    rows = {f"full_{k}": np.asarray(full.rows[k]) for k in COMPARED}
    rows.update({f"resumed_{k}": np.asarray(resumed.rows[k]) for k in COMPARED})
    np.savez(f"{out}{process_id}.npz", **rows)
    print(f"process {process_id}: {len(full)} rows, programs {full.meta['programs']}")


if __name__ == "__main__":
    port, pid, count, ckpt_dir, out_prefix = sys.argv[1:]
    main(int(port), int(pid), int(count), ckpt_dir, out_prefix)
