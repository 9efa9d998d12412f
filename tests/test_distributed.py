"""The run mesh (`pfedwn_jax.distributed`) and sharded checkpoints (`pfedwn_jax.state_store`).

Single process on the suite's 2 CPU devices: mesh shapes and errors, a jitted vmap over a
`[runs, ...]` state split over the mesh against the same program unsplit, save/restore keeping
values and shardings, a crash during a save. Then two real processes on localhost (JAX's CPU
collectives over gloo) running the toy program of `tests/_two_process_worker.py` on one
global mesh, saving to and restoring from one directory, against a single-process run.
"""

from __future__ import annotations

from pathlib import Path

import _two_process_sweep_worker as sweep_worker
import _two_process_worker as worker
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from processes import run_two_processes

from pfedwn_jax import distributed, state_store

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- mesh
def test_make_mesh_shapes():
    assert jax.device_count() == 2  # tests/conftest.py
    assert dict(distributed.make_mesh().shape) == {"runs": 2, "slots": 1}
    assert dict(distributed.make_mesh(slots=2).shape) == {"runs": 1, "slots": 2}
    mesh = distributed.make_mesh(1, 1, devices=jax.devices()[1:])
    assert mesh.devices.tolist() == [[jax.devices()[1]]]
    assert mesh.axis_names == ("runs", "slots")


@pytest.mark.parametrize(
    ("runs", "slots", "match"),
    [
        (3, 1, r"runs=3 x slots=1 = 3 devices, but there are 2"),
        (None, 3, r"slots=3 does not divide the 2 device"),
        (0, 1, r"runs must be in \[1, inf\); got 0"),
        (2, 0, r"slots must be in \[1, inf\); got 0"),
    ],
)
def test_make_mesh_errors(runs, slots, match):
    with pytest.raises(ValueError, match=match):
        distributed.make_mesh(runs, slots)


def test_shard_runs_places_and_checks():
    mesh = distributed.make_mesh()
    tree = {"w": np.arange(24.0).reshape(4, 3, 2), "k": np.arange(4)}
    placed = distributed.shard_runs(tree, mesh)
    assert placed["w"].sharding == NamedSharding(mesh, P("runs"))
    # rows 0-1 on device 0, rows 2-3 on device 1
    rows = {s.device.id: np.asarray(s.data)[:, 0, 0] for s in placed["w"].addressable_shards}
    np.testing.assert_array_equal(rows[jax.devices()[0].id], [0.0, 6.0])
    np.testing.assert_array_equal(rows[jax.devices()[1].id], [12.0, 18.0])
    assert distributed.local_runs(mesh, 4) == slice(0, 4)  # one process holds every run
    with pytest.raises(ValueError, match=r"\['w'\]: runs axis of size 3 does not split"):
        distributed.shard_runs({"w": np.zeros((3, 2))}, mesh)
    with pytest.raises(ValueError, match=r"slots axis of size 3 does not split"):
        distributed.shard_runs({"w": np.zeros((2, 3))}, distributed.make_mesh(1, 2), True)
    with pytest.raises(ValueError, match="needs runs"):
        distributed.shard_runs(tree, mesh, local=True)
    local = distributed.shard_runs(tree, mesh, local=True, runs=4)
    np.testing.assert_array_equal(distributed.gather_to_host(local)["w"], tree["w"])


def test_from_host_copies_each_devices_slice():
    """`from_host` (the multi-process path of the sweep's `place`) gives `device_put`'s array:
    rows split over "runs", or the whole value on every device when replicated."""
    mesh = distributed.make_mesh()
    host = np.arange(12.0, dtype=np.float32).reshape(4, 3)
    for spec in (P("runs"), P()):
        sharding = NamedSharding(mesh, spec)
        got = distributed.from_host(host, sharding)
        want = jax.device_put(host, sharding)
        assert got.sharding == sharding
        for g, w in zip(got.addressable_shards, want.addressable_shards, strict=True):
            assert g.device == w.device and g.index == w.index
            np.testing.assert_array_equal(np.asarray(g.data), np.asarray(w.data))
    shards = distributed.from_host(host, NamedSharding(mesh, P("runs"))).addressable_shards
    assert [np.asarray(s.data)[:, 0].tolist() for s in shards] == [[0.0, 3.0], [6.0, 9.0]]


def test_sharded_vmap_equals_unsharded():
    """The worker's toy program (jit of vmap over runs) on a state split over runs and slots
    gives the unsplit program's numbers; the outputs stay split over runs."""
    state, hyper = worker.make_inputs()
    want_state, want_metrics = jax.jit(worker.program)(state, hyper)
    for runs, slots in ((2, 1), (1, 2)):
        mesh = distributed.make_mesh(runs, slots)
        got_state, got_metrics = jax.jit(worker.program)(*worker.place((state, hyper), mesh))
        assert got_state["w"].sharding.is_equivalent_to(
            distributed.run_sharding(mesh, shard_slots=slots > 1), 3
        )
        got = distributed.gather_to_host((got_state, got_metrics))
        want = distributed.gather_to_host((want_state, want_metrics))
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    # and the toy program is what it says: one run by hand
    w = state["w"][5]
    for _ in range(worker.ROUNDS):
        w = w - hyper["lr"][5] * 2 * (w - hyper["target"][5])
        w = 0.5 * w + 0.5 * w.mean(axis=0)
    np.testing.assert_allclose(want_state["w"][5], w, rtol=1e-5)


