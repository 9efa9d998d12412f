"""Models: shapes, parameter counts, the im2col convolution against XLA's, differentiability."""

from __future__ import annotations

import functools
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pfedwn_jax.models import (
    Conv2D,
    available_models,
    check_model_fits,
    conv2d,
    get_model,
    max_pool,
    register_model,
    unregister_model,
)


def _n_params(tree) -> int:
    return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(tree))


@pytest.mark.parametrize(
    ("shape", "kshape", "stride", "padding"),
    [
        ((2, 9, 11, 3), (3, 3, 3, 5), 1, "SAME"),
        ((1, 10, 10, 2), (3, 3, 2, 3), 2, "SAME"),
        ((2, 9, 9, 4), (1, 1, 4, 6), 2, "VALID"),
    ],
)
def test_conv2d_matches_lax_conv(shape, kshape, stride, padding):
    kx, kk, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, shape)
    k = jax.random.normal(kk, kshape)

    def ref_conv(x, k):
        return jax.lax.conv_general_dilated(
            x,
            k,
            (stride, stride),
            padding,
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            precision=jax.lax.Precision.HIGHEST,
        )

    @jax.jit
    def both(x, k, g):
        # values and the gradients w.r.t. input and kernel (the backward pass is what im2col
        # speeds up), for im2col and for XLA's convolution
        with jax.default_matmul_precision("highest"):
            f_new = lambda x, k: jnp.sum(g * conv2d(x, k, stride, padding))
            f_ref = lambda x, k: jnp.sum(g * ref_conv(x, k))
            return (
                (conv2d(x, k, stride, padding), *jax.grad(f_new, (0, 1))(x, k)),
                (ref_conv(x, k), *jax.grad(f_ref, (0, 1))(x, k)),
            )

    out_shape = jax.eval_shape(ref_conv, x, k).shape
    new, ref = both(x, k, jax.random.normal(kg, out_shape))
    assert new[0].shape == out_shape
    for a, b in zip(new, ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("padding", ["SAME"])
def test_conv_layer_matches_flax_conv(padding):
    ours = Conv2D(3, 8, 5, padding=padding, rngs=nnx.Rngs(0))
    ref = nnx.Conv(3, 8, (5, 5), padding=padding, rngs=nnx.Rngs(1))
    state = nnx.state(ours)  # the same kernel and a random bias in both (every flax version)
    pure = nnx.to_pure_dict(state) | {"bias": jax.random.normal(jax.random.key(2), (8,))}
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(ours, state)
    nnx.update(ref, state)
    x = jax.random.normal(jax.random.key(3), (2, 13, 13, 3))
    np.testing.assert_allclose(ours(x), ref(x), rtol=1e-4, atol=1e-4)


def test_max_pool_matches_reduce_window():
    x = jax.random.normal(jax.random.key(0), (2, 9, 8, 3))
    ref = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    np.testing.assert_array_equal(max_pool(x), ref)


def test_parameter_counts_match_reference_architectures():
    key = jax.random.key(0)
    # MNIST CNN, counted by hand: conv1 1*25*32+32, conv2 32*25*64+64, fc 1024*512+512, 512*10+10
    cnn = get_model("cnn", 10, (28, 28, 1))
    assert _n_params(jax.eval_shape(cnn.init, key)) == 832 + 51264 + 524800 + 5130
    # CIFAR-shaped CNN: conv1 3*25*32+32, conv2 as above, fc 5*5*64*512+512, 512*10+10
    cnn3 = get_model("cnn", 10, (32, 32, 3))
    assert _n_params(jax.eval_shape(cnn3.init, key)) == 2432 + 51264 + 819712 + 5130
    mlp = get_model("mlp", 10, (28, 28, 1))
    assert _n_params(jax.eval_shape(mlp.init, key)) == 784 * 200 + 200 + 200 * 200 + 200 + 2010
    lr = get_model("logreg", 10, (28, 28, 1))
    assert _n_params(jax.eval_shape(lr.init, key)) == 7850
    # CIFAR ResNet-18 has 11,173,962 parameters (BatchNorm and GroupNorm both have scale+bias)
    rn = get_model("resnet18", 10, (32, 32, 3))
    params = jax.eval_shape(rn.init, key)
    assert _n_params(params) == 11_173_962
    out = jax.eval_shape(rn.apply, params, jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.uint8))
    assert out.shape == (2, 10)


@pytest.mark.parametrize(
    ("name", "shape"),
    [("logreg", (8, 8, 1)), ("mlp", (8, 8, 3))],
)
def test_models_apply_uint8_batches(name, shape):
    model = get_model(name, 7, shape)
    params = jax.jit(model.init)(jax.random.key(0))
    x = jax.random.randint(jax.random.key(1), (3, *shape), 0, 256).astype(jnp.uint8)
    out = jax.jit(model.apply)(params, x)
    assert out.shape == (3, 7)
    assert np.all(np.isfinite(out))
    # normalisation happens inside: uint8 input equals the float input / 255 path
    assert model.input_shape == shape and model.num_classes == 7


