"""The body/head contract of the models: declared heads, representations, refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pfedwn_jax.models import (
    get_model,
    head_mask,
    head_of,
    merge_parts,
    register_model,
    require_split,
    unregister_model,
    with_head,
)


@pytest.mark.parametrize(
    ("name", "shape", "dim"),
    [("logreg", (5, 5, 1), 25), ("mlp", (5, 5, 1), 200), ("cnn", (16, 16, 1), 512)],
)
def test_builtin_models_split_into_representation_and_output_layer(name, shape, dim):
    model = get_model(name, 3, shape)
    params = model.init(jax.random.PRNGKey(0))
    x = jax.random.randint(jax.random.PRNGKey(1), (4, *shape), 0, 256).astype(jnp.uint8)
    z = model.features(params, x)
    assert z.shape == (4, dim)
    np.testing.assert_allclose(model.classify(params, z), model.apply(params, x), rtol=1e-5)
    mask = head_mask(model, params)
    assert mask["out"] == {"kernel": True, "bias": True}
    assert not any(jax.tree.leaves({k: v for k, v in mask.items() if k != "out"}))
    # the head is the logits' affine map of the representation
    manual = z @ params["out"]["kernel"] + params["out"]["bias"]
    np.testing.assert_allclose(model.classify(params, z), manual, rtol=1e-5, atol=1e-6)


def test_head_helpers_swap_and_merge_parts():
    model = get_model("mlp", 3, (5, 5, 1))
    a, b = model.init(jax.random.PRNGKey(0)), model.init(jax.random.PRNGKey(1))
    mixed = merge_parts(head_mask(model, a), a, b)  # head of a, body of b
    assert mixed["out"]["kernel"] is a["out"]["kernel"] and mixed["fc1"]["bias"] is b["fc1"]["bias"]
    swapped = with_head(model, b, head_of(model, a))
    assert jax.tree.structure(swapped) == jax.tree.structure(a)
    assert swapped["out"] is a["out"] and swapped["fc2"] is b["fc2"]
    stacked = jax.tree.map(lambda p: jnp.stack([p, p]), a)  # per-slot params: same mask
    assert jax.tree.leaves(head_mask(model, stacked)) == jax.tree.leaves(head_mask(model, a))


class _Plain(nnx.Module):
    def __init__(self, input_shape, num_classes, *, rngs):
        self.out = nnx.Linear(int(np.prod(input_shape)), num_classes, rngs=rngs)

    def __call__(self, x):
        return self.out(x.reshape(x.shape[0], -1).astype(jnp.float32))


class _BadHead(_Plain):
    HEAD = ("classifier",)

    def features(self, x):
        return x.reshape(x.shape[0], -1).astype(jnp.float32)

    def classify(self, z):
        return self.out(z)


def test_a_model_without_a_split_is_refused_by_name():
    register_model("plain-test", _Plain)
    register_model("badhead-test", _BadHead)
    try:
        model = get_model("plain-test", 3, (5, 5, 1))
        assert model.head == () and model.features is None
        with pytest.raises(ValueError, match=r"method 'fedper'.*model 'plain-test'.*HEAD"):
            require_split(model, "fedper")
        with pytest.raises(ValueError, match=r"model 'badhead-test': HEAD must.*\['out'\]"):
            get_model("badhead-test", 3, (5, 5, 1))
    finally:
        unregister_model("plain-test")
        unregister_model("badhead-test")
