"""Property-based checks (hypothesis) where the input space is large: `make_federated`,
padding invariance of training and evaluation, and config round-trips (the partition
property itself lives in `test_data_partition.py`).

Each test keeps `max_examples` small so the whole file runs in well under a minute; JAX
compiles on new shapes, hence `deadline=None` (set by the conftest profile).
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import (
    CLASSES,
    SHAPE,
    B,
    M,
    decode,
    indexed_dataset,
    json_roundtrip,
    make_data,
    toml_text,
)
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pfedwn_jax.algorithms import available_algorithms, get_algorithm, make_hparams
from pfedwn_jax.data import (
    SCHEMES,
    ClientData,
    client_label_counts,
    make_federated,
)
from pfedwn_jax.engine import evaluate, init_client_state, local_train
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.config import MODES
from pfedwn_jax.models import available_models
from pfedwn_jax.wireless import MOMENT_MODES, ChannelParams

# --------------------------------------------------------------------------- partitions


@settings(max_examples=30)
@given(
    scheme=st.sampled_from(SCHEMES),
    pool=st.sampled_from(["union", "train"]),
    num_clients=st.integers(1, 12),
    classes=st.integers(2, 8),
    n_train=st.integers(60, 400),
    n_test=st.integers(0, 150),
    train_frac=st.floats(0.05, 0.95),
    seed=st.integers(0, 2**32 - 1),
)
def test_make_federated_loses_and_duplicates_no_sample(
    scheme, pool, num_clients, classes, n_train, n_test, train_frac, seed
):
    """Every pool sample lands in exactly one client's train or test split, with its label;
    masks, counts and the per-client train share agree."""
    ds = indexed_dataset(n_train, n_test, classes, seed=seed % 1000)
    n_pool = n_train + n_test if pool == "union" else n_train
    min_samples = 2
    assume(num_clients * min_samples <= n_pool)
    fed = make_federated(
        ds,
        num_clients,
        scheme,
        seed=seed,
        pool=pool,
        train_frac=train_frac,
        min_samples=min_samples,
        classes_per_client=-(-classes // num_clients),
        device=False,
    )
    train, test = decode(fed.train), decode(fed.test)
    np.testing.assert_array_equal(np.sort(np.concatenate(train + test)), np.arange(n_pool))
    labels = np.concatenate([ds.y_train, ds.y_test])
    for cd, ids in ((fed.train, train), (fed.test, test)):
        mask, count = np.asarray(cd.mask), np.asarray(cd.count)
        np.testing.assert_array_equal(count, mask.sum(1))
        np.testing.assert_array_equal(mask, np.arange(cd.max_samples) < count[:, None])
        y = np.asarray(cd.y)
        for n in range(num_clients):
            np.testing.assert_array_equal(y[n][mask[n]], labels[ids[n]])
        assert not np.asarray(cd.x)[~mask].any() and not y[~mask].any()
    for n in range(num_clients):
        total = len(train[n]) + len(test[n])
        assert total >= min_samples
        assert len(train[n]) == int(np.clip(round(train_frac * total), 1, total - 1))
    per_client = client_label_counts(fed)
    np.testing.assert_array_equal(
        per_client.sum(0), np.bincount(labels[:n_pool], minlength=classes)
    )


# --------------------------------------------------------------------------- padding


def pad_samples(data: ClientData, extra: int, junk_seed: int) -> ClientData:
    """`data` with `extra` more padded samples per client, filled with junk images/labels."""
    rng = np.random.default_rng(junk_seed)
    n = data.num_clients
    junk_x = rng.integers(0, 256, (n, extra, *SHAPE), dtype=np.uint8)
    junk_y = rng.integers(0, CLASSES, (n, extra)).astype(np.int32)
    return ClientData(
        jnp.concatenate([data.x, jnp.asarray(junk_x)], axis=1),
        jnp.concatenate([data.y, jnp.asarray(junk_y)], axis=1),
        jnp.concatenate([data.mask, jnp.zeros((n, extra), bool)], axis=1),
        data.count,
    )


def append_slot(tree):
    """`tree` with one more slot at the end (a copy of slot 0)."""
    return jax.tree.map(lambda a: jnp.concatenate([a, a[:1]]), tree)


def take(tree, index):
    """The slots `index` of every leaf."""
    return jax.tree.map(lambda a: a[index], tree)


def append_empty_client(data: ClientData) -> ClientData:
    """`data` with one more data client that has no samples."""
    return jax.tree.map(lambda a: jnp.concatenate([a, jnp.zeros_like(a[:1])]), data)


OPT = optax.sgd(0.1)
# Shapes stay fixed (4 clients, the last one full, so the steps per epoch are too) and only
# the counts vary: a few compilations serve every example.
counts_st = st.lists(st.integers(0, M), min_size=3, max_size=3).map(lambda c: np.array([*c, M]))


@settings(max_examples=15)
@given(
    counts=counts_st,
    extra=st.sampled_from([1, 5]),
    seed=st.integers(0, 2**16),
    junk_seed=st.integers(1, 2**16),
)
def test_padded_samples_and_an_empty_slot_never_change_evaluation(
    toy_model, counts, extra, seed, junk_seed
):
    """More padded samples (holding junk) per client, and one more slot evaluating an empty
    client, give every real slot the same loss and accuracy."""
    data = make_data(counts, seed=seed)
    dc = np.arange(len(counts))
    params = init_client_state(toy_model, OPT, jax.random.key(seed), len(dc), False).params
    base = evaluate(toy_model, params, data, dc)
    padded = evaluate(toy_model, params, pad_samples(data, extra, junk_seed), dc)
    chex.assert_trees_all_close(padded, base, rtol=1e-6, atol=1e-7)
    out = evaluate(toy_model, append_slot(params), append_empty_client(data), np.arange(5))
    chex.assert_trees_all_close(take(out, slice(0, -1)), base, rtol=1e-6, atol=1e-7)
    assert out["loss"][-1] == 0.0 and out["accuracy"][-1] == 0.0


@pytest.mark.slow  # the engine tests keep padded steps and inactive slots in the quick tier
@settings(max_examples=6)
@given(counts=counts_st, seed=st.integers(0, 2**16), junk_seed=st.integers(1, 2**16))
def test_padded_samples_and_an_inactive_slot_never_change_training(
    toy_model, counts, seed, junk_seed
):
    """Junk in the padded samples changes no bit of local training, and one more slot that is
    inactive leaves the real slots' results bit for bit as they were. Strategy `map` runs each
    slot alone, so the results must be identical (test_engine covers the batched strategies'
    padding on fixed cases; two compilations serve every example here)."""
    opt = optax.sgd(0.1, momentum=0.5)
    clean = make_data(counts, seed=seed)
    junk = make_data(counts, seed=seed, pad_seed=junk_seed)
    dc = np.arange(len(counts))
    state = init_client_state(toy_model, opt, jax.random.key(seed), len(dc), same_init=False)
    key = jax.random.key(seed + 1)
    kw = dict(batch_size=B, strategy="map")
    a, ma = local_train(toy_model, opt, state, clean, dc, key, **kw)
    b, mb = local_train(toy_model, opt, state, junk, dc, key, **kw)
    chex.assert_trees_all_equal((a, ma), (b, mb))
    more = append_slot(state)
    active = np.arange(len(dc) + 1) < len(dc)
    c, mc = local_train(toy_model, opt, more, clean, np.append(dc, 0), key, active=active, **kw)
    chex.assert_trees_all_equal(take((c, mc), slice(0, -1)), (a, ma))
    chex.assert_trees_all_equal(take(c, -1), take(more, -1))  # the inactive slot: unchanged


# --------------------------------------------------------------------------- config


def _hparam_values(alg: str) -> st.SearchStrategy:
    """Valid overrides of some of `alg`'s hyperparameter fields, drawn by the field's type."""
    by_type = {
        float: st.floats(1e-3, 1.0),  # inside every float field's allowed range
        int: st.integers(1, 10),
        bool: st.booleans(),
    }
    optional = {}
    for f in dataclasses.fields(get_algorithm(alg).hparams):
        kind = type(f.default)
        optional[f.name] = by_type.get(kind, st.just(f.default))
    overrides = st.fixed_dictionaries({}, optional=optional)

    def valid(o: dict) -> bool:
        try:
            make_hparams(get_algorithm(alg), o)
        except ValueError:
            return False
        return True

    return overrides.filter(valid)


text_st = st.text(min_size=1, max_size=12)
positive_st = st.floats(0.0, 1e6, exclude_min=True)
seed_st = st.integers(0, 2**32 - 1)
# A valid override of any ChannelParams field: an int where the default is one, else a float.
channel_values = {
    f.name: st.integers(1, 64) if isinstance(f.default, int) else st.floats(1e-3, 1e3)
    for f in dataclasses.fields(ChannelParams)
    if f.name not in ("fading", "shadowing_db")  # config fields of their own
}


@st.composite
def configs(draw) -> ExperimentConfig:
    """Any valid `ExperimentConfig`."""
    num_neighbors = draw(st.integers(1, 50))
    hparam_algs = draw(st.lists(st.sampled_from(available_algorithms()), unique=True))
    return ExperimentConfig(
        dataset=draw(st.none() | text_st),
        data_dir=draw(st.none() | text_st),
        partition=draw(st.sampled_from(SCHEMES)),
        alpha=draw(positive_st),
        train_frac=draw(st.floats(0.0, 1.0, exclude_min=True, exclude_max=True)),
        data_seed=draw(st.none() | seed_st),
        model=draw(st.sampled_from(available_models())),
        algorithms=tuple(draw(st.lists(st.sampled_from(available_algorithms()), unique=True))),
        hparams={alg: draw(_hparam_values(alg)) for alg in hparam_algs},
        rounds=draw(st.integers(1, 10**6)),
        local_epochs=draw(st.integers(1, 100)),
        local_steps=draw(st.none() | st.integers(1, 10**4)),
        batch_size=draw(st.integers(1, 4096)),
        lr=draw(positive_st),
        momentum=draw(st.floats(0.0, 1.0, exclude_max=True)),
        seed=draw(seed_st),
        mode=draw(st.sampled_from(MODES)),
        num_neighbors=num_neighbors,
        gamma_th=draw(positive_st),
        eps=draw(st.floats(0.0, 1.0, exclude_min=True, exclude_max=True)),
        moments=draw(st.sampled_from(MOMENT_MODES)),
        topology_seed=draw(seed_st),
        target=draw(st.integers(0, num_neighbors) | st.just("random")),
        channel=draw(st.fixed_dictionaries({}, optional=channel_values)),
    )


@settings(max_examples=40)
@given(cfg=configs())
def test_config_roundtrips_through_dict_and_json(cfg):
    assert ExperimentConfig.from_dict(cfg.to_dict()) == cfg
    assert ExperimentConfig.from_dict(json_roundtrip(cfg.to_dict())) == cfg


@settings(max_examples=40)
@given(cfg=configs())
def test_config_roundtrips_through_toml(cfg, tmp_path_factory):
    path = tmp_path_factory.mktemp("toml") / "exp.toml"
    path.write_text(toml_text(cfg.to_dict()), encoding="utf-8")
    back = ExperimentConfig.from_toml(path)
    assert back == cfg
    for name in ExperimentConfig.field_names():  # same types too (1.0 stays a float)
        assert type(getattr(back, name)) is type(getattr(cfg, name)), name
