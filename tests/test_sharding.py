"""Slot sharding over devices: the same numbers as one device, placement, validation.

The test session runs with two CPU devices (`tests/conftest.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import chex
import jax
import numpy as np
import optax
import pytest
from helpers import COUNTS, B, M, make_data
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pfedwn_jax.devices import use_cpu_devices
from pfedwn_jax.engine import (
    init_client_state,
    local_train,
    put_slots,
    replicate,
    resolve_shards,
)
from pfedwn_jax.models import get_model

pytestmark = pytest.mark.skipif(jax.device_count() < 2, reason="needs two devices")


@pytest.fixture(scope="module")
def model():
    return get_model("mlp", 3, (4, 4, 1))


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    ("strategy", "chunk", "num_slots"),  # 5 slots padded to 6, or 6: an exact split
    [
        ("map", None, 5),
        pytest.param("map", None, 6, marks=SLOW),
        ("vmap", None, 6),
        pytest.param("vmap", None, 5, marks=SLOW),
        ("chunked", 2, 5),
        pytest.param("chunked", 2, 6, marks=SLOW),
    ],
)
def test_two_shards_equal_one(model, num_slots, strategy, chunk):
    """Momentum state, sample weights, aux (a prox loss), an inactive slot and per-slot keys:
    splitting the slots over two devices changes no bit of the result with `map` (each slot
    runs the same program); `vmap`/`chunked` batch a different number of slots per program,
    which may move float32 rounding."""
    data = make_data()
    opt = optax.sgd(0.1, momentum=0.9)
    dc = np.array([0, 1, 2, 3, 4, 0])[:num_slots]
    state = init_client_state(model, opt, jax.random.key(0), num_slots, same_init=False)
    anchor = init_client_state(model, opt, jax.random.key(1), num_slots, same_init=False).params
    sw = np.random.default_rng(0).uniform(0.5, 1.5, (num_slots, M)).astype(np.float32)
    active = np.ones(num_slots, bool)
    active[1] = False

    def grad_fn(params, x, y, w, aux_s, key):
        noise = jax.random.normal(key)
        loss, g = jax.value_and_grad(
            lambda p: (
                model.apply(p, x).sum() * 1e-3
                + sum(
                    ((a - b) ** 2).sum() for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(aux_s))
                )
            )
        )(params)
        return loss + noise, jax.tree.map(lambda a: a + noise * 1e-3, g)

    out = {}
    for shards in (1, 2):
        out[shards] = local_train(
            model,
            opt,
            state,
            data,
            dc,
            jax.random.key(2),
            batch_size=B,
            epochs=2,
            grad_fn=grad_fn,
            aux=anchor,
            sample_weight=sw,
            active=active,
            strategy=strategy,
            chunk_size=chunk,
            shards=shards,
        )
    if strategy == "map":
        chex.assert_trees_all_equal(out[1], out[2])
    else:
        chex.assert_trees_all_close(out[1], out[2], rtol=1e-6, atol=1e-7)
    trains = (COUNTS[dc] > 0) & active  # slot 1 inactive, client 2 has no data
    np.testing.assert_array_equal(np.asarray(out[2][1]["steps"]) > 0, trains)


def test_placement_is_stable_across_calls(model):
    """An even split keeps slot leaves sharded (each device one block) through local_train;
    an odd slot count is replicated. Either way the output goes where the input was."""
    data = replicate(make_data(), 4, shards=2)
    opt = optax.sgd(0.1)
    for num_slots, spec in ((4, P("slots")), (3, P())):
        state = init_client_state(model, opt, jax.random.key(0), num_slots)
        state = put_slots(state, num_slots, shards=2)
        for leaf in jax.tree.leaves(state):
            assert isinstance(leaf.sharding, NamedSharding)
            assert leaf.sharding.spec == spec
        if spec == P("slots"):
            shard_rows = {s.data.shape[0] for s in jax.tree.leaves(state)[0].addressable_shards}
            assert shard_rows == {num_slots // 2}
        dc = np.arange(num_slots)
        new, _ = local_train(model, opt, state, data, dc, jax.random.key(1), batch_size=B, shards=2)
        for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(state), strict=True):
            assert a.sharding.is_equivalent_to(b.sharding, a.ndim)


def test_state_pinned_to_one_device_is_a_clear_error(model):
    data = make_data()
    opt = optax.sgd(0.1)
    state = jax.device_put(init_client_state(model, opt, jax.random.key(0), 4), jax.devices()[0])
    dc = np.arange(4)
    with pytest.raises(ValueError, match=r"state is placed on \[0\] but the slots are split"):
        local_train(model, opt, state, data, dc, jax.random.key(1), batch_size=B, shards=2)
    # the fix the message names works
    fixed = put_slots(state, 4, shards=2)
    local_train(model, opt, fixed, data, dc, jax.random.key(1), batch_size=B, shards=2)


def test_resolve_shards_and_cpu_devices_errors():
    assert resolve_shards(None, 8) == 2  # 4 slots or more per device
    assert resolve_shards(None, 7) == 1
    assert resolve_shards(2, 15) == 2
    assert resolve_shards(2, 1) == 1  # never more blocks than slots
    assert resolve_shards(1, 70) == 1
    with pytest.raises(
        ValueError, match=r"shards=3 exceeds the 2 cpu device\(s\); allowed: 1\.\.2"
    ):
        resolve_shards(3, 7)
    with pytest.raises(ValueError, match="shards"):
        resolve_shards(0, 7)
    # after JAX started: no change; a warning only when an explicit count differs
    with pytest.warns(UserWarning, match=r"use_cpu_devices\(4\) came after JAX started"):
        assert use_cpu_devices(4) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert use_cpu_devices(2) == 2
    with pytest.raises(ValueError, match="count"):
        use_cpu_devices(0)


@pytest.mark.parametrize(
    ("mode", "neighbors", "algorithms"),
    [  # 6 slots split evenly; 5 slots replicated
        pytest.param("network", 5, ("pfedwn", "fedamp"), marks=pytest.mark.slow),
        ("single", 4, ("pfedwn",)),
        pytest.param("network", 7, (), marks=pytest.mark.slow, id="every-method-8-slots"),
    ],
)
def test_runner_results_do_not_depend_on_shards(mode, neighbors, algorithms):
    from pfedwn_jax import run
    from pfedwn_jax.experiment import ExperimentConfig

    cfg = ExperimentConfig(
        model="logreg",
        mode=mode,
        num_neighbors=neighbors,
        rounds=2,
        batch_size=32,
        lr=0.05,
        algorithms=algorithms,
        gamma_th=1.0,
        eps=0.5,
    )
    one, two = (run(cfg, progress=False, shards=k) for k in (1, 2))
    for name in cfg.method_names:
        a, b = one.methods[name], two.methods[name]
        np.testing.assert_allclose(a["client_accuracy"], b["client_accuracy"], atol=1e-6)
        np.testing.assert_allclose(a["client_loss"], b["client_loss"], rtol=1e-5, atol=1e-6)
        for key, rec in a["records"].items():
            np.testing.assert_allclose(rec, b["records"][key], rtol=1e-4, atol=1e-5, err_msg=key)


def test_balanced_order_evens_the_blocks():
    from pfedwn_jax.engine.sharding import balanced_order

    work = np.array([520, 406, 338, 208, 229, 86, 104, 72, 158, 500], np.float32)
    order = np.asarray(balanced_order(jax.numpy.asarray(work), 2))
    assert sorted(order.tolist()) == list(range(10))  # a permutation
    blocks = work[order].reshape(2, 5).sum(1)
    assert blocks.tolist() == [1277, 1344]  # contiguous blocks: 1701 / 920
    three = np.asarray(balanced_order(jax.numpy.arange(12.0), 3))
    assert np.ptp(np.arange(12.0)[three].reshape(3, 4).sum(1)) == 0  # snake: 22 / 22 / 22


def test_vmap_over_seeds_with_shards(model):
    """Sweeps vmap whole training calls over seeds; the device split works under vmap."""
    data = make_data()
    opt = optax.sgd(0.1)
    dc = np.array([0, 1, 2, 3, 4, 0, 1, 3])

    def one(key, shards):
        state = init_client_state(model, opt, key, len(dc))
        return local_train(model, opt, state, data, dc, key, batch_size=B, shards=shards)[0]

    keys = jax.random.split(jax.random.key(0), 3)
    one_dev, two_dev = (jax.jit(jax.vmap(lambda k, s=s: one(k, s)))(keys) for s in (1, 2))
    chex.assert_trees_all_equal(one_dev, two_dev)
    assert jax.tree.leaves(two_dev.params)[0].shape[:2] == (3, len(dc))


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"JAX_NUM_CPU_DEVICES": "3"}, 3),
        ({"XLA_FLAGS": "--foo=1 --xla_force_host_platform_device_count=5"}, 5),
    ],
)
def test_a_user_chosen_device_count_is_read_not_queried(monkeypatch, env, want):
    """The count chosen through the environment comes back without asking JAX (which would
    start it, too early for a multi-process join)."""
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(jax, "devices", lambda *a: pytest.fail("JAX was queried"))
    assert use_cpu_devices() == want


@SLOW  # a process of 4 devices; the quick tier splits slots over 2 (above)
def test_runs_and_slots_both_split_equal_one_device():
    """A sweep of 4 runs on a 2 x 2 mesh (runs over two rows, each run's slots over the two
    devices of its row; a process of 4 CPU devices) gives the 1-device numbers, for a method
    whose loss and optimizer close over per-run values (Per-FedAvg's alpha, every run's lr,
    gradients of gradients) and pFedWN's EM."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    env.pop("JAX_NUM_CPU_DEVICES", None)
    worker = Path(__file__).parent / "mesh_worker.py"
    methods = ["perfedavg", "pfedwn"]
    out = subprocess.run(
        [sys.executable, str(worker), *methods], env=env, capture_output=True, text=True,
        timeout=600, cwd=Path(__file__).parent,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    diffs = dict(line.split() for line in out.stdout.splitlines() if line.count(" ") == 1)
    assert int(diffs.pop("split_blocks")) >= len(methods)  # each run's slots split by hand
    assert set(diffs) == {"target_accuracy", "target_loss", "mean_client_accuracy"}, out.stdout
    for column, diff in diffs.items():
        assert float(diff) <= 1e-5, (column, diff)
