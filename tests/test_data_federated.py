"""make_federated, stacking, memory, bucketing, and padding invariance of gradients/metrics."""

from __future__ import annotations

import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import decode, indexed_dataset

from pfedwn_jax.data import (
    DEFAULT_DATASET,
    ClientData,
    Dataset,
    bucket_groups,
    bucketize,
    client_label_counts,
    epoch_indices,
    load_dataset,
    make_federated,
    memory_bytes,
    padding_ratio,
    stack_clients,
    steps_per_epoch,
)


@pytest.mark.parametrize("scheme", ["paper", "dirichlet", "pathological", "iid"])
@pytest.mark.parametrize("pool", ["union", "train"])
def test_every_pool_sample_lands_once(scheme, pool):
    ds = indexed_dataset()
    fed = make_federated(ds, 7, scheme, seed=3, min_samples=4, pool=pool, device=False)
    train, test = decode(fed.train), decode(fed.test)
    got = np.sort(np.concatenate(train + test))
    n_pool = 400 if pool == "union" else 300
    np.testing.assert_array_equal(got, np.arange(n_pool))
    labels = np.concatenate([ds.y_train, ds.y_test])
    for cd, ids in ((fed.train, train), (fed.test, test)):  # labels travel with images
        y, mask = np.asarray(cd.y), np.asarray(cd.mask)
        for n in range(7):
            np.testing.assert_array_equal(y[n][mask[n]], labels[ids[n]])
    for n in range(7):  # the 75/25 split, per client
        total = len(train[n]) + len(test[n])
        assert len(train[n]) == round(0.75 * total)


def test_layout_padding_and_determinism():
    fed = make_federated(DEFAULT_DATASET, 11, "paper", seed=0)
    again = make_federated(DEFAULT_DATASET, 11, "paper", seed=0)
    chex.assert_trees_all_equal(fed, again)
    for cd in (fed.train, fed.test):
        assert isinstance(cd.x, jax.Array) and cd.x.dtype == jnp.uint8
        assert cd.x.shape == (11, cd.max_samples, 28, 28, 1)
        assert cd.y.dtype == jnp.int32 and cd.mask.dtype == jnp.bool_
        mask, count = np.asarray(cd.mask), np.asarray(cd.count)
        np.testing.assert_array_equal(mask, np.arange(cd.max_samples) < count[:, None])
        assert cd.max_samples == count.max()
        assert not np.asarray(cd.x)[~mask].any() and not np.asarray(cd.y)[~mask].any()
    counts = client_label_counts(fed)
    assert counts.sum() == 7000 and fed.num_classes == 10
    other = make_federated(DEFAULT_DATASET, 11, "paper", seed=1, device=False)
    assert not np.array_equal(client_label_counts(other), counts)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(train_frac=0.0), "train_frac"),
        (dict(train_frac=1.0), "train_frac"),
        (dict(train_frac=1.5), "train_frac"),
        (dict(train_frac=float("nan")), "train_frac"),
        (dict(pool="test"), "pool"),
        (dict(min_samples=1), "min_samples"),
        (dict(num_clients=401), "exceeds"),
        (dict(alpha=0.0), "alpha"),
        (dict(scheme="shards"), "scheme"),
    ],
)
def test_bad_input_raises_value_error(kwargs, match):
    args = dict(num_clients=5)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        make_federated(indexed_dataset(), args.pop("num_clients"), device=False, **args)


def test_memory_and_padding_hand_computed():
    x = np.arange(10, dtype=np.uint8).reshape(10, 1, 1, 1)
    cd = stack_clients(x, np.arange(10), [np.array([0, 1, 2, 3]), np.array([4]), np.array([5])])
    assert cd.x.shape == (3, 4, 1, 1, 1)
    # 12 slots, 6 real -> 6 padded per 6 real.
    assert padding_ratio(cd) == pytest.approx(1.0)
    # x 12 B + y 12*4 B + mask 12 B + count 3*4 B
    assert memory_bytes(cd) == 12 + 48 + 12 + 12
    assert memory_bytes(cd) == sum(a.nbytes for a in cd)
    dev = ClientData(*(jnp.asarray(a) for a in cd))
    assert memory_bytes(dev) == sum(a.nbytes for a in dev)


