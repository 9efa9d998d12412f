"""One process of the two-process test (`tests/test_distributed.py`), and its toy program.

    python tests/_two_process_worker.py PORT PROCESS_ID NUM_PROCESSES CKPT_DIR OUT_FILE

Every process joins the job (`distributed.initialize`), builds the same global
`("runs", "slots")` mesh, places the same `[runs, slots, ...]` state (`shard_runs`), runs
`BLOCKS` jitted blocks of `program`, saving after each with `state_store` to the one shared
`CKPT_DIR`, restores the latest step onto the same shardings, runs one more block from it, and
gathers the results; process 0 writes them to `OUT_FILE` (`.npz`). The parent compares them with
`reference`, the same blocks on one process without a mesh.

To test the sweep instead of the toy: replace `make_inputs` (the initial state and per-run
hyperparameters, identical on every process) and `program` (one block of rounds of all runs);
the rest of the file only moves arrays around.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

RUNS = 8  # the run axis, split over the mesh's "runs" axis
SLOTS = 4  # the slot axis, split over the mesh's "slots" axis
DIM = 3
MESH = (2, 2)  # runs x slots devices: 2 processes x 2 CPU devices
BLOCKS = 2  # blocks run (and saved) before the restore; one more runs after it
ROUNDS = 3  # rounds per block (a lax.scan inside the compiled block)


# --------------------------------------------------------------------------- the toy program
# (replace these two functions by the sweep's)
def make_inputs(runs: int = RUNS) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """`(state, hyper)`: state `{"w": [runs, SLOTS, DIM], "round": [runs]}` and per-run
    hyperparameters `{"lr": [runs], "target": [runs, SLOTS, DIM]}`, the same in every process."""
    rng = np.random.default_rng(0)
    state = {
        "w": rng.normal(size=(runs, SLOTS, DIM)).astype(np.float32),
        "round": np.zeros(runs, np.int32),
    }
    hyper = {
        "lr": np.linspace(0.05, 0.4, runs, dtype=np.float32),
        "target": rng.normal(size=(runs, SLOTS, DIM)).astype(np.float32),
    }
    return state, hyper


def one_run(state: dict[str, Any], hyper: dict[str, Any]) -> tuple[dict[str, Any], jax.Array]:
    """`ROUNDS` rounds of one run: a gradient step of every slot towards its target, then a
    FedAvg-like mix with the mean over slots (a reduction over the slot axis). Returns the new
    state and the per-round loss `[ROUNDS]`."""

    def round_(w: jax.Array, _: None) -> tuple[jax.Array, jax.Array]:
        loss, grad = jax.value_and_grad(lambda v: jnp.sum((v - hyper["target"]) ** 2))(w)
        w = w - hyper["lr"] * grad
        w = 0.5 * w + 0.5 * jnp.mean(w, axis=0, keepdims=True)
        return w, loss

    w, losses = jax.lax.scan(round_, state["w"], None, length=ROUNDS)
    return {"w": w, "round": state["round"] + ROUNDS}, losses


def program(state: dict[str, Any], hyper: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """One block of all runs (`vmap` of `one_run`) plus a statistic across runs (its mean
    crosses the mesh's "runs" axis, hence processes). Returns `(state, {"loss": [runs, ROUNDS],
    "mean_loss": []})`."""
    state, losses = jax.vmap(one_run)(state, hyper)
    return state, {"loss": losses, "mean_loss": jnp.mean(losses[:, -1])}


# --------------------------------------------------------------------------- the harness
def run_blocks(step_fn: Any, state: Any, hyper: Any, blocks: int) -> tuple[Any, list[Any]]:
    """`blocks` calls of `step_fn`, threading the state; the metrics of each."""
    metrics = []
    for _ in range(blocks):
        state, m = step_fn(state, hyper)
        metrics.append(m)
    return state, metrics


def place(tree: Any, mesh: Any, local: bool = False) -> Any:
    """Every leaf on `mesh`: `[runs]` leaves split over "runs", `[runs, slots, ...]` leaves over
    "runs" and "slots". `local`: each process passes only its runs' rows (`local_runs`)."""
    from pfedwn_jax.distributed import local_runs, shard_runs

    def one(x: np.ndarray) -> jax.Array:
        if local:
            x = x[local_runs(mesh, RUNS)]
        return shard_runs(x, mesh, np.ndim(x) >= 2, local=local, runs=RUNS)

    return jax.tree.map(one, tree)


def reference() -> dict[str, np.ndarray]:
    """What the workers must produce, on one process without a mesh: `BLOCKS + 1` blocks."""
    state, hyper = make_inputs()
    state, metrics = run_blocks(jax.jit(program), state, hyper, BLOCKS + 1)
    return _outputs(state, metrics)


def _outputs(state: Any, metrics: list[Any]) -> dict[str, np.ndarray]:
    """The arrays compared by the test (host numpy, gathered)."""
    from pfedwn_jax.distributed import gather_to_host

    state, metrics = gather_to_host((state, metrics))
    out = {f"state_{k}": v for k, v in state.items()}
    for i, m in enumerate(metrics):
        out.update({f"block{i}_{k}": v for k, v in m.items()})
    return out


def main(port: int, process_id: int, num_processes: int, ckpt: str, out_file: str) -> None:
    from pfedwn_jax import distributed, state_store

    distributed.initialize(f"localhost:{port}", num_processes, process_id)
    distributed.initialize(f"localhost:{port}", num_processes, process_id)  # idempotent
    try:
        distributed.initialize(f"localhost:{port + 1}", num_processes, process_id)
        raise AssertionError("re-initialize with another coordinator did not raise")
    except ValueError as e:
        assert "already initialized" in str(e), e
    mesh = distributed.make_mesh(*MESH)
    assert distributed.local_runs(mesh, RUNS) == slice(4 * process_id, 4 * process_id + 4)
    state, hyper = make_inputs()
    state, hyper = place(state, mesh), place(hyper, mesh, local=True)
    step_fn = jax.jit(program)
    metrics = []
    for block in range(1, BLOCKS + 1):
        state, m = step_fn(state, hyper)
        metrics.append(m)
        state_store.save(ckpt, block, state, {"block": block, "processes": num_processes})
    restored, meta = state_store.restore(ckpt, state)
    assert meta == {"block": BLOCKS, "processes": num_processes}, meta
    for leaf, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        assert leaf.sharding == want.sharding, (leaf.sharding, want.sharding)
    state, m = step_fn(restored, hyper)
    metrics.append(m)
    outputs = _outputs(state, metrics)
    if distributed.is_writer():
        np.savez(out_file, **outputs)
    print(f"process {process_id}: devices {len(jax.devices())} local {jax.local_device_count()}")


if __name__ == "__main__":
    port, pid, count, ckpt_dir, out = sys.argv[1:]
    main(int(port), int(pid), int(count), ckpt_dir, out)
