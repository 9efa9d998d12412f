"""Engine: the vectorized local_train against a plain per-client Python loop, padding and
activity invariances, evaluation against per-pair references, pytree helpers, validation."""

from __future__ import annotations

from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import CLASSES, COUNTS, SHAPE, B, M, make_data

from pfedwn_jax.data.client_data import ClientData
from pfedwn_jax.engine import (
    ClientState,
    cross_evaluate,
    evaluate,
    init_client_state,
    local_train,
    mix,
    slot_batches,
    sq_dist,
    where_slots,
)
from pfedwn_jax.models import get_model

LR = 0.1
DATA_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


@pytest.fixture(scope="module")
def model():
    return get_model("mlp", CLASSES, SHAPE)


@pytest.fixture(scope="module")
def data():
    return make_data()


def leaves(tree):
    return [np.asarray(a) for a in jax.tree.leaves(tree)]


def reference_train(
    model,
    params,
    data,
    data_client,
    key,
    *,
    epochs=1,
    momentum=None,
    sample_weight=None,
    prox=None,
    active=None,
):
    """Plain per-client Python loop of minibatch SGD, replaying the engine's batch schedule.

    The objective is written out here: sum_i w_i * (-log softmax(logits_i)[y_i]) / #real,
    plus prox[0]/2 * ||p - prox[1][s]||^2 when given; SGD (and heavy-ball momentum) by hand.
    """
    counts = np.asarray(data.count)[np.asarray(data_client)]
    if active is not None:
        counts = counts * np.asarray(active)
    steps = -(-M // B)  # more steps than the engine's: trailing padded steps must not matter
    idx, valid = slot_batches(
        jax.random.split(key)[0], jnp.asarray(counts), M, B, epochs=epochs, steps_per_epoch=steps
    )
    idx, valid = np.asarray(idx), np.asarray(valid)

    @jax.jit
    def grad(p, x, y, w, nvalid, anchor):
        def loss(p):
            logp = jax.nn.log_softmax(model.apply(p, x))
            ce = -logp[jnp.arange(x.shape[0]), y]
            out = jnp.sum(w * ce) / nvalid
            if prox is not None:
                out += (
                    prox[0]
                    / 2
                    * sum(
                        jnp.sum((a - b) ** 2)
                        for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(anchor))
                    )
                )
            return out

        return jax.grad(loss)(p)

    out = []
    for s, n in enumerate(np.asarray(data_client)):
        p = jax.tree.map(lambda a, s=s: a[s], params)
        anchor = None if prox is None else jax.tree.map(lambda a, s=s: a[s], prox[1])
        mom = jax.tree.map(jnp.zeros_like, p)
        for t in range(idx.shape[1]):
            v = valid[s, t]
            if not v.any():
                continue
            ii = idx[s, t]
            w = v.astype(np.float32)
            if sample_weight is not None:
                w = w * np.asarray(sample_weight)[s, ii]
            g = grad(p, data.x[n, ii], data.y[n, ii], w, float(v.sum()), anchor)
            if momentum is not None:
                mom = jax.tree.map(lambda m, g: momentum * m + g, mom, g)
                g = mom
            p = jax.tree.map(lambda a, g: a - LR * g, p, g)
        out.append(p)
    return jax.tree.map(lambda *a: jnp.stack(a), *out)


@pytest.fixture(scope="module")
def loop_case(model, data):
    """Slots, initial state and the Python-loop reference, shared by the strategy cases."""
    opt = optax.sgd(LR)
    dc = np.array([0, 1, 2, 3, 4, 0])  # client 0 in two slots; client 2 has no data
    state = init_client_state(model, opt, jax.random.key(0), len(dc), same_init=False)
    key = jax.random.key(7)
    ref = reference_train(model, state.params, data, dc, key, epochs=2)
    return opt, dc, state, key, ref


