"""`pfedwn_jax.run` with its slot axis split over the devices of several processes.

Quick (one process, the suite's 2 CPU devices): the placement helpers of `engine.sharding`
still place as before, and the shard count a job of several processes resolves to. Slow: two
real processes x 2 CPU devices (`tests/_two_process_run_worker.py`, the harness of
`tests/test_distributed.py`) run one network-mode experiment with its 8 slots over all 4
devices, through and interrupted-then-resumed, against the same run in this one process; and
the compiled round of a split run gathers neighbor models with XLA collectives.
"""

from __future__ import annotations

import collections
import csv
import re

import _two_process_run_worker as run_worker
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from processes import run_two_processes

import pfedwn_jax
from pfedwn_jax.algorithms.pfedwn import PFedWNHParams
from pfedwn_jax.engine import put_slots, replicate, resolve_shards
from pfedwn_jax.engine.sharding import slot_mesh

pytestmark = pytest.mark.skipif(jax.device_count() < 2, reason="needs two devices")

#: What a split run must match the one-device run to: everything but pFedWN's pi.
ATOL = 2e-6


def pi_atol(hp: PFedWNHParams = PFedWNHParams()) -> float:
    """How far pFedWN's ``pi`` (and ``pi_trace``) of a split run may lie from the one-device run:
    the float32 error of the EM losses' summation order, carried through the EM iterations.

    The split changes one reduction: the EM's cross-evaluation (``engine.cross_evaluate``) is
    one batched ``[pairs, n, 784] x [pairs, 784, 10]`` dot, and XLA's CPU dot takes another
    kernel, so another order of the 784-term sums, at 56 pairs on one device (the threshold
    lies between 48 and 52) than at the 14 of each device of the split (measured: 86 of the
    448 losses differ, by 1 or 2 ulp of losses below 4, 2.4e-7 or 4.8e-7; each order lies
    4.4e-7 / 4.5e-7 from float64; the models, keys, masks, neighbor lists and the EM's
    iteration count are the same). One EM iteration ``pi_m = mean_i softmax_m(log pi - L)_i``
    moves by at most ``max|dL| / 2`` when the losses move by ``dL`` (a softmax entry's
    derivative is ``lam (1 - lam) <= 1/4``, times the two losses it compares), and the EM
    map does not amplify an error it carries (its Jacobian's spectral radius is the
    convergence rate, below 1), so after the ``em_steps + em_iters`` iterations ``pi`` is
    within ``(em_steps + em_iters) max|dL| / 2``: with ``max|dL|`` 4 ulp of a loss in
    [2, 4), 9.7e-5. This run needs it: target 6's two neighbors explain its 8 samples
    almost equally well (flat likelihood), its EM moves pi 4.8e-4 an iteration at the
    200-iteration cap, and the 1-2 ulp difference grows linearly with the iterations
    (2.7e-7 after 10, 1.3e-6 after 100, 2.8e-6 after 203). A divergence moves pi further:
    in this run, one neighbor left out by at least 1.7e-4, losses off by 1e-3 relative (far
    less than another training key makes) by 1.2e-2; and the other fields keep ``ATOL``.
    """
    loss_error = 4 * float(np.spacing(np.float32(2.0)))  # 4 ulp of a loss in [2, 4)
    return (hp.em_steps + hp.em_iters) * loss_error / 2


# --------------------------------------------------------------------------- one process
def test_placement_helpers_one_process():
    """One process: `slot_mesh` is the first devices, `put_slots` splits `[S]` leaves (S a
    multiple of the shards) and replicates the rest, `replicate` copies everything; values
    unchanged, one shard a no-op."""
    assert jax.process_count() == 1
    mesh = slot_mesh(2)
    assert mesh.devices.tolist() == jax.devices()[:2] and mesh.axis_names == ("slots",)
    tree = {"w": np.arange(12.0, dtype=np.float32).reshape(4, 3), "b": np.arange(3.0)}
    placed = put_slots(tree, 4, 2)
    assert placed["w"].sharding == NamedSharding(mesh, P("slots"))
    assert placed["b"].sharding == NamedSharding(mesh, P())
    rows = [np.asarray(s.data)[:, 0].tolist() for s in placed["w"].addressable_shards]
    assert rows == [[0.0, 3.0], [6.0, 9.0]]  # device 0 holds slots 0-1, device 1 slots 2-3
    odd = put_slots({"w": np.zeros((3, 2))}, 3, 2)["w"]  # 3 slots: not a multiple
    assert odd.sharding == NamedSharding(mesh, P())
    for leaf in jax.tree.leaves(replicate(tree, 4, 2)):
        assert leaf.sharding == NamedSharding(mesh, P()) and leaf.is_fully_replicated
    for name, leaf in placed.items():
        np.testing.assert_array_equal(np.asarray(leaf), tree[name])
    assert put_slots(tree, 4, 1) is tree and replicate(tree, 4, 1) is tree


