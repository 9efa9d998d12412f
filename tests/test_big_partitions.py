"""Partitions over thousands of clients, the natural (by-writer) scheme, named local data files,
the per-client cap, and the errors for too few samples (docs/data.md, "Large networks")."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import decode, indexed_dataset, mock_tfds

from pfedwn_jax.data import (
    DATA_DIR_ENV,
    Dataset,
    DatasetUnavailableError,
    bucket_groups,
    cap_parts,
    client_label_counts,
    label_counts,
    load_dataset,
    make_federated,
    memory_bytes,
    partition,
    partition_natural,
    save_npz,
)

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def shared_file(name: str) -> Path:
    """A file of the shared data folder beside the repo, else in `$PFEDWN_DATA_DIR`."""
    for folder in (SHARED, os.environ.get(DATA_DIR_ENV)):
        if folder is not None and (Path(folder) / name).is_file():
            return Path(folder) / name
    pytest.skip(f"{name} is in neither {SHARED} nor ${DATA_DIR_ENV}")


def mnist_10k_labels() -> np.ndarray:
    with np.load(shared_file("mnist_10k_2k.npz")) as f:
        return f["y_train"].astype(np.int64)


# --- independent references -----------------------------------------------------------------
def reference_holders_paper(rng: np.random.Generator, clients: int, classes: int) -> np.ndarray:
    """The paper's class sets, drawn with a plain loop in the documented order."""
    holds = np.zeros((clients, classes), bool)
    for n in range(clients):
        drawn = rng.choice(classes, size=int(rng.integers(1, classes + 1)), replace=False)
        holds[n, drawn] = True
    for k in range(classes):
        if not holds[:, k].any():
            holds[rng.integers(clients), k] = True
    return holds


def reference_counts(
    rng: np.random.Generator, labels: np.ndarray, holds: np.ndarray, alpha: float
) -> np.ndarray:
    """`[clients, classes]` counts from the documented draws (min_samples=0): per class,
    Dirichlet(alpha) shares among its holders, then a multinomial of the class size."""
    counts = np.zeros(holds.shape, np.int64)
    for k in range(holds.shape[1]):
        size = int(np.sum(labels == k))
        owners = np.flatnonzero(holds[:, k])
        if size == 0:
            continue
        p = rng.dirichlet(np.full(owners.size, alpha)) if owners.size > 1 else np.ones(1)
        assert np.all(np.isfinite(p)) and p.sum() > 0  # the fallback branch is not exercised
        counts[owners, k] = rng.multinomial(size, p / p.sum())
        rng.permutation(size)  # the shuffle that assigns the samples (same stream use)
    return counts


def assert_disjoint(parts: list[np.ndarray], n: int, exact: bool = True) -> None:
    """Every index in `0..n-1` is used at most once (exactly once with `exact`)."""
    used = np.bincount(np.concatenate(parts), minlength=n)
    assert used.shape == (n,) and used.max() <= 1
    if exact:
        assert used.min() == 1


# --- 1,000 clients ---------------------------------------------------------------------------
@pytest.mark.parametrize(("scheme", "alpha"), [("dirichlet", 0.1), ("paper", 0.1), ("paper", 1.0)])
def test_1k_clients_label_histograms_match_the_draws(scheme, alpha):
    labels = mnist_10k_labels()
    parts = partition(labels, 1000, scheme, seed=5, alpha=alpha, min_samples=0)
    assert len(parts) == 1000
    assert_disjoint(parts, labels.size)
    rng = np.random.default_rng(5)
    holds = (
        reference_holders_paper(rng, 1000, 10) if scheme == "paper" else np.ones((1000, 10), bool)
    )
    want = reference_counts(rng, labels, holds, alpha)
    got = np.stack([np.bincount(labels[p], minlength=10) for p in parts])  # plain bincount
    np.testing.assert_array_equal(got, want)
    assert not np.any(got[~holds])  # nobody holds a class it did not draw


@pytest.mark.parametrize("scheme", ["paper", "dirichlet", "pathological", "iid"])
def test_1k_clients_minimum_met_and_cover_exact(scheme):
    labels = mnist_10k_labels()
    parts = partition(labels, 1000, scheme, seed=2, alpha=0.05, min_samples=8)
    assert_disjoint(parts, labels.size)
    assert min(p.size for p in parts) >= 8
    np.testing.assert_array_equal(
        label_counts(labels, parts, 10).sum(0), np.bincount(labels, minlength=10)
    )