@pytest.mark.parametrize(("strategy", "chunk"), [("vmap", None), ("map", None), ("chunked", 4)])
def test_local_train_matches_python_loop(model, data, loop_case, strategy, chunk):
    opt, dc, state, key, ref = loop_case
    new, metrics = local_train(
        model,
        opt,
        state,
        data,
        dc,
        key,
        batch_size=B,
        epochs=2,
        strategy=strategy,
        chunk_size=chunk,
    )
    chex.assert_trees_all_close(new.params, ref, rtol=2e-5, atol=2e-6)
    expect_steps = 2 * -(-COUNTS[dc] // B)
    np.testing.assert_array_equal(metrics["steps"], expect_steps)
    assert np.all(np.isfinite(metrics["loss"]))
    assert metrics["loss"][2] == 0.0  # no data, no steps


def test_momentum_weights_prox_and_activity_match_python_loop(model, data):
    """Optimizer state, sample weights, a FedProx-style loss_fn with aux, inactive slots."""
    opt = optax.sgd(LR, momentum=0.9)
    dc = np.array([3, 0, 1, 4])
    active = np.array([True, True, False, True])
    state = init_client_state(model, opt, jax.random.key(1), len(dc), same_init=False)
    anchor = init_client_state(model, opt, jax.random.key(2), len(dc), same_init=False).params
    sw = np.random.default_rng(3).uniform(0.0, 2.0, (len(dc), M)).astype(np.float32)
    mu = 0.5

    def loss_fn(params, x, y, w, aux_s):
        logp = jax.nn.log_softmax(model.apply(params, x))
        ce = -jnp.take_along_axis(logp, y[:, None], axis=1)[:, 0]
        prox = sum(
            jnp.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(aux_s))
        )
        # sample weights are > 0 here, so w > 0 marks the real samples
        return jnp.sum(w * ce) / jnp.maximum(jnp.sum(w > 0), 1) + mu / 2 * prox

    key = jax.random.key(11)
    new, metrics = local_train(
        model,
        opt,
        state,
        data,
        dc,
        key,
        batch_size=B,
        loss_fn=loss_fn,
        aux=anchor,
        sample_weight=sw,
        active=active,
        strategy="chunked",
        chunk_size=3,
    )
    ref = reference_train(
        model,
        state.params,
        data,
        dc,
        key,
        momentum=0.9,
        sample_weight=sw,
        prox=(mu, anchor),
        active=active,
    )
    chex.assert_trees_all_close(new.params, ref, rtol=2e-5, atol=2e-6)
    # the inactive slot is bit-for-bit unchanged, optimizer state included
    take = lambda t, s: jax.tree.map(lambda a: a[s], t)
    chex.assert_trees_all_equal(take(new, 2), take(state, 2))
    assert metrics["steps"][2] == 0


def test_padded_values_and_padded_steps_change_nothing(model):
    opt = optax.sgd(LR, momentum=0.5)
    clean, junk = make_data(), make_data(pad_seed=99)
    assert not np.array_equal(clean.x, junk.x)  # the padded entries really differ
    dc = np.array([0, 1, 3, 4])
    state = init_client_state(model, opt, jax.random.key(0), len(dc))
    key = jax.random.key(5)
    for strategy in ("vmap", "chunked"):
        kw = dict(batch_size=B, epochs=2, strategy=strategy, chunk_size=3)
        a, ma = local_train(model, opt, state, clean, dc, key, **kw)
        b, mb = local_train(model, opt, state, junk, dc, key, **kw)
        chex.assert_trees_all_equal(a, b)
        np.testing.assert_array_equal(ma["loss"], mb["loss"])
    # Padded steps: a fifth slot with a client of M samples adds trailing (padded) steps for
    # the smaller clients' schedules; their results do not move.
    big = make_data(counts=np.array([11, 5, 0, 9, 3, M]))
    c, _ = local_train(
        model,
        opt,
        init_client_state(model, opt, jax.random.key(0), 5),
        big,
        np.array([0, 1, 3, 4, 5]),
        key,
        batch_size=B,
        epochs=2,
        strategy="map",
    )
    d, _ = local_train(model, opt, state, big, dc, key, batch_size=B, epochs=2, strategy="map")
    chex.assert_trees_all_equal(jax.tree.map(lambda v: v[:4], c), d)


def test_grad_fn_gets_per_slot_per_step_keys(model, data):
    """A grad_fn whose 'gradient' is a key-derived constant: SGD sums exactly those values."""
    opt = optax.sgd(1.0)
    dc = np.array([0, 1, 2])
    state = init_client_state(model, opt, jax.random.key(0), len(dc))

    def grad_fn(params, x, y, w, aux_s, key):
        u = jax.random.uniform(key)
        return u, jax.tree.map(lambda a: jnp.full_like(a, u), params)

    key = jax.random.key(3)
    new, metrics = local_train(
        model,
        opt,
        state,
        data,
        dc,
        key,
        batch_size=B,
        num_steps=3,
        grad_fn=grad_fn,
        strategy="chunked",
        chunk_size=2,
    )
    grad_key = jax.random.split(key)[1]
    for s, n in enumerate(dc):
        us = [
            float(jax.random.uniform(jax.random.fold_in(jax.random.fold_in(grad_key, s), t)))
            for t in range(3)
        ]
        expect = -sum(us) if COUNTS[n] > 0 else 0.0
        delta = leaves(new.params)[0][s] - leaves(state.params)[0][s]
        np.testing.assert_allclose(delta, expect, rtol=1e-5, atol=1e-6)
        assert metrics["steps"][s] == (3 if COUNTS[n] > 0 else 0)


