"""The validation split (carved from each client's training data), the paper's partition
options from the config, and the runner's per-round validation accuracy."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from helpers import TINY_RUN, decode, indexed_dataset

from pfedwn_jax import run
from pfedwn_jax.cli.run import add_config_flags, config_from_args
from pfedwn_jax.data import make_federated
from pfedwn_jax.data.federate import class_options, split_validation
from pfedwn_jax.data.partition import partition
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.setup import load_data

DATA = indexed_dataset(n_train=400, n_test=100, classes=5)


def _fed(**kw):
    return make_federated(DATA, 6, "paper", seed=3, min_samples=4, device=False, **kw)


def test_split_validation_is_disjoint_from_train_and_comes_from_it():
    rng = np.random.default_rng(0)
    parts = [np.sort(rng.choice(1000, size=n, replace=False)) for n in (0, 1, 2, 7, 40)]
    train, val = split_validation(parts, 0.25, seed=5)
    for p, t, v in zip(parts, train, val, strict=True):
        assert not set(t) & set(v)
        np.testing.assert_array_equal(np.sort(np.r_[t, v]), p)  # exactly the old train part
    # round(0.25 n), at least one when n >= 2, never every sample
    assert [len(v) for v in val] == [0, 0, 1, 2, 10]
    assert all(len(t) >= 1 for t, p in zip(train, parts, strict=True) if len(p))
    same, empty = split_validation(parts, 0.0, seed=5)
    assert all(a is b for a, b in zip(same, parts, strict=True))
    assert all(len(v) == 0 for v in empty)


def test_make_federated_val_fraction_0_is_unchanged_and_positive_carves_train():
    base, zero = (
        make_federated(DATA, 6, "paper", seed=3, min_samples=4, device=False),
        _fed(val_fraction=0.0),
    )
    assert zero.val is None and base.val is None
    for split in ("train", "test"):
        for a, b in zip(getattr(base, split), getattr(zero, split), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    fed = _fed(val_fraction=0.3)
    old_train, train, val = decode(base.train), decode(fed.train), decode(fed.val)
    for n in range(6):
        assert not set(train[n]) & set(val[n])  # disjoint
        np.testing.assert_array_equal(np.sort(np.r_[train[n], val[n]]), np.sort(old_train[n]))
        assert len(val[n]) == max(1, round(0.3 * len(old_train[n])))
    for a, b in zip(decode(base.test), decode(fed.test), strict=True):
        np.testing.assert_array_equal(a, b)  # the test split is untouched
    np.testing.assert_array_equal(np.asarray(fed.val.y)[np.asarray(fed.val.mask)],
                                  DATA_LABELS[np.concatenate(val)])  # fmt: skip


DATA_LABELS = np.r_[DATA.y_train, DATA.y_test]


def test_max_classes_bounds_the_papers_class_draw():
    """With a near-even Dirichlet (alpha = 1000) every holder gets samples, so the classes a
    client holds are the ones it drew: in 1..k, about (k + 1) / 2 on average (100 clients:
    the standard error of the mean is 0.08 for k = 3, 0.29 for k = 10); with 100 clients a
    class nobody drew (given to a random client on top) has probability 0.8^100."""
    labels = np.random.default_rng(1).integers(0, 10, size=20000)
    held = lambda parts: np.array([len(np.unique(labels[p])) for p in parts])
    kw = dict(seed=2, min_samples=0, alpha=1000.0)
    default = partition(labels, 100, "paper", **kw)
    np.testing.assert_array_equal(  # None is the paper's U{1..C}: the same random stream
        np.concatenate(default),
        np.concatenate(partition(labels, 100, "paper", **kw, max_classes=10)),
    )
    three = held(partition(labels, 100, "paper", **kw, max_classes=3))
    assert three.min() >= 1 and three.max() <= 3 and abs(three.mean() - 2.0) < 0.33
    assert abs(held(default).mean() - 5.5) < 1.2 and held(default).max() > 3
    with pytest.raises(ValueError, match="max_classes"):
        partition(labels, 4, "dirichlet", seed=0, max_classes=2)
    with pytest.raises(ValueError, match="max_classes"):
        partition(labels, 4, "paper", seed=0, max_classes=11)


def test_config_partition_options_reach_the_data():
    cfg = ExperimentConfig(**TINY_RUN, pool="train", classes_per_client=2, val_fraction=0.2)
    data, _ = load_data(cfg)
    total = sum(int(np.asarray(cd.count).sum()) for cd in (data.train, data.val, data.test))
    assert total == 6000  # the embedded MNIST's train split only (the union has 7,000)
    assert class_options("paper", 2) == {"max_classes": 2}
    assert class_options("pathological", 3) == {"classes_per_client": 3}
    assert class_options("iid", None) == {}


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"val_fraction": -0.1}, "val_fraction"),
        ({"pool": "test"}, "pool"),
        ({"classes_per_client": 0}, "classes_per_client"),
        ({"classes_per_client": 2, "partition": "iid"}, "classes_per_client"),
    ],
)
def test_bad_partition_options_are_value_errors(overrides, match):
    with pytest.raises(ValueError, match=match):
        ExperimentConfig(**overrides)


def test_runner_records_validation_accuracy_per_round():
    cfg = ExperimentConfig(**{**TINY_RUN, "rounds": 2}, algorithms=("local",), val_fraction=0.25)
    res = run(cfg, progress=False)
    entry = res.methods["local"]
    val_acc = np.asarray(entry["client_val_accuracy"])  # [R, S]
    target = np.asarray(res.network["is_target"])
    assert val_acc.shape == (2, len(target))
    np.testing.assert_allclose(entry["target_val_accuracy"], val_acc[:, target].mean(1))
    counts = np.asarray(res.data["val_counts"])[np.asarray(res.network["slot_client"])]
    np.testing.assert_allclose(val_acc * counts, np.round(val_acc * counts), atol=1e-4)
    assert 0.3 < val_acc[-1, target].mean() <= 1.0  # learned something, on held-out samples
    # val_fraction = 0 adds no entry: tests/test_golden.py compares the entries' names


def test_cli_flags_set_the_partition_options():
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    args = parser.parse_args(
        [
            "--pool",
            "train",
            "--classes-per-client",
            "4",
            "--val-fraction",
            "0.1",
            "--min-samples",
            "5",
        ]
    )
    args.config = None
    cfg = config_from_args(args)
    assert (cfg.pool, cfg.classes_per_client, cfg.val_fraction, cfg.min_samples) == (
        "train", 4, 0.1, 5
    )  # fmt: skip