def brute_force_cost(count, num_buckets):
    best = None
    for assign in itertools.product(range(num_buckets), repeat=len(count)):
        assign = np.array(assign)
        cost = sum(
            (assign == b).sum() * count[assign == b].max()
            for b in range(num_buckets)
            if (assign == b).any()
        )
        best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("num_buckets", [1, 2, 3])
def test_bucket_groups_are_optimal(seed, num_buckets):
    count = np.random.default_rng(seed).integers(1, 500, size=6)
    groups = bucket_groups(count, num_buckets)
    np.testing.assert_array_equal(np.sort(np.concatenate(groups)), np.arange(6))
    cost = sum(len(g) * count[g].max() for g in groups)
    assert cost == brute_force_cost(count, num_buckets)


def test_bucketize_preserves_every_client():
    fed = make_federated(DEFAULT_DATASET, 11, "paper", seed=0, device=False)
    buckets = bucketize(fed.train, 3)
    assert sum(memory_bytes(b) for _, b in buckets) < memory_bytes(fed.train)
    assert sum(padding_ratio(b) * int(b.count.sum()) for _, b in buckets) < padding_ratio(
        fed.train
    ) * int(fed.train.count.sum())
    for ids, b in buckets:
        np.testing.assert_array_equal(b.count, fed.train.count[ids])
        for row, n in enumerate(ids):
            c = int(fed.train.count[n])
            np.testing.assert_array_equal(b.x[row, :c], fed.train.x[n, :c])
            np.testing.assert_array_equal(b.y[row, :c], fed.train.y[n, :c])
            assert b.mask[row].sum() == c


def masked_loss_and_accuracy(params, cd: ClientData, idx, valid):
    """Per-client epoch of a linear model: the masked objective the engine uses."""

    def step(x, y, w):
        logits = x.reshape(x.shape[0], -1).astype(jnp.float32) / 255.0 @ params
        ce = -jax.nn.log_softmax(logits)[jnp.arange(y.shape[0]), y]
        loss = jnp.sum(w * ce) / jnp.maximum(jnp.sum(w), 1.0)
        correct = jnp.sum(w * (jnp.argmax(logits, -1) == y))
        return loss, correct

    def client(x, y, idx_c, valid_c):
        w = valid_c.astype(jnp.float32)
        loss, correct = jax.vmap(step)(x[idx_c], y[idx_c], w)
        return loss.sum(), correct.sum()

    return jax.vmap(client)(cd.x, cd.y, idx, valid)


def test_padded_values_never_change_gradients_or_metrics():
    full = load_dataset()
    small = Dataset(
        full.x_train[:1200], full.y_train[:1200], full.x_test[:0], full.y_test[:0], 10, "small"
    )
    cd = make_federated(small, 5, "paper", seed=2, device=False).train
    steps = steps_per_epoch(int(cd.count.max()), 32)
    idx, valid = epoch_indices(jax.random.key(0), jnp.asarray(cd.count), cd.max_samples, 32, steps)
    params = jax.random.normal(jax.random.key(1), (784, 10)) * 0.01
    rng = np.random.default_rng(0)
    x_bad, y_bad = np.array(cd.x), np.array(cd.y)
    x_bad[~cd.mask] = rng.integers(0, 256, size=x_bad[~cd.mask].shape, dtype=np.uint8)
    y_bad[~cd.mask] = rng.integers(0, 10, size=y_bad[~cd.mask].shape)
    bad = cd._replace(x=x_bad, y=y_bad)
    assert not np.array_equal(bad.x, cd.x)

    def loss_grad_correct(p, d):
        total = lambda q: masked_loss_and_accuracy(q, d, idx, valid)[0].sum()
        return jax.value_and_grad(total)(p), masked_loss_and_accuracy(p, d, idx, valid)[1]

    fn = jax.jit(loss_grad_correct)
    ((l1, g1), c1), ((l2, g2), c2) = fn(params, cd), fn(params, bad)
    np.testing.assert_array_equal(np.asarray(l1), np.asarray(l2))
    np.testing.assert_array_equal(np.asarray(g1), np.asarray(g2))
    np.testing.assert_array_equal(np.asarray(c1), np.asarray(c2))
    assert np.asarray(g1).any() and int(np.asarray(c1).sum()) > 0
    # every real sample is visited exactly once per epoch (the last partial batch is kept)
    for n in range(cd.num_clients):
        seen = np.asarray(idx[n])[np.asarray(valid[n])]
        np.testing.assert_array_equal(np.sort(seen), np.arange(int(cd.count[n])))