def test_slot_batches_schedules():
    count = jnp.array([11, 5, 0, 2])
    idx, valid = slot_batches(jax.random.key(0), count, M, B, epochs=2, steps_per_epoch=3)
    idx, valid = np.asarray(idx), np.asarray(valid)
    assert idx.shape == valid.shape == (4, 6, B)
    for s, c in enumerate(np.asarray(count)):
        for e in range(2):  # every real sample exactly once per epoch
            seen = idx[s, 3 * e : 3 * e + 3][valid[s, 3 * e : 3 * e + 3]]
            np.testing.assert_array_equal(np.sort(seen), np.arange(c))
    idx, valid = slot_batches(jax.random.key(1), count, M, B, num_steps=5)
    idx, valid = np.asarray(idx), np.asarray(valid)
    assert idx.shape == (4, 5, B)
    for s, c in enumerate(np.asarray(count)):
        for t in range(5):  # min(count, B) distinct real samples per step
            picked = idx[s, t][valid[s, t]]
            assert len(picked) == min(c, B) and len(set(picked)) == len(picked)
            assert np.all(picked < c)


@pytest.mark.parametrize("block", [M, 4, 3, 1])  # one block; blocks that divide M; not
def test_cross_evaluate_and_evaluate_match_per_pair_reference(model, data, block):
    opt = optax.sgd(LR)
    state = init_client_state(model, opt, jax.random.key(4), 3, same_init=False)
    ms = np.array([0, 2, 1, 2, 0])
    dc = np.array([1, 0, 4, 2, 3])
    out = cross_evaluate(model, state.params, data, ms, dc, chunk_size=2, block_size=block)
    apply = jax.jit(model.apply)
    for p, (m, n) in enumerate(zip(ms, dc, strict=True)):
        logits = np.asarray(
            apply(jax.tree.map(lambda a, m=m: a[m], state.params), data.x[n]), dtype=np.float64
        )
        logz = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
        y = np.asarray(data.y[n])
        ce = logz - logits[np.arange(M), y]
        real = np.arange(M) < COUNTS[n]
        np.testing.assert_allclose(out["loss"][p], np.where(real, ce, 0), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out["correct"][p], np.where(real, logits.argmax(1) == y, 0))
    ev = evaluate(model, state.params, data, np.array([3, 2, 0]))
    for s, n in enumerate([3, 2, 0]):
        pair = cross_evaluate(model, state.params, data, np.array([s]), np.array([n]))
        c = max(COUNTS[n], 1)
        np.testing.assert_allclose(ev["loss"][s], pair["loss"].sum() / c, rtol=1e-6)
        np.testing.assert_allclose(ev["accuracy"][s], pair["correct"].sum() / c, rtol=1e-6)
    assert ev["accuracy"][1] == 0.0  # client without samples


def test_tree_helpers_against_numpy():
    rng = np.random.default_rng(0)
    params = {
        "a": jnp.asarray(rng.normal(size=(4, 3, 2)), jnp.float32),
        "b": {"c": jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)},
    }
    mat = rng.uniform(size=(4, 4)).astype(np.float32)
    mixed = mix(params, mat)
    for name, leaf in [("a", params["a"]), ("c", params["b"]["c"])]:
        got = mixed["a"] if name == "a" else mixed["b"]["c"]
        expect = sum(mat[:, j, None] * np.asarray(leaf)[j].reshape(1, -1) for j in range(4))
        np.testing.assert_allclose(np.asarray(got).reshape(4, -1), expect, rtol=1e-5)
    flat = np.concatenate(
        [np.asarray(params["a"]).reshape(4, -1), np.asarray(params["b"]["c"])], axis=1
    ).astype(np.float64)
    expect = ((flat[:, None, :] - flat[None, :, :]) ** 2).sum(-1)
    d = np.asarray(sq_dist(params))
    np.testing.assert_allclose(d, expect, rtol=1e-5)
    np.testing.assert_array_equal(np.diag(d), 0.0)
    np.testing.assert_array_equal(d, d.T)
    other = jax.tree.map(lambda a: a + 1.0, params)
    sel = where_slots(jnp.array([True, False, True, False]), params, other)
    np.testing.assert_array_equal(sel["a"][1], other["a"][1])
    np.testing.assert_array_equal(sel["a"][2], params["a"][2])