def test_make_federated_1k_clients_with_cap_uses_each_sample_at_most_once():
    ds = indexed_dataset(n_train=20_000, n_test=4_000, classes=10, seed=1)
    kw = dict(seed=4, alpha=0.05, min_samples=4, device=False)
    full = make_federated(ds, 1000, "dirichlet", **kw)
    capped = make_federated(ds, 1000, "dirichlet", max_samples_per_client=16, **kw)
    full_ids = [np.concatenate(p) for p in zip(decode(full.train), decode(full.test), strict=True)]
    ids = [np.concatenate(p) for p in zip(decode(capped.train), decode(capped.test), strict=True)]
    assert_disjoint(full_ids, 24_000)
    assert_disjoint(ids, 24_000, exact=False)
    for before, after in zip(full_ids, ids, strict=True):
        assert after.size == min(before.size, 16) and np.isin(after, before).all()
        assert np.unique(after).size == after.size
    assert max(p.size for p in full_ids) > 16  # the cap did bind somewhere
    assert capped.train.max_samples == 12 and capped.test.max_samples == 4  # 75/25 of 16
    assert memory_bytes(capped.train) < memory_bytes(full.train)
    labels = np.concatenate([ds.y_train, ds.y_test])
    counts = client_label_counts(capped)  # labels travel with their images
    np.testing.assert_array_equal(counts, label_counts(labels, ids, 10))


def test_cap_parts_is_a_uniform_subset():
    parts = [np.arange(10), np.arange(10, 13)]
    hits = np.zeros(10)
    for seed in range(2000):
        small, short = cap_parts(parts, 4, seed)
        np.testing.assert_array_equal(short, parts[1])  # below the cap: unchanged
        assert small.size == 4 and np.all(np.diff(small) > 0)
        hits[small] += 1
    # each of 10 kept with probability 0.4: 800 of 2000 draws, sd ~ 22
    assert np.all(np.abs(hits - 800) < 110), hits


def reference_bucket_cost(count: np.ndarray, num_buckets: int) -> int:
    """Least padded slots over contiguous cuts of the sorted clients (plain per-client DP):
    `best[j]` covers the j smallest clients with at most the buckets used so far."""
    c = np.sort(count)
    best = [0] + [float("inf")] * len(c)
    for _ in range(num_buckets):
        best = [0] + [
            min(best[j], *(best[i] + (j - i) * int(c[j - 1]) for i in range(j)))
            for j in range(1, len(c) + 1)
        ]
    return best[len(c)]


@pytest.mark.parametrize("num_buckets", [1, 2, 4])
def test_bucket_groups_with_many_tied_clients(num_buckets):
    count = np.random.default_rng(num_buckets).geometric(0.15, size=150)  # many equal sizes
    groups = bucket_groups(count, num_buckets)
    np.testing.assert_array_equal(np.sort(np.concatenate(groups)), np.arange(150))
    assert len(groups) <= num_buckets
    cost = sum(len(g) * int(count[g].max()) for g in groups)
    assert cost == reference_bucket_cost(count, num_buckets)
    big = np.random.default_rng(0).geometric(0.05, size=10_000)  # 10,000 clients: instant
    assert sum(len(g) for g in bucket_groups(big, 8)) == 10_000


# --- too few samples -------------------------------------------------------------------------
def test_errors_name_the_numbers():
    labels = np.arange(100) % 10
    with pytest.raises(ValueError, match=r"num_clients=101 exceeds the 100 samples.*at most 100"):
        partition(labels, 101, "iid", seed=0)
    with pytest.raises(ValueError, match=r"11 \* 10 = 110 exceeds the 100.*at most 10 clients"):
        partition(labels, 11, "dirichlet", seed=0, min_samples=10)
    with pytest.raises(ValueError, match=r"min_samples <= 9 with 11 clients"):
        partition(labels, 11, "paper", seed=0, min_samples=10)
    tiny = np.r_[np.zeros(1000, int), np.ones(3, int)]  # class 1 is too small for its holders
    with pytest.raises(ValueError, match=r"got [0-2] samples < min_samples=5 \(1003 samples"):
        partition(tiny, 4, "pathological", seed=0, classes_per_client=1, min_samples=5)


