"""The model-splitting methods (FedPer, LG-FedAvg, FedRep, FedBABU, FedRoD) against a plain
per-client reference (full-batch gradient descent, a Python loop over clients), their limits
(head = the whole model), and their runs in run/sweep, network mode and stale lossy links."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY_RUN
from pfl_refs import LR, assert_close, client_data, gd, group_mean, init_list, make_ctx, run
from toy_groups import CLASSES, SHAPE

import pfedwn_jax
from pfedwn_jax import ExperimentConfig
from pfedwn_jax.algorithms import get_algorithm, make_hparams
from pfedwn_jax.engine import per_sample_ce
from pfedwn_jax.models import get_model

BODY, HEAD, ALL = ("fc1", "fc2"), ("out",), ("fc1", "fc2", "out")


def reference(name, ctx, rounds, head_epochs=2):
    models = init_list(ctx)
    for _ in range(rounds):
        if name == "fedrep":
            models = [gd(ctx, m, c, head_epochs, HEAD) for c, m in enumerate(models)]
            models = [gd(ctx, m, c, 1, BODY) for c, m in enumerate(models)]
        elif name == "fedbabu":
            models = [gd(ctx, m, c, 1, BODY) for c, m in enumerate(models)]
        else:
            models = [gd(ctx, m, c, 1, ALL) for c, m in enumerate(models)]
        shared = HEAD if name == "lgfedavg" else BODY
        models = [group_mean(ctx, models, i, shared) for i in range(4)]
    return models


@pytest.mark.parametrize("name", ["fedper", "lgfedavg", "fedrep", "fedbabu"])
def test_two_rounds_equal_the_per_client_reference(name):
    ctx = make_ctx()
    overrides = {"fedrep": {"head_epochs": 2}, "fedbabu": {"finetune_epochs": 0}}.get(name)
    state, params = run(name, ctx, 2, overrides)
    want = reference(name, ctx, 2)
    assert_close(state.clients.params, want)
    assert_close(params, want)
    # the personal parts really differ between slots (else the test proves little)
    personal = "fc1" if name == "lgfedavg" else "out"
    if name != "fedbabu":
        assert np.abs(np.diff(np.asarray(params[personal]["kernel"]), axis=0)).max() > 1e-4


def test_fedbabu_keeps_the_head_at_init_and_evaluates_a_fine_tuned_copy():
    ctx = make_ctx()
    state, params = run("fedbabu", ctx, 2, {"finetune_epochs": 3})
    init = ctx.model.init(jax.random.PRNGKey(0))
    for a in range(4):
        chex.assert_trees_all_equal(
            jax.tree.map(lambda p: p[a], state.clients.params["out"]), init["out"]
        )
    want = reference("fedbabu", ctx, 2)
    tuned = [gd(ctx, m, c, 3, ALL) for c, m in enumerate(want)]
    assert_close(params, tuned)


@pytest.mark.parametrize(
    ("name", "other"), [("fedper", "local"), ("fedrep", "local"), ("lgfedavg", "fedavg")]
)
def test_a_head_that_is_the_whole_model_gives_local_or_fedavg(name, other):
    ctx = make_ctx("logreg")  # its head is the whole model (the body is the identity)
    overrides = {"head_epochs": 1} if name == "fedrep" else None
    _, got = run(name, ctx, 2, overrides)
    _, want = run(other, ctx, 2)
    chex.assert_trees_all_equal(got, want)


def test_fedbabu_with_the_head_the_whole_model_fine_tunes_the_initial_model():
    ctx = make_ctx("logreg")
    _, got = run("fedbabu", ctx, 1, {"finetune_epochs": 2})
    _, want = run("local", make_ctx("logreg", epochs=2), 1)
    chex.assert_trees_all_equal(got, want)


def test_hyperparameters_are_checked_by_name():
    with pytest.raises(ValueError, match=r"hparams\.fedrep\.head_epochs"):
        make_hparams(get_algorithm("fedrep"), {"head_epochs": 0})
    with pytest.raises(ValueError, match=r"hparams\.fedbabu\.finetune_epochs"):
        make_hparams(get_algorithm("fedbabu"), {"finetune_epochs": -1})


def rod_reference(ctx, rounds):
    """FedRoD per client: a full-batch step of the generic model on the balanced softmax and
    of the personal head on CE(g + p), both at the pre-step parameters; then FedAvg."""
    model = ctx.model
    models, heads = init_list(ctx), [ctx.model.init(jax.random.PRNGKey(0))["out"]] * 4
    counts = np.zeros((4, CLASSES))
    for c in range(4):
        np.add.at(counts[c], np.asarray(client_data(ctx, c)[1]), 1)
    for _ in range(rounds):
        for c in range(4):
            x, y = client_data(ctx, c)
            log_n = jnp.log(jnp.maximum(jnp.asarray(counts[c], jnp.float32), 1e-8))
            bsm = lambda p: jnp.mean(per_sample_ce(model.apply(p, x) + log_n, y))
            z = model.features(models[c], x)
            g = model.classify(models[c], z)
            ce = lambda h: jnp.mean(
                per_sample_ce(g + model.classify({**models[c], "out": h}, z), y)
            )
            gm, gh = jax.grad(bsm)(models[c]), jax.grad(ce)(heads[c])
            models[c] = jax.tree.map(lambda p, d: p - LR * d, models[c], gm)
            heads[c] = jax.tree.map(lambda p, d: p - LR * d, heads[c], gh)
        models = [group_mean(ctx, models, i, ALL) for i in range(4)]
    return models, heads


def test_fedrod_two_rounds_equal_the_per_client_reference():
    ctx = make_ctx()
    state, params = run("fedrod", ctx, 2)
    models, heads = rod_reference(ctx, 2)
    assert_close(state.clients.params["model"], models)
    assert_close(state.clients.params["head"], heads)
    summed = [{**m, "out": jax.tree.map(jnp.add, m["out"], h)} for m, h in zip(models, heads)]
    assert_close(params, summed)
    x = ctx.train.x[0, :5]  # the evaluated model's logits are the generic plus the personal
    got = ctx.model.apply(jax.tree.map(lambda p: p[0], params), x)
    z = ctx.model.features(models[0], x)
    want = ctx.model.classify(models[0], z) + ctx.model.classify({**models[0], "out": heads[0]}, z)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


def test_fedrod_generic_model_is_fedavg_on_balanced_classes():
    ctx = make_ctx()
    y = jnp.broadcast_to(jnp.arange(40) % CLASSES, (4, 40)).astype(jnp.int32)
    data = ctx.train._replace(y=y, mask=jnp.ones((4, 40), bool), count=jnp.full(4, 40))
    ctx = ctx.replace(train=data, num_samples=jnp.full(4, 40.0))
    state, _ = run("fedrod", ctx, 2)
    _, fedavg = run("fedavg", ctx, 2)
    for g, w in zip(jax.tree.leaves(state.clients.params["model"]), jax.tree.leaves(fedavg)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


SPLITTING = ("fedper", "lgfedavg", "fedrep", "fedbabu", "fedrod")
SMOKE = {
    **TINY_RUN,
    "model": "mlp",
    "rounds": 2,
    "hparams": {"fedrep": {"head_epochs": 1}, "fedbabu": {"finetune_epochs": 1}},
}


@pytest.mark.parametrize(
    "name", ["fedper", *(pytest.param(n, marks=pytest.mark.slow) for n in SPLITTING[1:])]
)
def test_run_sweep_network_and_stale_lossy_links(name):
    lossy = dict(link_model="bernoulli", link_failure=0.3, stale=True)
    config = ExperimentConfig(**SMOKE, algorithms=(name,), mode="network", **lossy)
    result = pfedwn_jax.run(config, progress=False)
    assert np.all(np.isfinite(result.methods[name]["client_accuracy"]))
    swept = pfedwn_jax.sweep(
        ExperimentConfig(**SMOKE, algorithms=(name,)), seeds=[0, 1], progress=False
    )
    assert np.all(np.isfinite(swept.rows["target_accuracy"]))


def test_a_model_without_a_split_is_refused_before_compiling():
    from flax import nnx

    from pfedwn_jax.models import register_model, unregister_model

    class Plain(nnx.Module):
        def __init__(self, input_shape, num_classes, *, rngs):
            self.out = nnx.Linear(int(np.prod(input_shape)), num_classes, rngs=rngs)

        def __call__(self, x):
            return self.out(x.reshape(x.shape[0], -1).astype(jnp.float32))

    register_model("plain-split-test", Plain)
    try:
        ctx = make_ctx().replace(model=get_model("plain-split-test", CLASSES, SHAPE))
        for name in SPLITTING:
            alg = get_algorithm(name)
            with pytest.raises(ValueError, match=rf"'{name}'.*'plain-split-test'.*HEAD"):
                alg.init(jax.random.PRNGKey(0), ctx, make_hparams(alg))
    finally:
        unregister_model("plain-split-test")


@pytest.mark.slow
def test_splitting_beats_fedavg_on_disjoint_labels():
    """Clients of disjoint label pairs on the same inputs: clients 0 and 2 hold classes 0 and
    1, clients 1 and 3 the same images labelled 2 and 3. One FedAvg model cannot tell class 0
    from 2 (about half right); a personal head (FedPer, FedRep, FedRoD) or personal fine-tuning
    (FedBABU) fits each client's pair. Accuracy on held-out samples of each client's own
    distribution, after 5 rounds."""
    from toy_groups import make_data

    full = make_data([[0, 1]] * 4, n=120, seed=3)
    full = full._replace(y=jnp.asarray(full.y) + 2 * (jnp.arange(4) % 2)[:, None])
    cut = lambda a, lo, hi: jnp.asarray(a)[:, lo:hi]
    train = full._replace(
        x=cut(full.x, 0, 80), y=cut(full.y, 0, 80), mask=cut(full.mask, 0, 80),
        count=jnp.sum(cut(full.mask, 0, 80), axis=1),
    )  # fmt: skip
    test_x, test_y, test_m = cut(full.x, 80, 120), cut(full.y, 80, 120), cut(full.mask, 80, 120)
    ctx = make_ctx(adjacency=np.ones((4, 4), bool)).replace(
        train=train, num_samples=jnp.asarray(train.count, jnp.float32), batch_size=16
    )

    def accuracy(params):
        logits = jax.vmap(ctx.model.apply)(params, test_x)
        hits = (jnp.argmax(logits, -1) == test_y) & test_m
        return float(hits.sum() / test_m.sum())

    acc = {}
    for name in ("fedavg", "fedper", "fedrep", "fedbabu", "fedrod"):
        overrides = {"fedrep": {"head_epochs": 2}, "fedbabu": {"finetune_epochs": 1}}.get(name)
        acc[name] = accuracy(run(name, ctx, 5, overrides)[1])
    print(acc)
    for name in ("fedper", "fedrep", "fedbabu", "fedrod"):
        assert acc[name] > acc["fedavg"] + 0.2, acc
