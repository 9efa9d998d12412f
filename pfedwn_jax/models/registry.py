"""`get_model`: a network as a pair of pure functions over a plain-dict parameter pytree.

A flax NNX module is split once into its graph definition and parameters; `init` returns the
parameters as a nested dict of arrays (`nnx.to_pure_dict`) and `apply` merges them back for the
forward pass. Plain dicts stack along a leading client axis with `vmap`/`tree.map`, take optax
updates, and survive `jit`/`vmap`/`scan`/`grad` (twice) without any flax machinery in the way.

The registry maps names to module builders: the built-in architectures plus any a user adds
with `register_model` (see docs/models.md).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from pfedwn_jax._checks import check_choice, check_int
from pfedwn_jax.models.nets import CNN, MLP, LogReg, ResNet18, cnn_feature_size

Params = Any  # nested dict of arrays


class Model(NamedTuple):
    """A network as pure functions.

    Attributes:
      name: registry name.
      init: `init(key) -> params`, one client's parameter pytree (nested dict of float32).
      apply: `apply(params, x) -> logits [B, num_classes]` for raw `x [B, *input_shape]` of
        `input_dtype` (uint8 images `[B, H, W, C]` or float32 features, e.g. `[B, d]`).
      input_shape: the shape of one input the model was built for: `(H, W, C)` or `(d,)`.
      num_classes: number of output logits.
      input_dtype: "uint8" (pixels, normalised inside) or "float32" (features).
      head: the top-level parameter keys of the head (classifier); the rest is the body
        (representation). Empty for a model that declares no split (see `models.split`).
      features: `features(params, x) -> z [B, D]`, the representation (the body's output,
        the head's input), or None.
      classify: `classify(params, z) -> logits [B, num_classes]`, the head on a
        representation (it reads the head's parameters only), or None.
        `apply(params, x) == classify(params, features(params, x))`.
    """

    name: str
    init: Callable[[jax.Array], Params]
    apply: Callable[[Params, jax.Array], jax.Array]
    input_shape: tuple[int, ...] = (28, 28, 1)
    num_classes: int = 10
    input_dtype: str = "uint8"
    head: tuple[str, ...] = ()
    features: Callable[[Params, jax.Array], jax.Array] | None = None
    classify: Callable[[Params, jax.Array], jax.Array] | None = None


INPUT_DTYPES = ("uint8", "float32")


def _check_image(model: str, input_shape: tuple[int, ...]) -> None:
    """A conv net takes images `(H, W, C)`; say so for a feature vector's shape."""
    if len(input_shape) != 3:
        raise ValueError(
            f"model {model!r} takes images of shape (H, W, C); got input_shape {input_shape} "
            "(for feature vectors use 'mlp' or 'logreg')"
        )


def _check_cnn(input_shape: tuple[int, ...]) -> None:
    _check_image("cnn", input_shape)
    fh, fw = cnn_feature_size(input_shape)  # type: ignore[arg-type]
    if fh < 1 or fw < 1:
        raise ValueError(
            f"input_shape {input_shape} is too small for model 'cnn' (two 5x5 VALID convs and "
            "two 2x2 pools need H, W >= 16)"
        )


def _check_resnet(input_shape: tuple[int, ...]) -> None:
    _check_image("resnet18", input_shape)
    if min(input_shape[:2]) < 8:
        raise ValueError(f"input_shape {input_shape} is too small for model 'resnet18' (H, W >= 8)")


ModuleBuilder = Callable[..., nnx.Module]
ShapeCheck = Callable[[tuple[int, ...]], None]


@dataclasses.dataclass(frozen=True)
class _Arch:
    """A registry entry (hashable: part of the build cache key)."""

    builder: ModuleBuilder  # builder(input_shape, num_classes, *, rngs[, conv_impl]) -> module
    check_shape: ShapeCheck | None = None  # raises ValueError for shapes it cannot take
    takes_conv_impl: bool = False


_BUILTIN: dict[str, _Arch] = {
    "cnn": _Arch(CNN, _check_cnn, True),
    "resnet18": _Arch(ResNet18, _check_resnet, True),
    "mlp": _Arch(MLP),
    "logreg": _Arch(LogReg),
}
_ARCHS: dict[str, _Arch] = dict(_BUILTIN)


def available_models() -> list[str]:
    """Names accepted by `get_model` (built-in and registered), sorted."""
    return sorted(_ARCHS)


def register_model(
    name: str,
    builder: ModuleBuilder,
    *,
    check_shape: ShapeCheck | None = None,
    takes_conv_impl: bool = False,
) -> None:
    """Make a user's flax NNX module available to `get_model` and `ExperimentConfig(model=)`.

    Args:
      name: the new model name (a non-empty string without whitespace, not yet registered).
      builder: `builder(input_shape, num_classes, *, rngs) -> nnx.Module`, typically the module
        class itself; `input_shape` is one sample's shape, `(H, W, C)` for images or `(d,)`
        for feature vectors. The module maps raw inputs `[B, *input_shape]` (uint8 images or
        float32 features) to logits `[B, num_classes]` and has parameters only (no batch
        statistics).
      check_shape: optional `check_shape(input_shape)` raising `ValueError` for shapes the
        module cannot take, so a misfit fails before anything is compiled.
      takes_conv_impl: pass `get_model`'s `conv_impl` to the builder as a keyword.

    Raises `ValueError` naming the bad value: a taken or malformed name, a builder or
    check_shape that is not callable, a non-bool `takes_conv_impl`.
    """
    if not isinstance(name, str) or not name or name != "".join(name.split()):
        raise ValueError(f"model name must be a non-empty string without spaces; got {name!r}")
    if name in _ARCHS:
        raise ValueError(
            f"model name {name!r} is already registered (available: {available_models()}); "
            "call unregister_model first to replace a model you registered"
        )
    if not callable(builder) or not _hashable(builder):
        raise ValueError(
            f"builder for model {name!r} must be a hashable callable (e.g. an nnx.Module "
            f"class or a function); got {builder!r}"
        )
    if check_shape is not None and not (callable(check_shape) and _hashable(check_shape)):
        raise ValueError(
            f"check_shape for model {name!r} must be callable or None; got {check_shape!r}"
        )
    if not isinstance(takes_conv_impl, bool):
        raise ValueError(f"takes_conv_impl must be a bool; got {takes_conv_impl!r}")
    _ARCHS[name] = _Arch(builder, check_shape, takes_conv_impl)


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def unregister_model(name: str) -> None:
    """Remove a model added by `register_model` (built-in models cannot be removed)."""
    if name in _BUILTIN:
        raise ValueError(f"model {name!r} is built in and cannot be unregistered")
    if name not in _ARCHS:
        registered = sorted(set(_ARCHS) - set(_BUILTIN))
        raise ValueError(f"model {name!r} is not registered; registered models: {registered}")
    del _ARCHS[name]


SHAPE_HELP = "a non-empty tuple of positive integers: (H, W, C) for images, (d,) for features"


def _check_shape(input_shape: Any) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in input_shape)
    except (TypeError, ValueError):
        raise ValueError(f"input_shape must be {SHAPE_HELP}; got {input_shape!r}") from None
    if not shape or min(shape) < 1:
        raise ValueError(f"input_shape must be {SHAPE_HELP}; got {shape}")
    return shape


def _check_dtype(input_dtype: Any) -> str:
    """ "uint8" or "float32" from a dtype or its name."""
    try:
        name = str(jnp.dtype(input_dtype))
    except TypeError:
        name = repr(input_dtype)
    return check_choice("input_dtype", name, INPUT_DTYPES)


def get_model(
    name: str,
    num_classes: int,
    input_shape: Any,
    *,
    conv_impl: str = "im2col",
    input_dtype: Any = "uint8",
) -> Model:
    """Build model `name` (see `available_models`) for inputs of `input_shape` and
    `input_dtype`: `(H, W, C)` uint8 images or float32 features such as `(d,)` vectors.

    Built in: "cnn", "resnet18" (images), "mlp", "logreg" (any shape); `register_model` adds
    more. `conv_impl` ("im2col" or "lax") selects the convolution kernel of the conv nets.
    Calls with equal arguments return the *same* `Model` object, so jitted functions taking
    the model as a static argument are compiled once. Raises `ValueError` for an unknown name,
    a bad class count, dtype or shape, a shape the architecture cannot take, or a module whose
    output is not `[B, num_classes]` logits.
    """
    check_choice("model", name, available_models())
    num_classes = check_int("num_classes", num_classes, 2)
    check_choice("conv_impl", conv_impl, ("im2col", "lax"))
    shape, dtype = _check_shape(input_shape), _check_dtype(input_dtype)
    return _build(name, _ARCHS[name], num_classes, shape, conv_impl, dtype)


@functools.lru_cache(maxsize=64)
def _build(
    name: str,
    arch: _Arch,
    num_classes: int,
    input_shape: tuple[int, ...],
    conv_impl: str,
    input_dtype: str,
) -> Model:
    """The `Model` of `arch`; keyed on the entry too, so a re-registered name is rebuilt."""
    if arch.check_shape is not None:
        arch.check_shape(input_shape)
    kwargs = {"conv_impl": conv_impl} if arch.takes_conv_impl else {}

    def make(key: jax.Array) -> nnx.Module:
        return arch.builder(input_shape, num_classes, rngs=nnx.Rngs(params=key), **kwargs)

    def init(key: jax.Array) -> Params:
        return nnx.to_pure_dict(nnx.state(make(key)))

    x = jax.ShapeDtypeStruct((2, *input_shape), jnp.dtype(input_dtype))
    graphdef, head = _check_abstract(name, make, x, num_classes)

    def apply(params: Params, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, params)(x)

    if not head:
        return Model(name, init, apply, input_shape, num_classes, input_dtype)

    def features(params: Params, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, params).features(x)

    def classify(params: Params, z: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, params).classify(z)

    return Model(name, init, apply, input_shape, num_classes, input_dtype, head, features, classify)


def _check_abstract(
    name: str, make: Callable, x: jax.ShapeDtypeStruct, num_classes: int
) -> tuple[Any, tuple[str, ...]]:
    """Build and run the module abstractly (no FLOPs, no compilation); return its graphdef
    and its declared head (`declared_head`; empty if it declares none).

    Raises `ValueError` naming the model unless it builds, holds parameters only and maps the
    batch `x [2, *input_shape]` to float logits `[2, num_classes]`.
    """
    inputs = f"{x.dtype} inputs {x.shape} for num_classes={num_classes}"
    try:
        module = nnx.eval_shape(lambda: make(jax.random.key(0)))
        check_parameters_only(name, module)
        graphdef, state = nnx.split(module)
        params = nnx.to_pure_dict(state)
        out = jax.eval_shape(lambda p, x: nnx.merge(graphdef, p)(x), params, x)
        head = declared_head(name, module, graphdef, params, x)
    except ValueError:
        raise
    except Exception as e:  # a user module's own error, reported at the API boundary
        raise ValueError(
            f"model {name!r} cannot be built or run on {inputs}: "
            f"{type(e).__name__}: {e}{_rng_hint(e)}"
        ) from e
    shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
    if shape != (2, num_classes) or dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"model {name!r} must map inputs [B, *input_shape] to float logits "
            f"[B, num_classes={num_classes}]; for {inputs} it returned {shape} {dtype}"
        )
    return graphdef, head


