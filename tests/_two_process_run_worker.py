"""One process of the two-process run test (`tests/test_distributed_run.py`).

    python tests/_two_process_run_worker.py PORT PROCESS_ID NUM_PROCESSES CKPT_DIR OUT_PREFIX

Every process joins the job (`distributed.initialize`) and calls the same `pfedwn_jax.run` of
`CONFIG` with `shards=4`: the 8 slots of one network-mode run split over the 4 devices of both
processes (2 slots a device), checkpointing under the one shared `CKPT_DIR`. "full" runs it
through; "resumed" is stopped after pfedwn's first round (a KeyboardInterrupt raised by the
callback in every process, as a Ctrl-C would), then resumed from its checkpoint. Each process
writes what it got to `OUT_PREFIX{PROCESS_ID}.npz` (`full/...` and `resumed/...`, see
`numbers`); the parent compares them with `reference`, the same run in one process. The full
run has adapted block lengths, with process 1 measuring its rounds as slow (every process
must still call each block with the same length); it also saves its models (`CKPT_DIR/models`,
each process its own shards) and logs to one CSV (`CKPT_DIR/metrics.csv`, process 0 only),
which the parent reads back.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

METHODS = ("fedavg", "pfedwn")
CONFIG = dict(
    mode="network",
    num_neighbors=7,  # 8 nodes, every one a target: 8 slots
    model="logreg",
    algorithms=METHODS,
    rounds=3,
    local_steps=1,
    batch_size=8,
    min_samples=5,
    max_samples_per_client=10,
)
PER_SLOT = ("client_accuracy", "client_loss")
TARGET = ("target_accuracy", "target_loss")


def config() -> Any:
    from pfedwn_jax import ExperimentConfig

    return ExperimentConfig(**CONFIG)


def numbers(result: Any) -> dict[str, np.ndarray]:
    """`method/field` -> the field's per-round values (targets, per-slot metrics and every
    numeric record such as pFedWN's `pi`), plus `network/slot_neighbors`."""
    out = {"network/slot_neighbors": np.asarray(result.network["slot_neighbors"])}
    for name, entry in result.methods.items():
        for field in TARGET + PER_SLOT:
            out[f"{name}/{field}"] = np.asarray(entry[field], np.float64)
        for key, value in entry["records"].items():
            array = np.asarray(value)
            if array.dtype.kind in "fiub":
                out[f"{name}/records/{key}"] = array
    return out


def reference(shards: int = 1) -> dict[str, np.ndarray]:
    """What the workers must produce: the same run in this one process."""
    from pfedwn_jax import run

    return numbers(run(config(), progress=False, shards=shards))


def interrupted_then_resumed(ckpt: Path) -> Any:
    """The run stopped after pfedwn's first round (its state saved), then resumed."""
    from pfedwn_jax import run

    def stop(method: str, rounds_done: int, row: dict) -> None:
        if method == "pfedwn" and rounds_done == 1:
            raise KeyboardInterrupt("stopped after pfedwn's round 1")

    try:
        run(config(), progress=False, shards=4, checkpoint=ckpt, callback=stop)
        raise AssertionError("the run was not interrupted")
    except KeyboardInterrupt:
        pass
    assert (ckpt / "state").is_dir()  # orbax steps (`runner.checkpoint`)
    return run(config(), progress=False, shards=4, checkpoint=ckpt, resume=True)


def check_split() -> str:
    """Assert that `shards=4` splits the 8 slots of a method's state over both processes (this
    process holds 2 slots on each of its 2 devices, the rest lives on the other's); a line."""
    import jax

    from pfedwn_jax.experiment.setup import setup
    from pfedwn_jax.runner.groups import init_states, make_group
    from pfedwn_jax.runner.job import default_mesh

    exp = setup(config())
    mesh = default_mesh([exp], 4)
    state, _ = init_states(make_group([0], [exp], mesh), "fedavg", mesh)
    split = [a for a in jax.tree.leaves(state) if a.shape[1:2] == (8,)]
    assert split and all(not a.is_fully_addressable for a in split)
    rows = sorted({s.data.shape[1] for a in split for s in a.addressable_shards})
    assert rows == [2], rows
    return f"{len(split)} state arrays split, 2 slots per local device"


def main(port: int, process_id: int, num_processes: int, ckpt: str, out: str) -> None:
    import jax

    from pfedwn_jax import distributed, run

    distributed.initialize(f"localhost:{port}", num_processes, process_id)
    print(f"process {process_id}: devices {len(jax.devices())} local {jax.local_device_count()}")
    print(f"process {process_id}: {check_split()}")
    from pfedwn_jax.runner.execute import Blocks
    from pfedwn_jax.runner.writers import CSVWriter

    if process_id == 1:  # this process finds rounds slow: it would ask for shorter blocks
        observe = Blocks.observe
        Blocks.observe = lambda self, n, seconds: observe(self, n, seconds * 1e6)  # type: ignore[method-assign]
    full = run(
        config(), progress=False, shards=4, checkpoint=Path(ckpt) / "full",
        save_models=Path(ckpt) / "models", writers=[CSVWriter(Path(ckpt) / "metrics.csv")],
    )  # fmt: skip
    resumed = interrupted_then_resumed(Path(ckpt) / "resumed")
    arrays = {f"full/{k}": v for k, v in numbers(full).items()}
    arrays.update({f"resumed/{k}": v for k, v in numbers(resumed).items()})
    np.savez(f"{out}{process_id}.npz", **arrays)
    timings = {m: e["timings"] for m, e in full.methods.items()}
    print(f"process {process_id}: done; timings {timings}")


if __name__ == "__main__":
    port, pid, count, ckpt_dir, out_prefix = sys.argv[1:]
    main(int(port), int(pid), int(count), ckpt_dir, out_prefix)