def test_make_federated_errors_name_dataset_and_pool():
    ds = indexed_dataset(n_train=300, n_test=100)
    with pytest.raises(ValueError, match=r"'indexed' \(pool='train', 300 samples\).*at most 15"):
        make_federated(ds, 16, "paper", pool="train", device=False)
    with pytest.raises(ValueError, match=r"max_samples_per_client=3 is below min_samples=4"):
        make_federated(ds, 4, min_samples=4, max_samples_per_client=3, device=False)
    with pytest.raises(ValueError, match=r"natural.*writer ids.*'indexed' has none"):
        make_federated(ds, 4, "natural", device=False)
    with pytest.raises(ValueError, match="scheme"):
        make_federated(ds, 4, "by_writer", device=False)


# --- natural partition by writer -------------------------------------------------------------
def test_partition_natural_against_writer_groups():
    rng = np.random.default_rng(0)
    writers = rng.integers(0, 3000, size=60_000) * 7 + 3  # ids need not be 0..W-1
    parts, ids = partition_natural(writers, 1000, seed=1, min_samples=15)
    sizes = {w: int(np.sum(writers == w)) for w in np.unique(writers)}
    assert len(parts) == 1000 and np.all(np.diff(ids) > 0)  # distinct, increasing
    assert_disjoint(parts, writers.size, exact=False)
    for p, w in zip(parts, ids, strict=True):
        assert np.all(writers[p] == w) and p.size == sizes[w] >= 15
    eligible = sum(s >= 15 for s in sizes.values())
    with pytest.raises(ValueError, match=rf"num_clients=3001 exceeds the {eligible} writers"):
        partition_natural(writers, 3001, seed=1, min_samples=15)
    again, _ = partition_natural(writers, 1000, seed=1, min_samples=15)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def write_leaf(root: Path, users: dict[str, int], split: str, seed: int) -> None:
    """A tiny LEAF FEMNIST-style json: writer i's images carry the code (i+1)*20 in pixel 0."""
    rng = np.random.default_rng(seed)
    data = {}
    for user, m in users.items():
        x = rng.integers(0, 256, size=(m, 784)) / 255
        x[:, 0] = (int(user[1:]) + 1) * 20 / 255
        data[user] = {"x": x.tolist(), "y": rng.integers(0, 62, size=m).tolist()}
    (root / split).mkdir(parents=True, exist_ok=True)
    doc = {"users": list(users), "num_samples": list(users.values()), "user_data": data}
    (root / split / "all_data_0.json").write_text(json.dumps(doc))


