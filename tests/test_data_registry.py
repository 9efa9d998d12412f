"""Arrays in memory as named datasets: `register_dataset`, float features, fingerprints."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pfedwn_jax import run
from pfedwn_jax.data import (
    available_datasets,
    dataset_fingerprint,
    load_dataset,
    make_federated,
    register_dataset,
    registered_datasets,
    unregister_dataset,
)
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.models import check_model_fits, get_model


def channel_features(n: int = 240, d: int = 6, seed: int = 0):
    """Channel-state-like features (complex gains as real/imaginary parts) and a synthetic
    label: which of 3 bands has the strongest gain."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    gain = x[:, 0::2] ** 2 + x[:, 1::2] ** 2
    return x, np.argmax(gain, axis=1)


@pytest.fixture
def registry_cleanup():
    """Remove every dataset a test registered, even when it fails."""
    before = set(registered_datasets())
    yield
    for name in set(registered_datasets()) - before:
        unregister_dataset(name)


def test_registered_float_features_load_partition_and_stack(registry_cleanup):
    x, y = channel_features()
    ds = register_dataset("csi", x[:180], y[:180], x[180:], y[180:])
    assert load_dataset("csi") is ds and "csi" in available_datasets()
    assert ds.input_shape == (6,) and ds.input_dtype == "float32" and ds.num_classes == 3
    np.testing.assert_allclose(ds.x_train, x[:180].astype(np.float32))
    fed = make_federated("csi", 4, scheme="dirichlet", seed=0, alpha=1.0)
    assert fed.train.x.dtype == np.float32 and fed.train.x.shape[::2] == (4, 6)
    assert int(fed.train.count.sum() + fed.test.count.sum()) == 240  # pool: train and test


def test_registered_arrays_are_copied_and_fingerprinted(registry_cleanup):
    x, y = channel_features()
    register_dataset("csi", x, y)
    first = dataset_fingerprint("csi")
    x[:] = 0  # the caller's array changes; the registered copy does not
    assert load_dataset("csi").x_train.any() and dataset_fingerprint("csi") == first
    assert not load_dataset("csi").x_train.flags.writeable
    assert first.startswith("sha256:") and len(first) == len("sha256:") + 64
    # the same arrays under another name give the same fingerprint; other arrays another one
    x2, y2 = channel_features()
    register_dataset("csi_copy", x2, y2)
    register_dataset("csi_other", x2, (y2 + 1) % 3)
    assert dataset_fingerprint("csi_copy") == first != dataset_fingerprint("csi_other")
    assert dataset_fingerprint().startswith("sha256:")  # the embedded default, loaded


def test_unregister_and_register_again(registry_cleanup):
    x, y = channel_features()
    register_dataset("csi", x, y)
    with pytest.raises(ValueError, match=r"'csi' is already registered.*unregister_dataset"):
        register_dataset("csi", x, y)
    before = dataset_fingerprint("csi")
    unregister_dataset("csi")
    assert "csi" not in available_datasets()
    with pytest.raises(ValueError, match="unknown dataset 'csi'"):
        load_dataset("csi")
    with pytest.raises(ValueError, match=r"'csi' is not registered; registered datasets: \[\]"):
        unregister_dataset("csi")
    register_dataset("csi", x[:100], y[:100])  # a new dataset under the old name
    assert len(load_dataset("csi").y_train) == 100 and dataset_fingerprint("csi") != before


def test_uint8_images_register_and_fit_the_conv_nets(registry_cleanup):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (20, 16, 16, 1), dtype=np.uint8)
    ds = register_dataset("tiny_images", x, np.arange(20) % 2, num_classes=4)
    assert ds.input_dtype == "uint8" and ds.input_shape == (16, 16, 1) and ds.num_classes == 4
    assert get_model("cnn", 4, ds.input_shape).input_dtype == "uint8"


