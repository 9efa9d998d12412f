"""Models: `get_model(name, num_classes, input_shape) -> Model(name, init, apply, ...)`.

A user's own flax NNX module joins the built-in ones through `register_model` (docs/models.md).
A model may declare its body and head (`models.split`).
"""

from pfedwn_jax.models.layers import Conv2D, conv2d, max_pool
from pfedwn_jax.models.registry import (
    Model,
    available_models,
    check_model_fits,
    get_model,
    register_model,
    unregister_model,
)
from pfedwn_jax.models.split import head_mask, head_of, merge_parts, require_split, with_head

__all__ = [
    "Conv2D",
    "Model",
    "available_models",
    "check_model_fits",
    "conv2d",
    "get_model",
    "head_mask",
    "head_of",
    "max_pool",
    "merge_parts",
    "register_model",
    "require_split",
    "unregister_model",
    "with_head",
]
