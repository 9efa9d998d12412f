"""Body and head: which parameters are a model's representation and which its classifier.

A model declares its split (``Model.head``, ``features``, ``classify``; see
``models.registry.declared_head``): every built-in model's head is its output layer ``out``.
The splitting methods (FedPer, FedRep, FedBABU, LG-FedAvg, FedRoD) and MOON read it through
the functions here, which work on one client's parameters or on stacked ``[S, ...]`` ones
alike (the head is chosen by top-level key).
"""

from __future__ import annotations

from typing import Any

import jax

from pfedwn_jax.models.registry import SPLIT_HELP, Model, Params


def require_split(model: Model, method: str) -> Model:
    """``model`` if it declares a body/head split, else a ``ValueError`` naming both."""
    if not model.head or model.features is None or model.classify is None:
        raise ValueError(
            f"method {method!r} splits the model into body and head, and model "
            f"{model.name!r} declares no split: {SPLIT_HELP}"
        )
    return model


def head_mask(model: Model, params: Params) -> Any:
    """The pytree of ``params``' structure with a bool leaf each: True on the head."""
    require_split(model, "head_mask")

    def is_head(path: tuple, leaf: Any) -> bool:
        return getattr(path[0], "key", None) in model.head

    return jax.tree_util.tree_map_with_path(is_head, params)


def merge_parts(mask: Any, head: Params, body: Params) -> Params:
    """The tree taking ``head``'s leaves where ``mask`` is True and ``body``'s elsewhere."""
    return jax.tree.map(lambda m, h, b: h if m else b, mask, head, body)


def head_of(model: Model, params: Params) -> Params:
    """The head's subtrees of ``params`` (a dict of the ``model.head`` keys)."""
    require_split(model, "head_of")
    return {k: params[k] for k in model.head}


def with_head(model: Model, params: Params, head: Params) -> Params:
    """``params`` with the head's subtrees replaced by ``head`` (a ``head_of`` tree)."""
    return {**params, **{k: head[k] for k in model.head}}