SPLIT_HELP = (
    "a model declares its split with a class attribute HEAD (a tuple of the attribute names "
    "holding the head's parameters) and two methods: features(x) -> z [B, D] (the "
    "representation) and classify(z) -> logits, with __call__(x) == classify(features(x))"
)


def declared_head(
    name: str, module: nnx.Module, graphdef: Any, params: Params, x: Any
) -> tuple[str, ...]:
    """The head a module declares (`HEAD`, with `features` and `classify`), checked: its
    names are top-level parameter keys and `classify(features(x))` gives logits; `()` when
    it declares none. Raises `ValueError` naming the model for a malformed declaration."""
    head = getattr(module, "HEAD", None)
    if head is None:
        return ()
    keys = sorted(params) if isinstance(params, dict) else []
    if (
        not isinstance(head, tuple)
        or not head
        or any(not isinstance(h, str) or h not in keys for h in head)
    ):
        raise ValueError(
            f"model {name!r}: HEAD must be a non-empty tuple of its parameter groups {keys}; "
            f"got {head!r} ({SPLIT_HELP})"
        )
    if not all(callable(getattr(module, f, None)) for f in ("features", "classify")):
        raise ValueError(
            f"model {name!r} declares HEAD but not features and classify ({SPLIT_HELP})"
        )

    def composed(p: Params, x: jax.Array) -> jax.Array:
        m = nnx.merge(graphdef, p)
        return m.classify(m.features(x))

    jax.eval_shape(composed, params, x)
    return head