def test_cnn_im2col_equals_lax_impl_values_and_grads():
    shape = (16, 16, 2)
    a = get_model("cnn", 5, shape)
    b = get_model("cnn", 5, shape, conv_impl="lax")
    params = jax.jit(a.init)(jax.random.key(0))
    x = jax.random.randint(jax.random.key(1), (4, *shape), 0, 256).astype(jnp.uint8)

    @jax.jit
    def value_and_grads(p):
        with jax.default_matmul_precision("highest"):
            return [jax.value_and_grad(lambda p, m=m: m.apply(p, x).sum())(p) for m in (a, b)]

    (va, ga), (vb, gb) = value_and_grads(params)
    np.testing.assert_allclose(va, vb, rtol=1e-5)
    chex.assert_trees_all_close(ga, gb, rtol=1e-3, atol=1e-4)


def test_apply_is_twice_differentiable():
    """Hessian-vector product via jvp-of-grad matches a central difference of gradients."""
    model = get_model("logreg", 3, (4, 4, 1))  # smooth, so finite differences are accurate
    params = jax.jit(model.init)(jax.random.key(0))
    x = jax.random.randint(jax.random.key(1), (5, 4, 4, 1), 0, 256).astype(jnp.uint8)
    y = jnp.array([0, 1, 2, 1, 0])

    def loss(p):
        logits = model.apply(p, x)
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(5), y])

    v = jax.tree.map(lambda a: jax.random.normal(jax.random.key(2), a.shape), params)
    hvp = jax.jit(lambda p, v: jax.jvp(jax.grad(loss), (p,), (v,))[1])(params, v)
    eps = 1e-2
    grad = jax.jit(jax.grad(loss))
    plus = grad(jax.tree.map(lambda a, b: a + eps * b, params, v))
    minus = grad(jax.tree.map(lambda a, b: a - eps * b, params, v))
    fd = jax.tree.map(lambda a, b: (a - b) / (2 * eps), plus, minus)
    chex.assert_trees_all_close(hvp, fd, rtol=2e-2, atol=2e-3)


def test_get_model_validation_and_caching():
    assert set(available_models()) == {"cnn", "resnet18", "mlp", "logreg"}
    with pytest.raises(ValueError, match="model must be one of"):
        get_model("vgg", 10, (28, 28, 1))
    with pytest.raises(ValueError, match="too small for model 'cnn'"):
        get_model("cnn", 10, (12, 12, 1))
    with pytest.raises(ValueError, match="num_classes"):
        get_model("mlp", 1, (28, 28, 1))
    with pytest.raises(ValueError, match=r"num_classes must be an integer; got \(28, 28, 1\)"):
        get_model("mlp", (28, 28, 1), 10)  # arguments swapped
    with pytest.raises(ValueError, match=r"input_shape must be a non-empty tuple.*\(28, 0\)"):
        get_model("mlp", 10, (28, 0))
    with pytest.raises(ValueError, match=r"input_shape must be a non-empty tuple.*got \(\)"):
        get_model("mlp", 10, ())
    assert get_model("mlp", 10, (28, 28, 1)) is get_model("mlp", 10, [28, 28, 1])
    m = get_model("logreg", 10, (28, 28, 1))
    check_model_fits(m, (28, 28, 1), 10)
    with pytest.raises(ValueError, match="built for input_shape"):
        check_model_fits(m, (32, 32, 3))
    with pytest.raises(ValueError, match="num_classes=100"):
        check_model_fits(m, (28, 28, 1), 100)


# --------------------------------------------------------------------------- register_model
class _Tiny(nnx.Module):
    """A user model as `register_model` expects it: flattened pixels -> logits."""

    def __init__(self, input_shape, num_classes, *, rngs: nnx.Rngs, width: int = 0):
        h, w, c = input_shape
        self.out = nnx.Linear(h * w * c, num_classes + width, rngs=rngs)

    def __call__(self, x):
        return self.out(x.astype(jnp.float32).reshape(x.shape[0], -1) / 255.0)


@pytest.fixture
def registry_cleanup():
    """Remove every model a test registered, even when it fails."""
    before = set(available_models())
    yield
    for name in set(available_models()) - before:
        unregister_model(name)


def test_register_model_validation(registry_cleanup):
    bad = [
        (("", _Tiny), {}, "non-empty string"),
        (("my model", _Tiny), {}, "'my model'"),
        (("cnn", _Tiny), {}, "'cnn' is already registered"),
        (("u1", "not a function"), {}, "builder for model 'u1' must be a hashable callable"),
        (("u1", _Tiny), {"check_shape": 3}, "check_shape for model 'u1'"),
        (("u1", _Tiny), {"takes_conv_impl": "yes"}, "takes_conv_impl must be a bool; got 'yes'"),
    ]
    for args, kwargs, msg in bad:
        with pytest.raises(ValueError, match=msg):
            register_model(*args, **kwargs)
    assert "u1" not in available_models()
    register_model("u1", _Tiny)
    with pytest.raises(ValueError, match="'u1' is already registered"):
        register_model("u1", _Tiny)
    with pytest.raises(ValueError, match="built in"):
        unregister_model("mlp")
    with pytest.raises(ValueError, match="'u2' is not registered"):
        unregister_model("u2")