def test_resolve_shards_over_processes(monkeypatch):
    """One process: as before. Two processes (process count patched): a split gives every
    process at least one device and the count is a multiple of 2 (an odd explicit count above
    1 is refused); 1 stays 1."""
    assert resolve_shards(None, 8) == 2 and resolve_shards(None, 4) == 1
    assert resolve_shards(1, 8) == 1 and resolve_shards(2, 1) == 1
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "device_count", lambda: 4)  # 2 processes x 2 devices
    assert resolve_shards(None, 8) == 2 and resolve_shards(None, 16) == 4
    assert resolve_shards(4, 8) == 4 and resolve_shards(4, 3) == 2  # 3 slots: 2 devices
    assert resolve_shards(None, 4) == 2  # 1 device by the slot rule, but both processes join
    assert resolve_shards(2, 1) == 2  # one slot: padded, both processes still take part
    assert resolve_shards(1, 8) == 1  # every process alone on its first device (sweeps)
    with pytest.raises(ValueError, match=r"shards=3 does not split over the 2 processes"):
        resolve_shards(3, 8)


# --------------------------------------------------------------------------- two processes
@pytest.mark.slow
def test_two_process_run_equals_one_process(tmp_path):
    """FedAvg and pFedWN in network mode (8 nodes, logreg, 3 rounds), slots split over 2
    processes x 2 devices, run through (in adapted blocks, with process 1 finding its rounds
    slow: both take its shorter blocks) and stopped-then-resumed: in both processes the
    metrics, records (pi) and neighbor lists of the same run on one device of this process;
    pFedWN's pi to the float32 error of the EM losses' summation order (`pi_atol`); the
    checkpoint is written once (process 0 only); the models both processes saved evaluate
    to the recorded accuracy in this process, and the CSV holds every round once."""
    logs, elapsed = run_two_processes(
        "_two_process_run_worker.py", [str(tmp_path / "ck"), str(tmp_path / "out")], 540
    )
    assert all("split, 2 slots per local device" in log for log in logs)  # `check_split`
    want = run_worker.reference(shards=1)
    atol = {name: pi_atol() if "/records/pi" in name else ATOL for name in want}
    assert "pfedwn/records/pi" in want and want["pfedwn/client_accuracy"].shape == (3, 8)
    for pid in range(2):
        got = dict(np.load(tmp_path / f"out{pid}.npz"))
        for case in ("full", "resumed"):
            assert sorted(k for k in got if k.startswith(case)) == sorted(
                f"{case}/{k}" for k in want
            )
            for name, value in want.items():
                err = f"process {pid}, {case}: {name}"
                np.testing.assert_allclose(
                    got[f"{case}/{name}"], value, atol=atol[name], err_msg=err
                )
    for case in ("full", "resumed"):  # the block files (process 0 writes them) cover 3 rounds
        names = sorted(p.name for p in (tmp_path / "ck" / case / "blocks").iterdir())
        rounds = {m: sum(int(n.split(".")[3]) for n in names if n.split(".")[1] == m)
                  for m in ("fedavg", "pfedwn")}  # fmt: skip
        assert rounds == {"fedavg": 3, "pfedwn": 3}, names
        if case == "full":  # process 1's one-round blocks, not the two rounds process 0 asks
            assert {n.split(".")[3] for n in names} == {"1"}, names
    models = pfedwn_jax.load_models(tmp_path / "ck" / "models")  # saved by both processes
    for method in run_worker.METHODS:
        acc = models.evaluate(method)["accuracy"]
        np.testing.assert_allclose(acc, want[f"{method}/client_accuracy"][-1], atol=ATOL)
    with (tmp_path / "ck" / "metrics.csv").open() as f:  # logged once, by process 0
        rows = [(r["method"], r["round"], r["name"]) for r in csv.DictReader(f)]
    assert len(rows) == len(set(rows)) and {(m, r) for m, r, _ in rows} == {
        (m, r) for m in run_worker.METHODS for r in "123"
    }
    print(f"two-process run test: {elapsed:.1f} s")


@pytest.mark.slow
def test_split_round_gathers_with_collectives():
    """The compiled round of a run split over 2 devices moves neighbor models between the
    blocks with XLA collectives (all-gather / collective-permute), not host copies; on one
    device it has none."""
    from pfedwn_jax.api import compiled_block

    config = run_worker.config()
    counts = {}
    for shards in (1, 2):
        compiled = compiled_block(config, "fedavg", shards=shards)
        ops = r"\b(all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter)"
        counts[shards] = collections.Counter(re.findall(ops, compiled.as_text()))
    assert not counts[1], counts[1]
    assert counts[2]["all-gather"] + counts[2]["collective-permute"] > 0, counts[2]