X, Y = channel_features(40)


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "match"),
    [
        ("", (X, Y), {}, "non-empty string"),
        ("my data", (X, Y), {}, "'my data'"),
        ("npz:x", (X, Y), {}, "without spaces or ':'"),
        ("mnist_embedded", (X, Y), {}, "'mnist_embedded' is a built-in dataset"),
        ("cifar10", (X, Y), {}, "'cifar10' is a built-in dataset"),
        ("d", (X.astype(np.int64), Y), {}, r"x_train must be uint8 pixels or real.*int64"),
        ("d", (X[:, 0], Y), {}, r"x_train must have shape \[n, \.\.\.\].*x\[:, None\]"),
        ("d", (np.where(X > 2, np.nan, X), Y), {}, "x_train must be finite"),
        ("d", (X, Y + 0.5), {}, "y_train must be a 1-D integer array"),
        ("d", (X, Y - 1), {}, "y_train labels must be >= 0"),
        ("d", (X, Y[:-1]), {}, "x_train has 40 samples but y_train 39 labels"),
        ("d", (X, Y, X), {}, "both x_test and y_test"),
        ("d", (X, Y, X[:, :3], Y), {}, r"train inputs float32 \(6,\) and test inputs"),
        ("d", (X, Y, X.astype(np.uint8), Y), {}, "differ in shape or dtype"),
        ("d", (X, Y), {"num_classes": 2}, r"labels must be in \[0, 2\)"),
        ("d", (X, Y), {"writer_test": np.zeros(40)}, "writer_test needs writer_train"),
    ],
)
def test_bad_arrays_raise_named_value_errors(registry_cleanup, name, args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        register_dataset(name, *args, **kwargs)
    assert name not in registered_datasets()


def test_mlp_and_logreg_take_float_vectors():
    x = jax.random.normal(jax.random.key(1), (3, 5))
    for name in ("mlp", "logreg"):
        model = get_model(name, 4, (5,), input_dtype="float32")
        out = model.apply(model.init(jax.random.key(0)), x)
        assert out.shape == (3, 4) and model.input_dtype == "float32"
        check_model_fits(model, (5,), 4, input_dtype=jnp.float32)
        with pytest.raises(ValueError, match="built for float32 inputs; the data is uint8"):
            check_model_fits(model, (5,), input_dtype=np.uint8)
    # features are used as they are, pixels are scaled to [0, 1]
    model = get_model("logreg", 2, (3,), input_dtype="float32")
    params = model.init(jax.random.key(0))
    pixels = get_model("logreg", 2, (3,))
    np.testing.assert_allclose(
        model.apply(params, jnp.full((1, 3), 1.0)),
        pixels.apply(params, jnp.full((1, 3), 255, jnp.uint8)),
        rtol=1e-6,
    )
    with pytest.raises(ValueError, match=r"model 'cnn' takes images of shape \(H, W, C\)"):
        get_model("cnn", 4, (5,), input_dtype="float32")
    with pytest.raises(ValueError, match="input_dtype must be one of"):
        get_model("mlp", 4, (5,), input_dtype="int32")


def test_run_on_registered_features_end_to_end(registry_cleanup):
    x, y = channel_features(400)
    register_dataset("csi", x[:300], y[:300], x[300:], y[300:])
    config = ExperimentConfig(
        dataset="csi",
        model="mlp",
        algorithms=("local",),
        rounds=1,
        num_neighbors=3,
        gamma_th=1.0,
        eps=0.5,
        batch_size=16,
        lr=0.1,
    )
    result = run(config, progress=False)
    assert result.config.dataset == "csi"
    assert result.target_accuracy("local")[-1] > 0.4  # 3 classes: chance is about 1/3


def _docs_example() -> str:
    """The python block of docs/data.md (the channel-state example)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    return next(b for b in blocks if "register_dataset(" in b)


def test_docs_example_runs(registry_cleanup):
    scope: dict = {}
    exec(compile(_docs_example(), "docs/data.md", "exec"), scope)
    result = scope["result"]
    assert result.config.dataset == "csi" and result.target_accuracy("local").shape == (3,)
    assert result.target_accuracy("fedavg")[-1] > 0.35  # 4 classes: chance is 0.25


def test_a_name_registered_again_loads_its_new_arrays(registry_cleanup):
    """The set-up's dataset cache follows the registry entry, not the name: the next run of
    `mine` trains on the arrays registered last."""
    from pfedwn_jax.experiment.setup import load_data

    x, y = channel_features(240)
    config = ExperimentConfig(dataset="mine", model="mlp", num_neighbors=3, gamma_th=1.0, eps=0.5)
    register_dataset("mine", x[:200], y[:200], x[200:], y[200:])
    first, fp_first = load_data(config)
    unregister_dataset("mine")
    register_dataset("mine", x[:200] + 100.0, y[:200], x[200:] + 100.0, y[200:])
    second, fp_second = load_data(config)
    assert fp_second != fp_first
    assert np.asarray(first.train.x).max() < 50 < np.asarray(second.train.x).max()