def test_registered_model_builds_checks_and_rebuilds(registry_cleanup):
    register_model("u1", _Tiny, check_shape=_check_square)
    m = get_model("u1", 3, (4, 4, 1))
    assert m is get_model("u1", 3, (4, 4, 1)) and m.name == "u1"
    logits = m.apply(m.init(jax.random.key(0)), jnp.zeros((5, 4, 4, 1), jnp.uint8))
    assert logits.shape == (5, 3)
    with pytest.raises(ValueError, match="square"):
        get_model("u1", 3, (4, 6, 1))
    # replacing the builder under the same name gives a new model, not the cached one
    unregister_model("u1")
    register_model("u1", functools.partial(_Tiny, width=1))
    with pytest.raises(ValueError, match=r"model 'u1' must map .* returned \(2, 4\) float32"):
        get_model("u1", 3, (4, 4, 1))


def test_registered_model_that_fails_to_run_raises_value_error(registry_cleanup):
    def wrong_input_size(input_shape, num_classes, *, rngs):
        return _Tiny((2, 2, 1), num_classes, rngs=rngs)  # Linear expects 4 features, gets 16

    register_model("u1", wrong_input_size)
    with pytest.raises(
        ValueError, match=r"model 'u1' cannot be built or run on uint8 inputs \(2, 4, 4, 1\)"
    ):
        get_model("u1", 3, (4, 4, 1))


def _check_square(shape):
    if shape[0] != shape[1]:
        raise ValueError(f"model 'u1' needs square images; got {shape}")


def _docs_example() -> str:
    """The first python block of docs/models.md (the worked example)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text()
    return text.split("```python\n", 1)[1].split("```", 1)[0]


def test_docs_example_registers_and_runs(registry_cleanup):
    scope: dict = {}
    exec(compile(_docs_example(), "docs/models.md", "exec"), scope)
    result = scope["result"]
    assert result.config.model == "mine" and "mine" in available_models()
    acc = result.target_accuracy("fedavg")
    assert acc.shape == (2,) and np.all(acc > 0.3)  # chance is 0.1


# --------------------------------------------------------------------------- contract
class _WithBatchNorm(nnx.Module):
    def __init__(self, input_shape, num_classes, *, rngs: nnx.Rngs):
        self.out = nnx.Linear(int(np.prod(input_shape)), num_classes, rngs=rngs)
        self.norm = nnx.BatchNorm(num_classes, rngs=rngs)

    def __call__(self, x):
        return self.norm(self.out(x.astype(jnp.float32).reshape(x.shape[0], -1)))


class _WithDropout(nnx.Module):
    """Dropout with its own stream (the builder's rngs hold `params` only)."""

    def __init__(self, input_shape, num_classes, *, rngs: nnx.Rngs):
        self.out = nnx.Linear(int(np.prod(input_shape)), num_classes, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=0))

    def __call__(self, x):
        return self.drop(self.out(x.astype(jnp.float32).reshape(x.shape[0], -1)))


class _DropoutFromBuilderRngs(_WithDropout):
    def __init__(self, input_shape, num_classes, *, rngs: nnx.Rngs):
        self.out = nnx.Linear(int(np.prod(input_shape)), num_classes, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)  # asks for a 'dropout' stream


def _linen_batchnorm(input_shape, num_classes, *, rngs: nnx.Rngs):
    """A flax linen module with a `batch_stats` collection, through `nnx.bridge`."""
    import flax.linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            z = nn.Dense(num_classes)(x.astype(jnp.float32).reshape(x.shape[0], -1))
            return nn.BatchNorm(use_running_average=True)(z)

    module = nnx.bridge.ToNNX(Net(), rngs=rngs)
    return nnx.bridge.lazy_init(module, jnp.zeros((1, *input_shape), jnp.uint8))


@pytest.mark.parametrize(
    ("builder", "match"),
    [
        (_WithBatchNorm, r"in norm \(BatchNorm\): mean: BatchNorm running statistics"),
        (_linen_batchnorm, r"BatchNorm_0\.mean: BatchNorm running statistics"),
        (_WithDropout, r"in drop \(Dropout\): rngs\.\S*count: an RNG stream"),
        # flax >= 0.11 asks the builder's rngs for a 'dropout' stream, older flax keeps them
        (_DropoutFromBuilderRngs, r"'dropout'.*\(nnx\.Dropout\) are not|in drop \(Dropout\)"),
    ],
)
def test_model_with_non_parameter_state_is_refused(registry_cleanup, builder, match):
    register_model("stateful", builder)
    with pytest.raises(ValueError, match=match) as err:
        get_model("stateful", 3, (4, 4, 1))
    assert "model 'stateful'" in str(err.value)
    assert "GroupNorm or LayerNorm" in str(err.value) and "instead of BatchNorm" in str(err.value)
