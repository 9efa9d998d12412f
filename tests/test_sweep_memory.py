"""The memory plan (`pfedwn_jax.runner.memory`): estimate against XLA, plan arithmetic.

References: the bytes of the arrays `init_state` and `setup` really allocate (exact parts),
XLA's own `memory_analysis()` of the compiled round (the whole estimate, within a stated
factor), hand-computed liveness and plan cases.
"""

from __future__ import annotations

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import TINY_RUN, registry_params

from pfedwn_jax.algorithms import get_algorithm
from pfedwn_jax.algorithms.phases import Sizes
from pfedwn_jax.api import compiled_block
from pfedwn_jax.data import DEFAULT_DATASET, load_dataset
from pfedwn_jax.engine import local_train
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.setup import setup
from pfedwn_jax.models import get_model
from pfedwn_jax.runner import memory
from pfedwn_jax.runner import sample_bytes as per_sample
from pfedwn_jax.runner.memory import (
    MemoryEstimate,
    available_bytes,
    check_fits,
    estimate,
    format_bytes,
    plan,
    sample_bytes,
    tree_bytes,
)
from pfedwn_jax.runner.step import init_state

# Accepted ratio estimate / XLA (the estimate is meant to err on the large side).
LOW, HIGH = 0.5, 3.0


@pytest.fixture(scope="module")
def small_config(tmp_path_factory) -> ExperimentConfig:
    """TINY_RUN with the MLP on the embedded (real) MNIST digits downsampled to 14x14 (1,200
    train, 300 test images): compiles fast, and the parameters weigh as much as the data."""
    mnist = load_dataset(DEFAULT_DATASET)
    arrays = {
        "x_train": mnist.x_train[:1200, ::2, ::2],
        "y_train": mnist.y_train[:1200],
        "x_test": mnist.x_test[:300, ::2, ::2],
        "y_test": mnist.y_test[:300],
    }
    path = tmp_path_factory.mktemp("mnist14") / "mnist14.npz"
    np.savez(path, **arrays)
    return ExperimentConfig(**{**TINY_RUN, "dataset": f"npz:{path}", "model": "mlp"})


@pytest.fixture(scope="module")
def exp(small_config):
    """The experiment on one device (XLA's numbers are then those of the whole run)."""
    e = setup(small_config)
    return dataclasses.replace(e, ctx=e.ctx.replace(shards=1))


def _xla(exp, name: str) -> tuple[int, int]:
    """(bytes of the driver's compiled block of one round on one device: arguments +
    temporaries + outputs not aliased to an argument, temporaries alone) from XLA's
    `memory_analysis`."""
    m = compiled_block(exp.config, name, shards=1).memory_analysis()
    out = m.output_size_in_bytes - m.alias_size_in_bytes
    return m.argument_size_in_bytes + m.temp_size_in_bytes + out, m.temp_size_in_bytes


# --------------------------------------------------------------------------- against XLA
@pytest.mark.parametrize(
    "name",
    registry_params(),
)
def test_estimate_within_factor_of_xla(exp, name):
    est = estimate(exp.ctx, exp.test, name, exp.config.hparams_for(name))
    total, temp = _xla(exp, name)
    buffers = est.total(1) - est.runtime  # XLA's buffers (the runtime's heap is beside them)
    assert LOW <= buffers / total <= HIGH, (est.describe(), total)
    ours = est.algorithm + est.activations  # the round's temporaries (and the small own state)
    assert LOW <= ours / temp <= HIGH, (est.describe(), temp)


def test_runtime_counted_once_per_program_on_a_cpu_only(exp):
    cpu = estimate(exp.ctx, exp.test, "fedavg", backend="cpu")
    gpu = estimate(exp.ctx, exp.test, "fedavg", backend="gpu")
    assert cpu.runtime == memory.RUNTIME_BYTES["cpu"] > 0 and gpu.runtime == 0
    assert cpu.total(3) - gpu.total(3) == cpu.runtime and "runtime" in cpu.describe()