# --------------------------------------------------------------------------- initialize
def test_initialize_argument_errors(monkeypatch):
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=r"missing \['num_processes', 'process_id'\]"):
        distributed.initialize("localhost:1234")
    with pytest.raises(ValueError, match=r"process_id must be in \[0, 1\].*got 2"):
        distributed.initialize("localhost:1234", 2, 2)
    with pytest.raises(ValueError, match="coordinator must be 'HOST:PORT'"):
        distributed.initialize("localhost", 2, 0)
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES must be an integer"):
        distributed.initialize("localhost:1234", process_id=0)
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    with pytest.raises(ValueError, match=r"missing \['coordinator'\]"):
        distributed.initialize(process_id=0)
    assert not jax.distributed.is_initialized()
    assert distributed.is_writer()


# --------------------------------------------------------------------------- state_store
def sharded_tree(mesh):
    """A state like a sweep's: `[runs, slots, ...]` floats split over the mesh, `[runs]` ints."""
    w = jnp.arange(4 * 2 * 3, dtype=jnp.float32).reshape(4, 2, 3)
    return {
        "w": jax.device_put(w, distributed.run_sharding(mesh)),
        "opt": (jax.device_put(-w, distributed.run_sharding(mesh)),),
        "round": jax.device_put(jnp.arange(4, dtype=jnp.int32), distributed.run_sharding(mesh)),
    }


def assert_same(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
        if isinstance(w, jax.Array):
            assert g.sharding == w.sharding


def test_save_restore_sharded_keeps_latest_two(tmp_path):
    mesh = distributed.make_mesh()
    tree = sharded_tree(mesh)
    assert state_store.latest(tmp_path / "ck") is None
    for step in (1, 2, 3):
        state_store.save(
            tmp_path / "ck",
            step,
            jax.tree.map(lambda x, s=step: x * s, tree),
            {"rounds": {"fedavg": step}},
        )
    assert state_store.latest(tmp_path / "ck") == 3
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["2", "3"]
    got, meta = state_store.restore(tmp_path / "ck", tree)
    assert meta == {"rounds": {"fedavg": 3}}
    assert_same(got, jax.tree.map(lambda x: x * 3, tree))
    got, meta = state_store.restore(tmp_path / "ck", tree, step=2)
    assert meta["rounds"]["fedavg"] == 2
    assert_same(got, jax.tree.map(lambda x: x * 2, tree))
    # onto another mesh: the template's shardings win; numpy templates give numpy arrays
    other = NamedSharding(distributed.make_mesh(1, 2), P(None, "slots"))
    template = {
        "w": jax.ShapeDtypeStruct((4, 2, 3), jnp.float32, sharding=other),
        "opt": (np.zeros((4, 2, 3), np.float32),),
        "round": np.zeros(4, np.int32),
    }
    got, _ = state_store.restore(tmp_path / "ck", template)
    assert got["w"].sharding == other and isinstance(got["opt"][0], np.ndarray)
    np.testing.assert_array_equal(got["w"], np.asarray(tree["w"]) * 3)
    np.testing.assert_array_equal(got["round"], np.arange(4) * 3)


def test_save_rules_and_meta_only(tmp_path):
    mesh = distributed.make_mesh()
    tree = sharded_tree(mesh)
    state_store.save(tmp_path, 5, tree, {"a": 1})
    state_store.save(tmp_path, 5, jax.tree.map(lambda x: x + 1, tree), {"a": 2})  # replaces
    got, meta = state_store.restore(tmp_path, tree)
    assert meta == {"a": 2}
    assert_same(got, jax.tree.map(lambda x: x + 1, tree))
    with pytest.raises(ValueError, match="step must be >= the latest saved step 5; got 4"):
        state_store.save(tmp_path, 4, tree, {})
    with pytest.raises(ValueError, match="meta must be JSON-serialisable"):
        state_store.save(tmp_path, 6, tree, {"x": np.float32(1)})
    with pytest.raises(ValueError, match="leaf 'w' is \\(4, 2, 3\\) float32, the template wants"):
        state_store.restore(tmp_path, {**tree, "w": jnp.zeros((4, 2, 2))})
    with pytest.raises(ValueError, match="does not match the template"):
        state_store.restore(tmp_path, {"w": tree["w"]})
    with pytest.raises(ValueError, match=r"no step 3 in .*saved: \[5\]"):
        state_store.restore(tmp_path, tree, step=3)
    state_store.save(tmp_path, 6, None, {"done": True})  # progress only (between methods)
    assert state_store.restore(tmp_path, None) == (None, {"done": True})
    with pytest.raises(ValueError, match="holds no state, only meta"):
        state_store.restore(tmp_path, tree)
    assert state_store.restore(tmp_path, None, step=5) == (None, {"a": 2})  # meta of a state
    with pytest.raises(ValueError, match="no checkpoint in"):
        state_store.restore(tmp_path / "empty", tree)


def test_crash_during_save_keeps_previous_step(tmp_path, monkeypatch):
    """A save killed before orbax's finalisation (the rename of its temporary directory)
    leaves the previous step as the latest, restorable; the next save succeeds. (Patches
    orbax's private `AtomicRenameTemporaryPath.finalize`, the commit point on a local disk.)"""
    from orbax.checkpoint._src.path import atomicity

    mesh = distributed.make_mesh()
    tree = sharded_tree(mesh)
    state_store.save(tmp_path, 1, tree, {"step": 1})
    state_store.save(tmp_path, 2, jax.tree.map(lambda x: x + 2, tree), {"step": 2})

    async def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed during the save of step 3")

    with monkeypatch.context() as m:
        m.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", crash)
        with pytest.raises(KeyboardInterrupt):
            state_store.save(tmp_path, 3, jax.tree.map(lambda x: x + 3, tree), {"step": 3})
    left = sorted(p.name for p in tmp_path.iterdir())
    assert "3" not in left and any(n.startswith("3.orbax-checkpoint-tmp") for n in left), left
    assert state_store.latest(tmp_path) == 2
    got, meta = state_store.restore(tmp_path, tree)
    assert meta == {"step": 2}
    assert_same(got, jax.tree.map(lambda x: x + 2, tree))
    state_store.save(tmp_path, 3, jax.tree.map(lambda x: x + 3, tree), {"step": 3})
    assert state_store.restore(tmp_path, tree)[1] == {"step": 3}


# --------------------------------------------------------------------------- two processes
def test_two_processes_one_mesh(tmp_path):
    """Two `python` processes x 2 CPU devices = one 4-device ("runs", "slots") mesh: the jitted
    vmap over 8 runs, the saves to one directory, the restore and the block after it give the
    single-process numbers."""
    out = tmp_path / "out.npz"
    _, elapsed = run_two_processes(
        "_two_process_worker.py", [str(tmp_path / "ck"), str(out)], timeout=180
    )
    got = dict(np.load(out))
    want = worker.reference()
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6, err_msg=name)
    assert state_store.latest(tmp_path / "ck") == worker.BLOCKS
    assert sorted(p.name for p in (tmp_path / "ck" / "2" / "state").glob("ocdbt.process_*")) == [
        "ocdbt.process_0",
        "ocdbt.process_1",
    ]  # each process wrote its own shards
    print(f"two-process test: {elapsed:.1f} s")