def test_leaf_json_to_natural_clients(tmp_path):
    sizes = {"w0": 10, "w1": 3, "w2": 12, "w3": 6, "w4": 8}
    write_leaf(tmp_path / "femnist", sizes, "train", seed=0)
    write_leaf(tmp_path / "femnist", {"w1": 2, "w4": 2, "w5": 4}, "test", seed=1)
    ds = load_dataset(f"leaf:{tmp_path / 'femnist'}")
    assert ds.has_writers and ds.x_train.shape == (39, 28, 28, 1) and ds.num_classes >= 2
    code = ds.x_train[:, 0, 0, 0].astype(int) // 20 - 1  # writer number written in the pixels
    np.testing.assert_array_equal(code, ds.writer_train)  # w0..w5 -> ids 0..5 (sorted names)
    np.testing.assert_array_equal(ds.x_test[:, 0, 0, 0] // 20 - 1, ds.writer_test)
    again = load_dataset(f"npz:{save_npz(ds, tmp_path / 'femnist.npz')}")
    for key in ("x_train", "y_train", "x_test", "y_test", "writer_train", "writer_test"):
        np.testing.assert_array_equal(getattr(again, key), getattr(ds, key))
    fed = make_federated(ds, 3, "natural", seed=0, min_samples=10, device=False)
    total = {0: 10, 1: 5, 2: 12, 3: 6, 4: 10, 5: 4}  # union of train and test per writer
    seen = set()
    for n in range(3):
        pix = np.concatenate(
            [np.asarray(cd.x)[n, : int(cd.count[n]), 0, 0, 0] for cd in (fed.train, fed.test)]
        )
        writer = int(pix[0]) // 20 - 1
        assert np.all(pix // 20 - 1 == writer) and pix.size == total[writer] >= 10
        seen.add(writer)
    assert seen == {0, 2, 4}  # the only writers with >= 10 samples
    with pytest.raises(ValueError, match="exceeds the 3 writers"):
        make_federated(ds, 4, "natural", seed=0, min_samples=10, device=False)


def test_bad_writer_arrays(tmp_path):
    x, y = np.zeros((4, 2, 2), np.uint8), np.arange(4) % 2
    np.savez(tmp_path / "a.npz", x_train=x, y_train=y, writer_train=np.arange(3))
    with pytest.raises(ValueError, match=r"writer_train must be a 1-D integer array of length 4"):
        load_dataset(f"npz:{tmp_path / 'a.npz'}")
    np.savez(tmp_path / "b.npz", x_train=x, y_train=y, writer_test=np.arange(4))
    with pytest.raises(ValueError, match="writer_test but no writer_train"):
        load_dataset(f"npz:{tmp_path / 'b.npz'}")
    with pytest.raises(ValueError, match="both writer_train and writer_test"):
        Dataset(
            x[..., None],
            y.astype(np.int32),
            x[:0, ..., None],
            y[:0].astype(np.int32),
            2,
            "d",
            writer_train=np.arange(4),
        )


# --- full MNIST by name ----------------------------------------------------------------------
def test_mnist_full_from_data_dir_and_environment(tmp_path, monkeypatch):
    path = shared_file("mnist.npz")
    ds = load_dataset("mnist_full", data_dir=path.parent)
    with np.load(path) as ref:
        np.testing.assert_array_equal(ds.x_train[..., 0], ref["x_train"])
        np.testing.assert_array_equal(ds.y_test, ref["y_test"])
    assert ds.name == "mnist_full" and ds.num_classes == 10 and ds.x_test.shape[0] == 10_000
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(DatasetUnavailableError, match=r"mnist.npz.*does not exist"):
        load_dataset("mnist_full")
    np.savez(tmp_path / "mnist.npz", x_train=np.zeros((5, 28, 28), np.uint8), y_train=np.arange(5))
    with pytest.raises(ValueError, match=r"has 5 train and 0 test samples, not the full MNIST"):
        load_dataset("mnist_full")
    monkeypatch.delenv(DATA_DIR_ENV)
    with pytest.raises(DatasetUnavailableError, match=rf"\${DATA_DIR_ENV}.*npz:PATH"):
        load_dataset("mnist_full")


def test_emnist_through_mock_tfds(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    with mock_tfds(num_examples=6):  # patches tfds.data_source: no files, no network
        ds = load_dataset("emnist/digits", data_dir=tmp_path)
    assert ds.num_classes == 10 and ds.x_train.shape == (6, 28, 28, 1) and not ds.has_writers


# --- 10,000 clients on the full MNIST (slow) -------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["dirichlet", "paper"])
def test_full_mnist_10k_clients(scheme):
    ds = load_dataset("mnist_full", data_dir=shared_file("mnist.npz").parent)
    labels = np.concatenate([ds.y_train, ds.y_test]).astype(np.int64)
    parts = partition(labels, 10_000, scheme, seed=0, alpha=0.1, min_samples=2)
    assert_disjoint(parts, 70_000)
    assert min(p.size for p in parts) >= 2
    fed = make_federated(ds, 10_000, scheme, seed=0, min_samples=2, device=False)
    counts = client_label_counts(fed)
    np.testing.assert_array_equal(counts, label_counts(labels, parts, 10))  # same partition
    assert np.all(np.asarray(fed.train.count) >= 1) and np.all(np.asarray(fed.test.count) >= 1)
    for cd in (fed.train, fed.test):
        assert memory_bytes(cd) == sum(np.asarray(a).nbytes for a in cd)
        assert cd.x.shape == (10_000, int(np.asarray(cd.count).max()), 28, 28, 1)
    with pytest.raises(ValueError, match=r"at most 3500 clients with min_samples=20"):
        make_federated(ds, 10_000, scheme, seed=0, device=False)