def test_training_chunk_against_xla(exp):
    """Training 4 slots at once instead of 1: the extra bytes XLA needs, against the
    training phase's difference between chunk=4 and chunk=1 (the estimate keeps the largest
    phase, here the evaluation)."""
    ctx = exp.ctx.replace(batch_size=64)
    local = get_algorithm("local")
    key = jax.random.wrap_key_data(exp.init_key)
    clients = init_state(local, exp.config.hparams_for("local"), key, exp.ctx).alg.clients

    def temp(strategy):
        fn = lambda s, k: local_train(
            ctx.model,
            ctx.tx,
            s,
            ctx.train,
            ctx.data_client,
            k,
            batch_size=64,
            strategy=strategy,
            shards=1,
        )
        return jax.jit(fn).lower(clients, key).compile().memory_analysis()

    xla = temp("vmap").temp_size_in_bytes - temp("map").temp_size_in_bytes
    one, four = (memory.phases(ctx, exp.test, "local", chunk=c)[0] for c in (1, 4))
    assert four.name == "local training"
    ours = four.activations - one.activations
    assert LOW <= ours / xla <= HIGH, (ours, xla)


@pytest.mark.slow
def test_sample_bytes_of_cnn_against_xla():
    """The CNN's training bytes per sample (jaxpr liveness, im2col patches included) against
    XLA's growth of a training step's temporaries from batch 16 to 32."""
    model = get_model("cnn", 10, (28, 28, 1))
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))

    def temp(b):
        x = jax.ShapeDtypeStruct((b, 28, 28, 1), jnp.uint8)
        y = jax.ShapeDtypeStruct((b,), jnp.int32)
        loss = lambda p, x, y: optax.softmax_cross_entropy_with_integer_labels(
            model.apply(p, x), y
        ).mean()
        step = lambda p, x, y: jax.tree.map(lambda a, g: a - g, p, jax.grad(loss)(p, x, y))
        return jax.jit(step).lower(params, x, y).compile().memory_analysis().temp_size_in_bytes

    per_sample = (temp(32) - temp(16)) / 16
    train, forward = sample_bytes(model)
    assert LOW <= train / per_sample <= HIGH, (train, per_sample)
    assert forward <= train


# --------------------------------------------------------------------------- exact parts
def test_state_and_data_parts_are_exact(exp):
    """Parameters, optimizer state (momentum: one buffer per parameter) and data equal the
    bytes of the arrays the runner allocates."""
    ctx = exp.ctx.replace(optimizer=optax.sgd(0.1, momentum=0.9))
    state = get_algorithm("fedprox").init(
        jax.random.wrap_key_data(exp.init_key), ctx, exp.config.hparams_for("fedprox")
    )
    nbytes = lambda tree: sum(np.asarray(a).nbytes for a in jax.tree.leaves(tree))
    data = nbytes(ctx) + nbytes(exp.test)
    shared = estimate(ctx, exp.test, "fedprox")
    assert shared.params == nbytes(state.clients.params) == shared.optimizer > 0
    assert (shared.shared, shared.data) == (data, 0)
    own = estimate(ctx, exp.test, "fedprox", shared_data=False)
    assert (own.shared, own.data) == (0, data)
    assert own.total(1) == shared.total(1) and own.total(3) == shared.total(3) + 2 * data


def test_pfedwn_counts_its_state_and_em_pairs(exp):
    """pFedWN's own state (pi, pi_trace, ...) is in `algorithm`; its EM runs over every list
    entry, S (K - 1) pairs, whether the context holds arrays or only shapes."""
    hp = exp.config.hparams_for("pfedwn")
    state = get_algorithm("pfedwn").init(jax.random.wrap_key_data(exp.init_key), exp.ctx, hp)
    nbytes = lambda tree: sum(np.asarray(a).nbytes for a in jax.tree.leaves(tree))
    est = estimate(exp.ctx, exp.test, "pfedwn", hp)
    assert est.algorithm > nbytes(state) - nbytes(state.clients)
    assert est.phase == "pFedWN EM"
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), exp.ctx)
    test = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), exp.test)
    assert estimate(shapes, test, "pfedwn", hp) == est
    assert estimate(shapes, test, "fedavg") == estimate(exp.ctx, exp.test, "fedavg")


def test_perfedavg_adaptation_only_with_alpha(exp):
    """Per-FedAvg adapts (and holds S adapted models, plus a model and a gradient sum for each
    slot adapted at once) only when alpha > 0; Hessian-free
    steps take 3 passes over the minibatch instead of 2, or, with the minibatch split into
    its parts, one minibatch's worth either way."""
    hp = get_algorithm("perfedavg").hparams
    adapted = estimate(exp.ctx, exp.test, "perfedavg", hp(alpha=0.01))
    held = estimate(exp.ctx, exp.test, "perfedavg", hp(alpha=0.0))
    assert adapted.phase == "evaluation (one-step adaptation)" and held.phase != adapted.phase
    # while adapting; training writes the new models over the old ones
    slots = adapted.slots
    at_once = memory.chunk_of(None, slots)  # one on a CPU
    per_model = adapted.params // slots
    assert adapted.algorithm - held.algorithm == (slots + 2 * at_once) * per_model
    train = lambda **kw: memory.phases(exp.ctx, exp.test, "perfedavg", hp(alpha=0.0, **kw))[0]
    whole = {"split_batch": False}
    assert train(variant="hf", **whole).activations > train(**whole).activations  # 3 vs 2
    assert train(variant="hf").activations == train().activations < train(**whole).activations