def test_init_state_and_donation(model, data):
    opt = optax.sgd(LR, momentum=0.9)
    same = init_client_state(model, opt, jax.random.key(0), 3)
    diff = init_client_state(model, opt, jax.random.key(0), 3, same_init=False)
    assert isinstance(same, ClientState) and same.num_slots == 3
    w_same, w_diff = leaves(same.params)[1], leaves(diff.params)[1]
    np.testing.assert_array_equal(w_same[0], w_same[2])
    assert not np.array_equal(w_diff[0], w_diff[2])
    assert all(a.shape[0] == 3 for a in leaves(same.opt_state))
    dc = np.array([0, 1, 3])
    key = jax.random.key(1)
    kept, _ = local_train(model, opt, same, data, dc, key, batch_size=B)
    copy = jax.tree.map(jnp.copy, same)
    donated, _ = local_train(model, opt, copy, data, dc, key, batch_size=B, donate=True)
    chex.assert_trees_all_equal(kept, donated)


def test_validation_errors(model, data):
    opt = optax.sgd(LR)
    state = init_client_state(model, opt, jax.random.key(0), 2)
    dc = np.array([0, 1])
    key = jax.random.key(0)
    cases = [
        (dict(data_client=np.array([0, 5])), "data_client must be in"),
        (dict(data_client=np.array([0, 1, 2])), "data_client has 3 entries"),
        (dict(batch_size=0), "batch_size must be in"),
        (dict(batch_size=(4, 4)), r"batch_size must be an integer; got \(4, 4\)"),
        (dict(batch_size="4"), "batch_size must be an integer; got '4'"),
        (dict(epochs=0), "epochs must be in"),
        (dict(num_steps=0), "num_steps must be in"),
        (dict(strategy="pmap"), "strategy must be one of"),
        (dict(chunk_size=0), "chunk_size must be in"),
        (dict(shards=0), "shards must be in"),
        (dict(shards=jax.device_count() + 1), "exceeds the"),
        (dict(sample_weight=np.ones((2, 3))), "sample_weight must have shape"),
        (dict(sample_weight=-np.ones((2, M))), "sample_weight must be in"),
        (dict(active=np.ones(3, bool)), "active must have shape"),
        (dict(aux=np.ones((3, 2))), "aux must have leading axis"),
    ]
    for override, msg in cases:
        kw = dict(data_client=dc, batch_size=B) | override
        dc_ = kw.pop("data_client")
        with pytest.raises(ValueError, match=msg):
            local_train(model, opt, state, data, dc_, key, **kw)
    other = get_model("mlp", CLASSES, (8, 8, 1))
    with pytest.raises(ValueError, match="built for input_shape"):
        local_train(other, opt, state, data, dc, key, batch_size=B)
    with pytest.raises(ValueError, match="model_slot must be in"):
        cross_evaluate(model, state.params, data, np.array([2]), np.array([0]))


def test_mlp_learns_real_mnist():
    path = DATA_DIR / "mnist_10k_2k.npz"
    if not path.exists():
        pytest.skip(f"real data file missing: {path}")
    raw = np.load(path)
    n_train, n_test = 1200, 400
    x = raw["x_train"][:n_train, :, :, None][None]
    y = raw["y_train"][:n_train].astype(np.int32)[None]
    xt = raw["x_test"][:n_test, :, :, None][None]
    yt = raw["y_test"][:n_test].astype(np.int32)[None]
    train = ClientData(
        jnp.asarray(x), jnp.asarray(y), jnp.ones(y.shape, bool), jnp.array([n_train], jnp.int32)
    )
    test = ClientData(
        jnp.asarray(xt), jnp.asarray(yt), jnp.ones(yt.shape, bool), jnp.array([n_test], jnp.int32)
    )
    mlp = get_model("mlp", 10, (28, 28, 1))
    opt = optax.sgd(0.1)
    state = init_client_state(mlp, opt, jax.random.key(0), 1)
    before = evaluate(mlp, state.params, test, np.array([0]))["accuracy"][0]
    state, _ = local_train(
        mlp, opt, state, train, np.array([0]), jax.random.key(1), batch_size=32, epochs=3
    )
    after = evaluate(mlp, state.params, test, np.array([0]))["accuracy"][0]
    assert before < 0.3 and after > 0.7, (before, after)  # chance is 0.1
