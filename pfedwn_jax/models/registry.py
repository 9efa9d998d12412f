"""`get_model`: a network as a pair of pure functions over a plain-dict parameter pytree.

A flax NNX module is split once into its graph definition and parameters; `init` returns the
parameters as a nested dict of arrays (`nnx.to_pure_dict`) and `apply` merges them back for the
forward pass. Plain dicts stack along a leading client axis with `vmap`/`tree.map`, take optax
updates, and survive `jit`/`vmap`/`scan`/`grad` (twice) without any flax machinery in the way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
from flax import nnx

from pfedwn_jax._checks import check_choice, check_int
from pfedwn_jax.models.nets import CNN, MLP, LogReg, ResNet18, cnn_feature_size

Params = Any  # nested dict of arrays


class Model(NamedTuple):
    """A network as pure functions.

    Attributes:
      name: registry name.
      init: `init(key) -> params`, one client's parameter pytree (nested dict of float32).
      apply: `apply(params, x) -> logits [B, num_classes]` for raw `uint8 x [B, H, W, C]`.
      input_shape: `(H, W, C)` the model was built for.
      num_classes: number of output logits.
    """

    name: str
    init: Callable[[jax.Array], Params]
    apply: Callable[[Params, jax.Array], jax.Array]
    input_shape: tuple[int, int, int] = (28, 28, 1)
    num_classes: int = 10


def _check_cnn(input_shape: tuple[int, int, int]) -> None:
    fh, fw = cnn_feature_size(input_shape)
    if fh < 1 or fw < 1:
        raise ValueError(
            f"input_shape {input_shape} is too small for model 'cnn' (two 5x5 VALID convs and "
            "two 2x2 pools need H, W >= 16)"
        )


def _check_resnet(input_shape: tuple[int, int, int]) -> None:
    if min(input_shape[:2]) < 8:
        raise ValueError(f"input_shape {input_shape} is too small for model 'resnet18' (H, W >= 8)")


_ARCHS: dict[str, tuple[type[nnx.Module], Callable[[tuple[int, int, int]], None] | None, bool]] = {
    # name: (module class, extra shape check, takes conv_impl)
    "cnn": (CNN, _check_cnn, True),
    "resnet18": (ResNet18, _check_resnet, True),
    "mlp": (MLP, None, False),
    "logreg": (LogReg, None, False),
}


def available_models() -> list[str]:
    """Names accepted by `get_model`."""
    return sorted(_ARCHS)


def _check_shape(input_shape: Any) -> tuple[int, int, int]:
    try:
        shape = tuple(int(d) for d in input_shape)
    except (TypeError, ValueError):
        raise ValueError(f"input_shape must be (H, W, C) integers; got {input_shape!r}") from None
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"input_shape must be (H, W, C) with positive entries; got {shape}")
    return shape  # type: ignore[return-value]


def get_model(name: str, num_classes: int, input_shape: Any, *, conv_impl: str = "im2col") -> Model:
    """Build model `name` ("cnn", "resnet18", "mlp", "logreg") for `input_shape = (H, W, C)`.

    `conv_impl` ("im2col" or "lax") selects the convolution kernel of the conv nets. Calls with
    equal arguments return the *same* `Model` object, so jitted functions taking the model as a
    static argument are compiled once. Raises `ValueError` for an unknown name, a bad class count
    or a shape the architecture cannot take.
    """
    check_choice("model", name, available_models())
    num_classes = check_int("num_classes", num_classes, 2)
    check_choice("conv_impl", conv_impl, ("im2col", "lax"))
    return _build(name, num_classes, _check_shape(input_shape), conv_impl)


@functools.lru_cache(maxsize=64)
def _build(name: str, num_classes: int, input_shape: tuple[int, int, int], conv_impl: str) -> Model:
    cls, shape_check, takes_impl = _ARCHS[name]
    if shape_check is not None:
        shape_check(input_shape)
    kwargs = {"conv_impl": conv_impl} if takes_impl else {}

    def make(key: jax.Array) -> nnx.Module:
        return cls(input_shape, num_classes, rngs=nnx.Rngs(params=key), **kwargs)

    graphdef, _ = nnx.split(nnx.eval_shape(lambda: make(jax.random.key(0))))

    def init(key: jax.Array) -> Params:
        return nnx.to_pure_dict(nnx.state(make(key)))

    def apply(params: Params, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, params)(x)

    return Model(name, init, apply, input_shape, num_classes)


def check_model_fits(model: Model, input_shape: Any, num_classes: int | None = None) -> None:
    """Raise `ValueError` unless `model` was built for `input_shape` (and `num_classes`)."""
    shape = _check_shape(input_shape)
    if shape != tuple(model.input_shape):
        raise ValueError(
            f"model {model.name!r} was built for input_shape {tuple(model.input_shape)}; "
            f"the data has {shape}"
        )
    if num_classes is not None and int(num_classes) > model.num_classes:
        raise ValueError(
            f"model {model.name!r} has {model.num_classes} outputs; the data has "
            f"num_classes={int(num_classes)}"
        )