# --------------------------------------------------------------------------- liveness
def test_growth_hand_computed():
    """`sum(tanh(2 x))`, x `[b, 10]` float32: x (40 B per sample, live throughout), `2 x`
    (40 B) and `tanh` (40 B) are live together once: 120 B per sample; the same inside a
    nested jit."""
    args = lambda b: (jax.ShapeDtypeStruct((b, 10), jnp.float32),)
    inner = lambda x: jnp.tanh(x * 2.0)
    assert per_sample._growth(lambda x: jnp.sum(inner(x)), args) == 120
    assert per_sample._growth(lambda x: jnp.sum(jax.jit(inner)(x)), args) == 120
    # a value freed early does not count: tanh(2 x) freed before the second product
    two = lambda x: jnp.sum(jnp.tanh(x * 2.0)) + jnp.sum(x * 3.0)
    assert per_sample._growth(two, args) == 120


# --------------------------------------------------------------------------- plan
def _est(per_run_parts=(40, 0, 10, 0, 50), shared=50) -> MemoryEstimate:
    return MemoryEstimate(*per_run_parts, shared=shared, slots=7, chunk=3, method="fedavg")


@pytest.mark.parametrize(
    ("num_runs", "devices", "expected"),
    [
        (10, 1, 5),  # 750 // 100 = 7 fit: 2 programs of 5, not 7 + 3
        (7, 1, 7),
        (3, 1, 3),
        (15, 1, 5),  # 3 programs of 5
        (10, 2, 10),  # 14 fit on 2 devices: one program
        (10, 4, 12),  # one program, padded to a multiple of 4
        (30, 2, 10),  # 3 programs of 10 (5 per device)
        (1, 4, 4),  # fewer runs than devices: one per device, padded
    ],
)
def test_plan_hand_computed(num_runs, devices, expected):
    """budget 1000, fraction 0.8: 800 usable, 750 after the 50 shared, 100 per run: 7 runs
    per device."""
    assert plan(num_runs, _est(), devices=devices, budget=1000) == expected


def test_plan_fraction_and_exact_fit():
    assert plan(20, _est(), budget=1000, fraction=1.0) == 7  # (1000 - 50) // 100 = 9: 3 x 7
    assert plan(20, _est(), budget=1050, fraction=1.0) == 10  # exactly 10 fit
    assert plan(20, _est(), budget=150, fraction=1.0) == 1  # exactly one fits


def test_plan_error_names_the_numbers():
    est = _est((400, 0, 100, 0, 900), shared=200)  # activations largest
    with pytest.raises(ValueError) as err:
        plan(4, est, budget=1500)
    text = str(err.value)
    for part in ("1600 bytes", "1200 bytes", "80%", "activations", "batch size", "chunk"):
        assert part in text, (part, text)
    assert plan(4, est, budget=2000) == 1  # 1600 usable: one run of 1400 + 200
    with pytest.raises(ValueError, match="fewer clients/nodes or a smaller model"):
        plan(1, _est((900, 0, 0, 0, 0), shared=0), budget=1000)
    with pytest.raises(ValueError, match="shared data does not fit"):
        plan(1, _est((1, 0, 0, 0, 0), shared=5000), budget=1000)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_runs": 0}, "num_runs"),
        ({"devices": 0}, "devices"),
        ({"fraction": 0.0}, "fraction"),
        ({"fraction": 1.5}, "fraction"),
        ({"budget": -1}, "budget"),
        ({"est": 5}, "MemoryEstimate"),
    ],
)
def test_plan_rejects_bad_input(kwargs, match):
    args = {"num_runs": 2, "est": _est(), "devices": 1, "budget": 1000, **kwargs}
    num_runs, est = args.pop("num_runs"), args.pop("est")
    with pytest.raises(ValueError, match=match):
        plan(num_runs, est, **args)


def test_estimate_rejects_bad_input(exp):
    with pytest.raises(ValueError, match="ctx must be a RoundContext"):
        estimate(exp.test, exp.test, "fedavg")
    with pytest.raises(ValueError, match="test must be a ClientData"):
        estimate(exp.ctx, exp.ctx, "fedavg")
    with pytest.raises(ValueError, match="chunk"):
        estimate(exp.ctx, exp.test, "fedavg", chunk=0)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        estimate(exp.ctx, exp.test, "nope")


