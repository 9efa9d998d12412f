"""The per-link work in chunks gives what the whole network at once gives, bit for bit.

Chunks of targets (pFedWN's EM, FedAMP's distances) and blocks of parameters (`mix_sparse`)
bound the working memory; on the CPU the order of every sum stays the same, so the results
are identical (`assert_array_equal`), not merely close. The unchunked references are the same
functions with one chunk holding every row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_groups import ADJ
from toy_groups import make_ctx as toy_ctx

from pfedwn_jax.algorithms import get_algorithm, make_hparams, neighbor_lists
from pfedwn_jax.algorithms.common import init_baseline, local_update
from pfedwn_jax.algorithms.pfedwn import em_components
from pfedwn_jax.engine import mix_sparse, neighbor_sq_dist
from pfedwn_jax.engine.tree import by_columns, chunked_rows, mix_sparse_masked, rows_in_place

equal = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)
CLASSES = [[0, 1], [0, 1], [2, 3], [1, 2], [0, 3], [3]]


def make_ctx(is_target=None):
    return toy_ctx(CLASSES, ADJ, np.ones(6, bool) if is_target is None else is_target)


def random_params(s: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "a": jnp.asarray(rng.normal(size=(s, 3, 2)), jnp.float32),
        "b": {"c": jnp.asarray(rng.normal(size=(s, 5)), jnp.float32)},
    }


def test_chunked_rows_pads_the_last_chunk_and_drops_it():
    seen = []

    def fn(rows, real):
        seen.append(rows.shape)
        return {"r": rows * 10, "real": real}

    out = jax.jit(lambda: chunked_rows(fn, 7, 3))()
    np.testing.assert_array_equal(out["r"], np.arange(7) * 10)
    assert out["real"].all() and seen == [(3,)]
    one = chunked_rows(fn, 7, 100)  # one chunk: every row, no loop
    np.testing.assert_array_equal(one["r"], np.arange(7) * 10)


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_rows_in_place_updates_every_row_once(chunk):
    """Each row is replaced once by `fn` of its own values (applied twice would show), the
    padded rows of the last chunk are dropped, and `real` marks them."""
    tree = {"a": jnp.arange(7, dtype=jnp.float32), "b": jnp.ones((7, 2), jnp.float32)}
    reals = []

    def fn(rows, real, part):
        reals.append(real.shape)
        return {"a": part["a"] * 2 + 1 + 0 * rows, "b": part["b"] * jnp.where(real, 3, -1)[:, None]}

    out = jax.jit(lambda t: rows_in_place(fn, t, chunk))(tree)
    np.testing.assert_array_equal(out["a"], np.arange(7) * 2 + 1)
    np.testing.assert_array_equal(out["b"], np.full((7, 2), 3.0))
    assert reals == [(min(chunk, 7),)]


@pytest.mark.parametrize("columns", [None, 1, 4, 7])
@pytest.mark.parametrize("stale", [False, True])
def test_mix_sparse_masked_equals_a_per_coordinate_loop(columns, stale):
    """DisPFL's sparse average against a loop over slots, list entries and coordinates: each
    coordinate averaged over the entries whose sender's mask keeps it (none: the own value),
    then masked; with a pool of stale copies after the slots' own models."""
    rng = np.random.default_rng(3)
    s, k, d = 4, 3, 10
    masks = rng.random((s, d)) < 0.5
    pool = rng.normal(size=(s + (s * k if stale else 0), d)).astype(np.float32)
    pool[:s] *= masks
    sources = np.stack([np.arange(s), (np.arange(s) + 1) % s, (np.arange(s) + 2) % s], 1)
    index = sources if not stale else np.where(rng.random((s, k)) < 0.5, sources,
                                               s + np.arange(s * k).reshape(s, k))  # fmt: skip
    weights = (rng.random((s, k)) < 0.7).astype(np.float32)
    weights[:, 0] = 1
    want = np.zeros((s, d), np.float32)
    for i in range(s):
        for j in range(d):
            t = sum(weights[i, e] * pool[index[i, e], j] for e in range(k))
            c = sum(weights[i, e] * masks[sources[i, e], j] for e in range(k))
            want[i, j] = (t / c if c > 0 else pool[i, j]) * masks[i, j]
    got = jax.jit(lambda p, m: mix_sparse_masked(p, index, m, sources, weights, columns=columns))(
        {"w": jnp.asarray(pool)}, {"w": jnp.asarray(masks)}
    )
    np.testing.assert_allclose(got["w"], want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("rows_out", [5, 3])
def test_by_columns_covers_every_column_once(rows_out):
    a = jnp.asarray(np.random.default_rng(0).normal(size=(5, 11)), jnp.float32)
    fn = lambda b: b[:rows_out] * 2.0 + 1.0  # applied twice to a column would show
    for columns in (1, 3, 4, 11, 20):
        got = jax.jit(lambda x, c=columns: by_columns(fn, x, rows_out, c))(a)
        np.testing.assert_array_equal(got, fn(a))


def test_mix_sparse_in_blocks_equals_one_block():
    params = random_params(6)
    nbr, mask = neighbor_lists(ADJ)
    w = np.random.default_rng(1).uniform(size=nbr.shape).astype(np.float32) * mask
    whole = mix_sparse(params, nbr, w, columns=10**6)
    for columns in (1, 4):
        equal(jax.jit(lambda p, c=columns: mix_sparse(p, nbr, w, columns=c))(params), whole)
    pool = jax.tree.map(lambda a: jnp.concatenate([a, a[::-1] + 1.0]), params)  # S_out < S_in
    index = (nbr + 6 * (np.arange(nbr.shape[1]) % 2)).astype(np.int32)
    equal(mix_sparse(pool, index, w, columns=3), mix_sparse(pool, index, w, columns=10**6))


def test_neighbor_sq_dist_in_chunks_equals_one_chunk():
    params = random_params(6, seed=3)
    nbr, _ = neighbor_lists(ADJ)
    whole = neighbor_sq_dist(params, nbr, chunk=6)
    for chunk in (1, 4):
        equal(jax.jit(lambda p, c=chunk: neighbor_sq_dist(p, nbr, chunk=c))(params), whole)


def test_local_train_of_a_subset_with_its_ids_trains_as_among_all():
    ctx = make_ctx()
    state = init_baseline(jax.random.PRNGKey(0), ctx, None).clients
    key = jax.random.PRNGKey(4)
    full, _ = jax.jit(lambda s: local_update(ctx, s, key))(state)
    rows = jnp.asarray([4, 1], jnp.int32)
    part = jax.tree.map(lambda a: a[rows], state)

    def some(s):
        return local_update(ctx, s, key, data_client=ctx.data_client[rows], slot_ids=rows)

    got, _ = jax.jit(some)(part)
    equal(got.params, jax.tree.map(lambda a: a[rows], full.params))


def _trained_params(ctx):
    local = get_algorithm("local")
    state = local.init(jax.random.PRNGKey(0), ctx, make_hparams(local))
    return local.round(state, jax.random.PRNGKey(1), ctx, None)[0].clients.params


@pytest.mark.parametrize(
    ("overrides", "chunks"),
    [
        ({}, (4,)),
        pytest.param({"pi_from": "components"}, (1, 4), marks=pytest.mark.slow),
        pytest.param({"mix_components": True}, (1, 4), marks=pytest.mark.slow),
    ],
    ids=["received", "components", "mix_components"],
)
def test_pfedwn_round_in_chunks_equals_one_chunk(overrides, chunks):
    """An EM round (estimate, then Eq. 5 over the received models or, with
    `mix_components`, over the components) with 6 targets (one not a target) in chunks of 4
    (two chunks, the last padded) or 1 equals the round in one chunk: pi, its trace, models."""
    ctx = make_ctx(is_target=np.array([True, True, True, False, True, True]))
    params = _trained_params(ctx)
    key = jax.random.PRNGKey(5)
    alg = get_algorithm("pfedwn")
    hp = lambda c: make_hparams(alg, {"em_steps": 2, "chunk": c, **overrides})
    state = alg.init(jax.random.PRNGKey(0), ctx, hp(6))
    state = state._replace(clients=state.clients._replace(params=params), rounds_done=1)
    whole = jax.jit(lambda s: alg.round(s, key, ctx, hp(6))[0])(state)
    assert float(np.asarray(whole.pi).max()) > 0  # EM ran
    for chunk in chunks:
        equal(jax.jit(lambda s, c=chunk: alg.round(s, key, ctx, hp(c))[0])(state), whole)
    if overrides.get("mix_components"):  # M-step 2 ran: the components moved
        comps = jax.jit(lambda p: em_components(p, key, ctx, hp(6)))(params)
        received = jax.tree.map(lambda a: a[np.asarray(ctx.neighbors)[:, 1:]], params)
        moved = [np.abs(a - b).max() for a, b in zip(*map(jax.tree.leaves, (comps, received)))]
        assert max(moved) > 1e-4


@pytest.mark.parametrize("detach", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_fedamp_in_chunks_equals_one_chunk(detach):
    ctx = make_ctx()
    alg = get_algorithm("fedamp")
    hp = lambda c: make_hparams(alg, {"chunk": c, "detach_attention": detach, "sigma": 0.5})
    state = alg.init(jax.random.PRNGKey(0), ctx, hp(6))
    state = state._replace(clients=state.clients._replace(params=_trained_params(ctx)))
    key = jax.random.PRNGKey(2)
    out = [jax.jit(lambda s, c=c: alg.round(s, key, ctx, hp(c))[0])(state) for c in (1, 4, 6)]
    equal(out[0], out[2])  # a chunk of one row is computed as one of two (ulp, engine.tree)
    equal(out[1], out[2])