NOT_PARAMETERS_HINT = (
    "The engine stacks, trains and averages parameters (nnx.Param) only, so any other state "
    "would be averaged across clients as if it were a parameter. Use a per-sample "
    "normalisation, GroupNorm or LayerNorm (nnx.GroupNorm, nnx.LayerNorm), instead of "
    "BatchNorm, and no dropout (or dropout without its own rngs, deterministic=True)."
)


def check_parameters_only(name: str, module: nnx.Module) -> None:
    """Raise `ValueError` naming the layers of `module` that hold state other than `nnx.Param`:
    BatchNorm running statistics (nnx.BatchNorm, or a linen BatchNorm's `batch_stats` through
    `nnx.bridge`), a layer's own RNG stream (nnx.Dropout(rngs=...)), any other variable."""
    others = nnx.to_flat_state(nnx.state(module, nnx.Not(nnx.Param)))
    if not others:
        return
    layers = {p: type(n).__name__ for p, n in nnx.iter_graph(module) if isinstance(n, nnx.Module)}
    found: dict[str, list[str]] = {}
    for path, variable in others:
        owner = max((p for p in layers if path[: len(p)] == p), key=len)
        where = ".".join(map(str, owner)) or "the model"
        found.setdefault(f"{where} ({layers[owner]})", []).append(
            f"{'.'.join(map(str, path[len(owner) :]))}: {_state_kind(variable)}"
        )
    listed = "; ".join(f"{layer}: {', '.join(items)}" for layer, items in found.items())
    raise ValueError(
        f"model {name!r} has state that is not a parameter, in {listed}. " + NOT_PARAMETERS_HINT
    )