def test_check_fits_names_the_plan_the_budget_and_what_to_change():
    """budget 1000, fraction 0.8: 800 usable; 50 shared + 100 per run: 7 runs fit."""
    check_fits(_est(), 1000, runs=7)  # 750 bytes: fits, returns None
    with pytest.raises(ValueError) as err:
        check_fits(_est(), 1000, runs=8)  # 850 bytes
    text = str(err.value)
    for part in ("850 bytes", "800 bytes", "8 runs", "at most 7 runs", "chunks", "fedavg"):
        assert part in text, (part, text)
    with pytest.raises(ValueError, match="fewer clients/nodes or a smaller model"):
        check_fits(_est((900, 0, 0, 0, 0), shared=0), 1000)  # not even one run
    with pytest.raises(ValueError, match=r"runs must be in \[1, inf\); got 0"):
        check_fits(_est(), 1000, runs=0)
    with pytest.raises(ValueError, match="est must be a MemoryEstimate"):
        check_fits(850, 1000)


# --------------------------------------------------------------------------- free memory
class _FakeDevice:
    platform = "gpu"

    def memory_stats(self):
        return {"bytes_limit": 1000, "bytes_in_use": 300}


def test_available_bytes_of_an_accelerator_and_the_host(monkeypatch):
    assert available_bytes(_FakeDevice()) == 700
    cpu = jax.devices("cpu")
    host = available_bytes(cpu[0])
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo").read().splitlines())
    mem_available = int(meminfo["MemAvailable"].split()[0]) * 1024
    assert 0.8 < host * len(cpu) / mem_available < 1.25
    monkeypatch.setitem(sys.modules, "psutil", None)  # no psutil: /proc/meminfo
    assert 0.8 < available_bytes(cpu[0]) / host < 1.25


# --------------------------------------------------------------------------- reporting
def test_describe_and_format_bytes(exp):
    est = estimate(exp.ctx, exp.test, "fedamp", shared_data=False)
    text = est.describe()
    for name in ("params", "optimizer", "algorithm", "data", "activations", "shared"):
        assert f"  {name}" in text
    assert format_bytes(est.per_run) in text and "fedamp" in text and est.phase in text
    assert est.per_run == sum(
        getattr(est, k) for k in ("params", "optimizer", "algorithm", "data", "activations")
    )
    assert _est().largest() == "activations" and _est((9, 0, 0, 1, 0)).largest() == "params"
    assert [format_bytes(n) for n in (0, 1023, 1536, 5 * 2**20, 3 * 2**40, 2**52)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "5 MiB",
        "3 TiB",
        "4096 TiB",
    ]
    assert tree_bytes({"a": np.zeros((2, 3), np.float32), "b": np.zeros(4, bool)}) == 28


@pytest.mark.parametrize("slots, columns", [(8, 1000), (2000, 20_000)])
def test_the_round_metrics_phase_covers_xlas_temporaries_of_the_consensus_deviation(slots, columns):
    """The plan's round-metrics phase against XLA's temporaries of the consensus deviation
    over `[S, D]` float32 models: all the columns at once in a small network, one block of
    columns in a large one (where two copies of every model would be 16x too much)."""
    from pfedwn_jax.engine.gossip import consensus_deviation

    params = jax.ShapeDtypeStruct((slots, columns), jnp.float32)
    labels = jax.ShapeDtypeStruct((slots,), jnp.int32)
    compiled = jax.jit(consensus_deviation).lower(params, labels).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    sizes = Sizes(*[0] * len(Sizes._fields))._replace(slots=slots, param=4 * columns)
    (phase,) = memory._round_metrics(sizes)
    assert temp <= phase.activations
    assert phase.activations <= max(4 * temp, 2**20)  # not far over either
    if slots * columns > 4 * (1 << 22):
        assert phase.activations < 2 * 4 * slots * columns / 4  # not two copies of all


def test_cfl_plans_its_split_only_where_it_is_traced():
    from pfedwn_jax.algorithms.cfl import SPLIT_LIMIT, memory_phases

    base = Sizes(*[0] * len(Sizes._fields))._replace(param=4000, batch=1, steps=1)
    names = lambda slots: [ph.name for ph in memory_phases(base._replace(slots=slots), None)]
    assert "CFL split" in names(SPLIT_LIMIT)
    assert "CFL split" not in names(SPLIT_LIMIT + 1)