def test_two_process_saves_beside_a_background_save(tmp_path):
    """A synchronous save started while a `Writer`'s save is still being written, in two
    processes whose orbax threads run at different speeds, completes in both: orbax's managers
    share barrier names, so a save waits for the writes in flight (before, process 1 failed at
    `ThreadSaveMultiHostValueHolder:set_value_start ... already ongoing` and process 0 waited
    at its next barrier until the coordination service ended both)."""
    logs, _ = run_two_processes("_two_process_writes_worker.py", [str(tmp_path), "3"], timeout=120)
    assert all(f"process {i}: saved 3" in log for i, log in enumerate(logs))
    assert state_store.latest(tmp_path / "ck") == 2
    assert [state_store.latest(tmp_path / f"m{i}") for i in range(3)] == [0, 0, 0]


@pytest.mark.slow
def test_two_process_sweep_equals_one_process(tmp_path):
    """`pfedwn_jax.sweep` (4 seeds x local, pfedwn; block=1) on a 4-device mesh over two
    processes, run through and interrupted-then-resumed, gives in both processes the rows of
    the same sweep on this one process (2 devices)."""
    _, elapsed = run_two_processes(
        "_two_process_sweep_worker.py", [str(tmp_path / "ck"), str(tmp_path / "rows")], 540
    )
    want = sweep_worker.reference()
    assert len(want["run"]) == 4 * 2 * 2  # seeds x methods x rounds
    for pid in range(2):
        got = dict(np.load(tmp_path / f"rows{pid}.npz"))
        for case in ("full", "resumed"):
            for name, value in want.items():
                err = f"process {pid}, {case}: {name}"
                if value.dtype.kind == "f":
                    np.testing.assert_allclose(got[f"{case}_{name}"], value, atol=1e-6, err_msg=err)
                else:
                    np.testing.assert_array_equal(got[f"{case}_{name}"], value, err_msg=err)
    want_blocks = sorted(f"0.{m}.{r}.1.npz" for m in ("local", "pfedwn") for r in (0, 1))
    for case in ("full", "resumed"):  # the block files (process 0 writes them), each once
        blocks = tmp_path / "ck" / case / "blocks"
        assert sorted(p.name for p in blocks.iterdir()) == want_blocks
        with np.load(blocks / want_blocks[0]) as f:
            assert f["metrics/accuracy"].shape[:2] == (4, 1)  # every run, one round
    print(f"two-process sweep test: {elapsed:.1f} s")
