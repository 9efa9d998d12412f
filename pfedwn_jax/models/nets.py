"""The network architectures, as flax NNX modules taking raw `uint8 [B, H, W, C]` images or
float32 features.

Every module normalises uint8 input to [0, 1] itself, so the data pipeline can keep uint8
images (4x less memory for the stacked per-client arrays); float features pass unchanged. The
MLP and logistic regression flatten any input shape (`(d,)` vectors included); the conv nets
take images `(H, W, C)`. All normalisation layers are per-sample
(GroupNorm), so a model has parameters only: no mutable statistics per client, and padded
samples of a batch cannot leak into real ones.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from pfedwn_jax.models.layers import Conv2D, max_pool

# (H, W, C) of one image
Shape3 = tuple[int, int, int]


def to_float(x: jax.Array) -> jax.Array:
    """uint8 pixels -> float32 in [0, 1]; float features -> float32 unchanged."""
    if x.dtype == jnp.uint8:
        return x.astype(jnp.float32) / 255.0
    return x.astype(jnp.float32)


class _Headed(nnx.Module):
    """A network whose head is the linear layer `out` on its representation (`features`)."""

    HEAD = ("out",)
    out: nnx.Linear

    def features(self, x: jax.Array) -> jax.Array:
        raise NotImplementedError

    def classify(self, z: jax.Array) -> jax.Array:
        return self.out(z)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.classify(self.features(x))


class LogReg(_Headed):
    """Multinomial logistic regression on the flattened input (pixels or features); its
    representation is the flattened input itself, its head the one linear layer."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, *, rngs: nnx.Rngs):
        self.out = nnx.Linear(math.prod(input_shape), num_classes, rngs=rngs)

    def features(self, x: jax.Array) -> jax.Array:
        return to_float(x).reshape(x.shape[0], -1)


class MLP(_Headed):
    """Two hidden layers of 200 ReLU units (the FedAvg paper's 2NN: 784-200-200-classes) on
    the flattened input. Representation: the second hidden layer; head: the output layer."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        *,
        hidden: int = 200,
        rngs: nnx.Rngs,
    ):
        self.fc1 = nnx.Linear(math.prod(input_shape), hidden, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, num_classes, rngs=rngs)

    def features(self, x: jax.Array) -> jax.Array:
        z = to_float(x).reshape(x.shape[0], -1)
        z = jax.nn.relu(self.fc1(z))
        return jax.nn.relu(self.fc2(z))


def cnn_feature_size(input_shape: Shape3) -> tuple[int, int]:
    """Spatial size after the CNN's two (conv 5x5 VALID, maxpool 2) stages."""
    h, w, _ = input_shape
    for _ in range(2):
        h, w = (h - 4) // 2, (w - 4) // 2
    return h, w


class CNN(_Headed):
    """The PFL libraries' MNIST CNN: conv5x5(32)-ReLU-pool2-conv5x5(64)-ReLU-pool2-fc512-ReLU-fc.

    Convolutions are VALID (as PyTorch's `Conv2d(1, 32, 5)`): 28x28 -> 4x4x64 features, 32x32 ->
    5x5x64. Representation: the 512 fc1 units; head: the output layer.
    """

    def __init__(
        self, input_shape: Shape3, num_classes: int, *, conv_impl: str = "im2col", rngs: nnx.Rngs
    ):
        c = input_shape[2]
        fh, fw = cnn_feature_size(input_shape)
        self.conv1 = Conv2D(c, 32, 5, impl=conv_impl, rngs=rngs)
        self.conv2 = Conv2D(32, 64, 5, impl=conv_impl, rngs=rngs)
        self.fc1 = nnx.Linear(fh * fw * 64, 512, rngs=rngs)
        self.out = nnx.Linear(512, num_classes, rngs=rngs)

    def features(self, x: jax.Array) -> jax.Array:
        z = to_float(x)
        z = max_pool(jax.nn.relu(self.conv1(z)))
        z = max_pool(jax.nn.relu(self.conv2(z)))
        return jax.nn.relu(self.fc1(z.reshape(z.shape[0], -1)))


def _group_norm(features: int, rngs: nnx.Rngs) -> nnx.GroupNorm:
    return nnx.GroupNorm(features, num_groups=min(32, features), epsilon=1e-5, rngs=rngs)


class BasicBlock(nnx.Module):
    """ResNet basic block: two 3x3 convs with GroupNorm, identity or 1x1 projection shortcut."""

    def __init__(self, cin: int, cout: int, stride: int, *, conv_impl: str, rngs: nnx.Rngs):
        self.conv1 = Conv2D(
            cin, cout, 3, stride=stride, padding="SAME", use_bias=False, impl=conv_impl, rngs=rngs
        )
        self.norm1 = _group_norm(cout, rngs)
        self.conv2 = Conv2D(
            cout, cout, 3, padding="SAME", use_bias=False, impl=conv_impl, rngs=rngs
        )
        self.norm2 = _group_norm(cout, rngs)
        if stride != 1 or cin != cout:
            self.proj: Conv2D | None = Conv2D(
                cin, cout, 1, stride=stride, use_bias=False, impl=conv_impl, rngs=rngs
            )
            self.proj_norm: nnx.GroupNorm | None = _group_norm(cout, rngs)
        else:
            self.proj = None
            self.proj_norm = None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jax.nn.relu(self.norm1(self.conv1(x)))
        y = self.norm2(self.conv2(y))
        skip = x
        if self.proj is not None and self.proj_norm is not None:  # set together
            skip = self.proj_norm(self.proj(x))
        return jax.nn.relu(y + skip)


class ResNet18(_Headed):
    """ResNet-18 for 32x32 inputs, with GroupNorm instead of BatchNorm.

    Stem: one 3x3 stride-1 conv (64) + GroupNorm + ReLU, no max-pool (the usual CIFAR stem; the
    ImageNet 7x7/2 conv + pool would shrink 32x32 to 8x8 before the first block). Then 4 stages
    of 2 basic blocks (64, 128, 256, 512 channels; stride 2 from the second stage), global
    average pooling and a linear classifier. GroupNorm (32 groups, fewer when a layer has fewer
    channels) keeps the model purely parametric: stacking N clients needs no per-client batch
    statistics, and FedAvg-style averaging of all parameters is well defined.
    Representation: the pooled 512 features; head: the linear classifier.
    """

    STAGES = (64, 128, 256, 512)

    def __init__(
        self, input_shape: Shape3, num_classes: int, *, conv_impl: str = "im2col", rngs: nnx.Rngs
    ):
        c = input_shape[2]
        self.stem = Conv2D(c, 64, 3, padding="SAME", use_bias=False, impl=conv_impl, rngs=rngs)
        self.stem_norm = _group_norm(64, rngs)
        cin = 64
        for i, cout in enumerate(self.STAGES):
            for j in range(2):
                stride = 2 if (i > 0 and j == 0) else 1
                block = BasicBlock(cin, cout, stride, conv_impl=conv_impl, rngs=rngs)
                setattr(self, f"layer{i + 1}_{j}", block)
                cin = cout
        self.out = nnx.Linear(cin, num_classes, rngs=rngs)

    def features(self, x: jax.Array) -> jax.Array:
        z = jax.nn.relu(self.stem_norm(self.stem(to_float(x))))
        for i in range(len(self.STAGES)):
            for j in range(2):
                z = getattr(self, f"layer{i + 1}_{j}")(z)
        return z.mean(axis=(1, 2))
