"""The splitting methods, FedFomo, FedALA, APPLE and MOON at 1,000 nodes in network mode (slow
tier): two rounds on random neighbor lists of up to 6 neighbors, with the MLP (a body to
average); everything stays finite and nothing is ``[S, S]``."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import CLASSES, SHAPE
from test_sparse_neighbors import random_network_ctx

from pfedwn_jax.algorithms import get_algorithm, make_hparams
from pfedwn_jax.models import get_model

FIELD = ("fedper", "lgfedavg", "fedrep", "fedbabu", "fedrod", "fedfomo", "fedala", "apple", "moon")
FAST = {"fedrep": {"head_epochs": 1}, "fedbabu": {"finetune_epochs": 1},
        "fedala": {"start_epochs": 2}}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", FIELD)
def test_a_thousand_nodes_in_network_mode(name):
    s = 1000
    ctx = random_network_ctx(s, 6)
    ctx = ctx.replace(model=get_model("mlp", CLASSES, SHAPE))
    alg = get_algorithm(name)
    hp = make_hparams(alg, FAST.get(name))
    step = jax.jit(lambda st, k, c: alg.round(st, k, c, hp)[0])
    state = alg.init(jax.random.PRNGKey(0), ctx, hp)
    for r in range(2):
        state = step(state, jax.random.PRNGKey(1 + r), ctx)
    leaves = jax.tree.leaves((state, alg.eval_params(state, ctx, hp)))
    assert all(np.all(np.isfinite(np.asarray(a))) for a in leaves)
    assert all(s * s not in np.shape(a) and np.size(a) < s * s for a in leaves if np.ndim(a) <= 2)
