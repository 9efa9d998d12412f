"""Dataset sources: the embedded default, user npz files, TFDS (mocked, no network)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
from helpers import mock_tfds

from pfedwn_jax.data import (
    DEFAULT_DATASET,
    DatasetUnavailableError,
    load_dataset,
    load_npz,
    make_federated,
    tfds_source,
)
from pfedwn_jax.data.datasets import EMBEDDED

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def shared_file(name: str) -> Path:
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} is missing (the shared data folder is not beside the repo)")
    return path


def test_embedded_default_is_a_real_mnist_subset():
    ds = load_dataset()
    assert ds.name == DEFAULT_DATASET
    assert ds.x_train.shape == (6000, 28, 28, 1) and ds.x_train.dtype == np.uint8
    assert ds.x_test.shape == (1000, 28, 28, 1)
    assert ds.y_train.dtype == np.int32 and ds.num_classes == 10
    assert EMBEDDED[DEFAULT_DATASET].stat().st_size < 3 * 2**20  # keeps the wheel small
    with np.load(shared_file("mnist.npz")) as full:  # independent reference: the source
        np.testing.assert_array_equal(ds.x_train[..., 0], full["x_train"][:6000])
        np.testing.assert_array_equal(ds.y_train, full["y_train"][:6000])
        np.testing.assert_array_equal(ds.x_test[..., 0], full["x_test"][:1000])
        np.testing.assert_array_equal(ds.y_test, full["y_test"][:1000])


def test_npz_path_on_shared_mnist():
    path = shared_file("mnist_10k_2k.npz")
    ds = load_dataset(f"npz:{path}")
    assert ds.x_train.shape == (10000, 28, 28, 1) and ds.x_test.shape == (2000, 28, 28, 1)
    assert ds.num_classes == 10 and ds.y_train.dtype == np.int32
    with np.load(path) as raw:
        np.testing.assert_array_equal(ds.x_train[..., 0], raw["x_train"])
        np.testing.assert_array_equal(ds.y_test, raw["y_test"])
    fed = make_federated(f"npz:{path}", 11, "paper", seed=0, device=False)
    assert int(fed.train.count.sum() + fed.test.count.sum()) == 12000


def test_npz_colour_images_and_train_only(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(30, 8, 8, 3), dtype=np.uint8)
    y = rng.integers(0, 5, size=30)
    np.savez(tmp_path / "own.npz", x_train=x, y_train=y, num_classes=7)
    ds = load_npz(tmp_path / "own.npz")
    assert ds.input_shape == (8, 8, 3) and ds.num_classes == 7 and len(ds.y_test) == 0
    np.testing.assert_array_equal(ds.x_train, x)


def write_npz(path, **arrays):
    np.savez(path, **arrays)
    return f"npz:{path}"


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        (dict(x_train=np.zeros((4, 28), np.uint8), y_train=np.zeros(4, int)), "shape"),
        (dict(x_train=np.zeros((4, 2, 2), np.uint8), y_train=np.arange(3)), "3 labels"),
        (dict(x_train=np.zeros((4, 2, 2), np.float32), y_train=np.zeros(4, int)), "dtype"),
        (dict(x_train=np.full((4, 2, 2), 300), y_train=np.zeros(4, int)), "255"),
        (dict(x_train=np.zeros((4, 2, 2), np.uint8)), "must contain"),
        (
            dict(x_train=np.zeros((4, 2, 2), np.uint8), y_train=np.arange(4), num_classes=3),
            r"\[0, 3\)",
        ),
        (
            dict(
                x_train=np.zeros((4, 2, 2), np.uint8),
                y_train=np.arange(4),
                x_test=np.zeros((2, 3, 3), np.uint8),
                y_test=np.zeros(2, int),
            ),
            "differ in shape",
        ),
        (dict(x_train=np.zeros((4, 2, 2), np.uint8), y_train=np.zeros((4, 1), int)), "1-D"),
    ],
)
def test_bad_npz_raises_value_error(tmp_path, arrays, match):
    name = write_npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=match):
        load_dataset(name)


def test_corrupt_and_missing_npz(tmp_path):
    (tmp_path / "corrupt.npz").write_bytes(b"this is not a zip archive at all")
    with pytest.raises(ValueError, match="cannot read"):
        load_dataset(f"npz:{tmp_path / 'corrupt.npz'}")
    with zipfile.ZipFile(tmp_path / "trunc.npz", "w") as z:  # a zip whose member is no .npy
        z.writestr("x_train.npy", b"garbage")
        z.writestr("y_train.npy", b"garbage")
    with pytest.raises(ValueError, match=r"trunc\.npz"):
        load_dataset(f"npz:{tmp_path / 'trunc.npz'}")
    with pytest.raises(ValueError, match="not found"):
        load_dataset(f"npz:{tmp_path / 'absent.npz'}")


def test_unknown_name_lists_available():
    with pytest.raises(ValueError, match=r"unknown dataset 'imagenet'.*mnist_embedded"):
        load_dataset("imagenet")
    with pytest.raises(ValueError, match="non-empty"):
        load_dataset("")


# --- TFDS -----------------------------------------------------------------------------------
tfds = pytest.importorskip("tensorflow_datasets")


@pytest.mark.parametrize(
    ("name", "shape", "classes"),
    [
        ("mnist", (28, 28, 1), 10),
        ("cifar100", (32, 32, 3), 100),
    ],
)
def test_tfds_through_mock_data_source(tmp_path, name, shape, classes):
    # tfds.testing.mock_data patches DatasetBuilder.as_data_source, i.e. tfds.data_source
    # (checked in tensorflow-datasets 4.9.10): random examples, no files, no network.
    with mock_tfds(num_examples=9):
        ds = load_dataset(name, data_dir=tmp_path)
        ref = tfds.data_source(name, split="train", data_dir=str(tmp_path), download=False)
        ref_x = np.stack([ref[i]["image"] for i in range(len(ref))])
        ref_y = np.array([ref[i]["label"] for i in range(len(ref))])
    assert ds.name == name and ds.num_classes == classes
    assert ds.x_train.shape == (9, *shape) and ds.x_train.dtype == np.uint8
    assert ds.x_test.shape == (9, *shape) and ds.y_test.dtype == np.int32
    np.testing.assert_array_equal(ds.x_train, ref_x)
    np.testing.assert_array_equal(ds.y_train, ref_y)


def assert_helpful(err: Exception, name: str, where: Path):
    msg = str(err)
    assert f"'{name}'" in msg and str(where) in msg
    assert "pip install 'pfedwn-jax[tfds]' tensorflow" in msg
    assert f"pfedwn data prepare {name} --data-dir {where}" in msg


def test_tfds_missing_dataset_is_one_clear_error(tmp_path):
    with pytest.raises(DatasetUnavailableError) as info:  # empty folder: not prepared
        load_dataset("cifar10", data_dir=tmp_path)
    assert_helpful(info.value, "cifar10", tmp_path)
    assert isinstance(info.value, ValueError)
    absent = tmp_path / "nowhere"
    with pytest.raises(DatasetUnavailableError) as info:
        load_dataset("mnist", data_dir=absent)
    assert_helpful(info.value, "mnist", absent)
    assert not absent.exists()


def test_tfds_not_installed(tmp_path, monkeypatch):
    real = tfds_source.importlib.util.find_spec
    monkeypatch.setattr(
        tfds_source.importlib.util,
        "find_spec",
        lambda mod, *a: None if mod == "tensorflow_datasets" else real(mod, *a),
    )
    with pytest.raises(DatasetUnavailableError, match="not installed") as info:
        load_dataset("fashion_mnist", data_dir=tmp_path)
    assert_helpful(info.value, "fashion_mnist", tmp_path)


def test_tfds_default_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "env_dir"))
    with pytest.raises(DatasetUnavailableError, match="env_dir"):
        load_dataset("mnist")


def test_prepare_without_tensorflow_says_how_to_install(tmp_path):
    import importlib.util

    if importlib.util.find_spec("tensorflow") is not None:
        pytest.skip("TensorFlow is installed here")
    with pytest.raises(ValueError, match=r"needs TensorFlow.*pip install"):
        tfds_source.prepare_tfds("mnist", data_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown TFDS dataset"):
        tfds_source.prepare_tfds("imagenet", data_dir=tmp_path)


class InMemorySource:
    """A TFDS data source over arrays: `len`, and `__getitems__` (batched reads) counted."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x, self.y, self.batches = x, y, []

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        raise AssertionError("read one example at a time")

    def __getitems__(self, keys):
        self.batches.append(list(keys))
        return [{"image": self.x[k], "label": self.y[k]} for k in keys]


def test_tfds_source_is_read_in_batches():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (10, 4, 4, 3), dtype=np.uint8)
    y = rng.integers(0, 7, 10)
    source = InMemorySource(x, y)
    got_x, got_y = tfds_source._to_arrays("fake", "train", source, batch=4)
    assert source.batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)
    assert got_y.dtype == np.int32
    empty = tfds_source._to_arrays("fake", "test", InMemorySource(x[:0], y[:0]))
    assert empty[0].shape == (0, 0, 0, 0) and empty[1].shape == (0,)