def _state_kind(variable: Any) -> str:
    """What a non-parameter variable is, in the words of the layer that makes it."""
    cls = getattr(variable, "type", type(variable))  # flax < 0.11 holds a VariableState
    cls = cls if isinstance(cls, type) else type(variable)
    if issubclass(cls, nnx.BatchStat):
        return f"BatchNorm running statistics ({cls.__name__})"
    if issubclass(cls, nnx.RngState):
        return f"an RNG stream such as Dropout's ({cls.__name__})"
    return f"mutable state ({cls.__name__})"


def _rng_hint(error: Exception) -> str:
    """A hint for a layer that asked the builder's `rngs` for a stream other than `params`."""
    if isinstance(error, KeyError) and "RngStream" in str(error):
        return (
            "; the builder's rngs hold the 'params' stream only: layers with their own random "
            f"state (nnx.Dropout) are not supported. {NOT_PARAMETERS_HINT}"
        )
    return ""


def check_model_fits(
    model: Model, input_shape: Any, num_classes: int | None = None, input_dtype: Any = None
) -> None:
    """Raise `ValueError` unless `model` was built for `input_shape` (and `num_classes`,
    `input_dtype` when given)."""
    shape = _check_shape(input_shape)
    if shape != tuple(model.input_shape):
        raise ValueError(
            f"model {model.name!r} was built for input_shape {tuple(model.input_shape)}; "
            f"the data has {shape}"
        )
    if input_dtype is not None and _check_dtype(input_dtype) != model.input_dtype:
        raise ValueError(
            f"model {model.name!r} was built for {model.input_dtype} inputs; the data is "
            f"{_check_dtype(input_dtype)} (get_model(..., input_dtype=...))"
        )
    if num_classes is not None and int(num_classes) > model.num_classes:
        raise ValueError(
            f"model {model.name!r} has {model.num_classes} outputs; the data has "
            f"num_classes={int(num_classes)}"
        )
