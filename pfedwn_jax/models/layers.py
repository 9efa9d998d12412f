"""Layers whose gradients stay fast when many clients are vmapped or scanned on XLA:CPU.

`conv2d` computes a convolution as *shifted slices plus one matmul* (im2col). Its backward pass
is a matmul plus pads/adds, never a convolution, which avoids two slow paths of XLA:CPU: the
backward of `lax.conv_general_dilated` inside `scan`/`map` (JAX issue #12868) and the grouped
convolution that `vmap` makes of per-client kernels. Results equal `lax.conv_general_dilated`
up to float32 rounding (tested).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from pfedwn_jax._checks import check_choice


def _same_pads(size: int, k: int, stride: int) -> tuple[int, int]:
    """Low/high padding of XLA's 'SAME' rule for one spatial axis."""
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    return total // 2, total - total // 2


def conv2d(x: jax.Array, kernel: jax.Array, stride: int = 1, padding: str = "VALID") -> jax.Array:
    """Convolution by im2col: `x [B, H, W, Cin]`, `kernel [kh, kw, Cin, Cout]` -> `[B, Ho, Wo, Co]`.

    Same semantics as `lax.conv_general_dilated(x, kernel, (stride, stride), padding,
    dimension_numbers=("NHWC", "HWIO", "NHWC"))` for padding "VALID" or "SAME".
    """
    kh, kw, cin, cout = kernel.shape
    if padding == "SAME":
        (ph0, ph1), (pw0, pw1) = (
            _same_pads(x.shape[1], kh, stride),
            _same_pads(x.shape[2], kw, stride),
        )
        if ph0 or ph1 or pw0 or pw1:
            x = jnp.pad(x, ((0, 0), (ph0, ph1), (pw0, pw1), (0, 0)))
    ho = (x.shape[1] - kh) // stride + 1
    wo = (x.shape[2] - kw) // stride + 1
    cols = [
        x[:, i : i + (ho - 1) * stride + 1 : stride, j : j + (wo - 1) * stride + 1 : stride, :]
        for i in range(kh)
        for j in range(kw)
    ]
    patches = cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)
    return patches @ kernel.reshape(kh * kw * cin, cout)


def max_pool(x: jax.Array, window: int = 2) -> jax.Array:
    """Non-overlapping max pooling `[B, H, W, C] -> [B, H//w, W//w, C]` (trailing rows dropped)."""
    b, h, w, c = x.shape
    ho, wo = h // window, w // window
    x = x[:, : ho * window, : wo * window, :]
    return x.reshape(b, ho, window, wo, window, c).max(axis=(2, 4))


class Conv2D(nnx.Module):
    """Convolution layer with the same parameters as `nnx.Conv` (kernel `[kh, kw, Cin, Cout]`).

    `impl="im2col"` (default) uses `conv2d` above; `impl="lax"` uses `lax.conv_general_dilated`
    (kept for reference and for backends where it is faster).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        kernel_size: int | Sequence[int],
        *,
        stride: int = 1,
        padding: str = "VALID",
        use_bias: bool = True,
        impl: str = "im2col",
        rngs: nnx.Rngs,
    ):
        check_choice("padding", padding, ("VALID", "SAME"))
        check_choice("impl", impl, ("im2col", "lax"))
        ks = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        init = nnx.initializers.lecun_normal()
        self.kernel = nnx.Param(init(rngs.params(), (*ks, in_features, out_features)))
        self.bias = nnx.Param(jnp.zeros((out_features,))) if use_bias else None
        self.stride = stride
        self.padding = padding
        self.impl = impl

    def __call__(self, x: jax.Array) -> jax.Array:
        k = self.kernel[...]
        if self.impl == "im2col":
            y = conv2d(x, k, self.stride, self.padding)
        else:
            y = jax.lax.conv_general_dilated(
                x,
                k,
                (self.stride, self.stride),
                self.padding,
                dimension_numbers=("NHWC", "HWIO", "NHWC"),
            )
        if self.bias is not None:
            y = y + self.bias[...]
        return y
