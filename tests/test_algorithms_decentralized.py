"""Decentralized methods against plain per-node loops written from their papers, their limit
cases, and one smoke run each through run / sweep, network mode and stale lossy links."""

from __future__ import annotations

from typing import Any

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import TINY_RUN, VARIED_RUN

import pfedwn_jax
from pfedwn_jax.algorithms import RoundContext, get_algorithm, make_hparams, neighbor_lists
from pfedwn_jax.data.client_data import ClientData
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.grid import expand, run_config
from pfedwn_jax.models import get_model
from pfedwn_jax.runner.step import RunState, round_step

SHAPE = (3, 3, 1)
CLASSES = 3
COUNTS = [6, 9, 4, 7, 5]
# row i: whom i hears (directed: 2 hears 1, 1 does not hear 2; 4 hears 3 and 0 only)
ADJ = np.array(
    [
        [1, 1, 0, 0, 1],
        [1, 1, 0, 0, 0],
        [0, 1, 1, 1, 0],
        [0, 0, 1, 1, 0],
        [1, 0, 0, 1, 1],
    ],
    bool,
)
GOSSIP = ("dpsgd", "pushsum", "dfedavgm", "choco", "cfa", "dispfl")
RING = ("dpsgd", "pushsum", "dfedavgm")  # training off, their round is x <- W x


class FakeLinks(flax.struct.PyTreeNode):
    """What a round's `ctx.links` tells the algorithms: the listed mask before the draw."""

    listed: Any
    cache: Any = None
    source: Any = None


def make_data(counts, seed=0) -> ClientData:
    rng = np.random.default_rng(seed)
    n, m = len(counts), max(counts)
    x = rng.integers(0, 256, size=(n, m, *SHAPE), dtype=np.uint8)
    y = rng.integers(0, CLASSES, size=(n, m)).astype(np.int32)
    mask = np.arange(m)[None, :] < np.asarray(counts)[:, None]
    x = np.where(mask[:, :, None, None, None], x, 0).astype(np.uint8)
    return ClientData(
        jnp.asarray(x), jnp.asarray(np.where(mask, y, 0)), jnp.asarray(mask), jnp.asarray(counts)
    )


def make_ctx(
    adjacency=ADJ, counts=COUNTS, *, lr=0.3, epochs=2, optimizer=None, leaves=False
) -> RoundContext:
    """The context; `leaves`: SGD from the `lr` leaf (as the runner builds it) instead of an
    `optimizer` object."""
    s = len(counts)
    nbr, mask = neighbor_lists(np.asarray(adjacency, bool))
    if optimizer is None and not leaves:
        optimizer = optax.sgd(lr)
    return RoundContext(
        model=get_model("logreg", CLASSES, SHAPE),
        optimizer=optimizer,
        lr=jnp.float32(lr),
        train=make_data(counts),
        data_client=jnp.arange(s, dtype=jnp.int32),
        neighbors=jnp.asarray(nbr),
        neighbor_mask=jnp.asarray(mask),
        is_target=jnp.ones(s, bool),
        num_samples=jnp.asarray(counts, jnp.float32),
        batch_size=max(counts),  # one full batch per epoch: SGD is plain GD
        local_epochs=epochs,
    )


def lossy(ctx: RoundContext, seed: int = 0, p: float = 0.5) -> RoundContext:
    """The context of a round where each listed link delivered with probability `p`."""
    rng = np.random.default_rng(seed)
    got = np.asarray(ctx.neighbor_mask) & (rng.random(ctx.neighbor_mask.shape) < p)
    got[:, 0] = True
    return ctx.replace(neighbor_mask=jnp.asarray(got), links=FakeLinks(ctx.neighbor_mask))


def rounds(name, ctx, n, hp=None, seed=0, state=None, ctxs=None):
    """`n` jitted rounds of `name` (round r with `ctxs[r]` if given); (state, eval params)."""
    alg = get_algorithm(name)
    hp = make_hparams(alg, hp)
    step = jax.jit(lambda st, key, c: alg.round(st, key, c, hp)[0])
    state = alg.init(jax.random.PRNGKey(seed), ctx, hp) if state is None else state
    for r in range(n):
        state = step(state, jax.random.PRNGKey(100 + r), ctx if ctxs is None else ctxs[r])
    return state, alg.eval_params(state, ctx, hp)


# ----------------------------------------------------------------------- plain references
def node_data(ctx, i):
    c = int(ctx.train.count[i])
    return ctx.train.x[i, :c], ctx.train.y[i, :c]


def ce(model, w, x, y):
    logp = jax.nn.log_softmax(model.apply(w, x))
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def gd(ctx, w, i, steps, lr, momentum=0.0):
    """`steps` full-batch (heavy-ball) gradient steps of node i from `w`, a plain loop."""
    x, y = node_data(ctx, i)
    prev = w
    for _ in range(steps):
        g = jax.grad(lambda p: ce(ctx.model, p, x, y))(w)
        new = jax.tree.map(lambda a, d, b: a - lr * d + momentum * (a - b), w, g, prev)
        prev, w = w, new
    return w


def mh_matrix(listed: np.ndarray, delivered: np.ndarray) -> np.ndarray:
    """Metropolis-Hastings weights of the symmetrized listed graph, each row restricted to
    the delivered links and renormalised (dense, as written in Xiao and Boyd 2004)."""
    n = len(listed)
    sym = (listed | listed.T) & ~np.eye(n, dtype=bool)
    deg = sym.sum(1)
    w = np.where(sym, 1.0 / (1 + np.maximum(deg[:, None], deg[None, :])), 0.0)
    w[np.arange(n), np.arange(n)] = 1 - w.sum(1)
    w = np.where(delivered | np.eye(n, dtype=bool), w, 0.0)
    return w / w.sum(1, keepdims=True)


def dense(ctx, mask=None) -> np.ndarray:
    nbr = np.asarray(ctx.neighbors)
    mask = np.asarray(ctx.neighbor_mask if mask is None else mask)
    out = np.zeros((len(nbr), len(nbr)), bool)
    rows = np.repeat(np.arange(len(nbr))[:, None], nbr.shape[1], 1)
    out[rows[mask], nbr[mask]] = True
    return out


def stack(ws):
    return jax.tree.map(lambda *a: jnp.stack(a), *ws)


def node(params, i):
    return jax.tree.map(lambda a: a[i], params)


def mixed(w: np.ndarray, models: list) -> list:
    return [
        jax.tree.map(lambda *a: sum(w[i, j] * a[j] for j in range(len(a))), *models)
        for i in range(len(models))
    ]


def assert_close(a, b, tol=2e-5):
    chex.assert_trees_all_close(a, b, rtol=tol, atol=tol)


# ----------------------------------------------------------------------- D-PSGD
@pytest.mark.parametrize("lost", [False, True])
def test_dpsgd_two_rounds_match_a_per_node_loop(lost):
    ctx = make_ctx()
    ctxs = [lossy(ctx, seed=r) if lost else ctx for r in range(2)]
    _, got = rounds("dpsgd", ctx, 2, ctxs=ctxs)
    alg = get_algorithm("dpsgd")
    w = [node(alg.init(jax.random.PRNGKey(0), ctx, None).clients.params, i) for i in range(5)]
    for c in ctxs:
        trained = [gd(ctx, w[i], i, 2, 0.3) for i in range(5)]
        w = mixed(mh_matrix(ADJ, dense(ctx, c.neighbor_mask)), trained)
    assert_close(got, stack(w))


def test_dpsgd_limits_complete_graph_is_fedavg_and_no_link_is_local():
    full = make_ctx(np.ones((5, 5), bool), [6] * 5)  # MH on a complete graph: uniform 1/5
    assert_close(rounds("dpsgd", full, 2)[1], rounds("fedavg", full, 2)[1], 1e-6)
    ctx = make_ctx()
    alone = ctx.replace(
        neighbor_mask=ctx.neighbor_mask.at[:, 1:].set(False), links=FakeLinks(ctx.neighbor_mask)
    )
    local = rounds("local", ctx, 2)[1]
    chex.assert_trees_all_equal(rounds("dpsgd", ctx, 2, ctxs=[alone] * 2)[1], local)


# ----------------------------------------------------------------------- push-sum
@pytest.mark.parametrize("lost", [False, True])
def test_pushsum_two_rounds_match_a_per_node_loop(lost):
    ctx = make_ctx()
    ctxs = [lossy(ctx, seed=r) if lost else ctx for r in range(2)]
    state, got = rounds("pushsum", ctx, 2, ctxs=ctxs)
    alg = get_algorithm("pushsum")
    z = [node(alg.init(jax.random.PRNGKey(0), ctx, None).clients.params, i) for i in range(5)]
    w = np.ones(5)
    listeners = (ADJ & ~np.eye(5, dtype=bool)).sum(0)  # j is heard by listeners[j] nodes
    for c in ctxs:
        got_link = dense(ctx, c.neighbor_mask)  # got_link[i, j]: j's packet reached i
        x = [jax.tree.map(lambda a, wj=w[j]: wj * a, gd(ctx, z[j], j, 2, 0.3)) for j in range(5)]
        new_x, new_w = [], np.zeros(5)
        for i in range(5):
            senders = [j for j in range(5) if i == j or got_link[i, j]]
            share = {j: 1.0 / (1 + listeners[j]) for j in senders}
            new_x.append(jax.tree.map(lambda *a: sum(share[j] * a[j] for j in senders), *x))
            new_w[i] = sum(share[j] * w[j] for j in senders)
        z = [jax.tree.map(lambda a, wi=new_w[i]: a / wi, new_x[i]) for i in range(5)]
        w = new_w
    assert_close(got, stack(z))
    np.testing.assert_allclose(state.weight, w / w.mean(), rtol=1e-5)
    if lost:
        assert w.sum() < 5 - 1e-3  # mass was lost with the packets
    else:
        np.testing.assert_allclose(w.sum(), 5, rtol=1e-6)  # column-stochastic: kept


@pytest.mark.parametrize("adj", [np.ones((5, 5), bool), "ring"])
def test_pushsum_on_a_regular_symmetric_graph_matches_dpsgd(adj):
    adj = ring(5) if isinstance(adj, str) else adj
    ctx = make_ctx(adj)
    assert_close(rounds("pushsum", ctx, 2)[1], rounds("dpsgd", ctx, 2)[1], 1e-6)


def test_pushsum_node_without_links_keeps_its_model():
    ctx = make_ctx()
    alone = ctx.replace(
        neighbor_mask=ctx.neighbor_mask.at[:, 1:].set(False), links=FakeLinks(ctx.neighbor_mask)
    )
    got = rounds("pushsum", ctx, 2, ctxs=[alone] * 2)[1]
    chex.assert_trees_all_close(got, rounds("local", ctx, 2)[1], rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------- DFedAvgM
@pytest.mark.parametrize(("lost", "chunk"), [(False, None), (True, None), (True, 1), (True, 2)])
def test_dfedavgm_two_rounds_match_a_heavy_ball_loop(lost, chunk, monkeypatch):
    """Also with the nodes trained in chunks of `chunk` nodes (the last one padded), each
    chunk from its own fresh momentum."""
    import pfedwn_jax.algorithms.dfedavgm as module

    ctx = make_ctx(leaves=True, epochs=3)
    alg = get_algorithm("dfedavgm")
    w = [node(alg.init(jax.random.PRNGKey(0), ctx, None).clients.params, i) for i in range(5)]
    if chunk is not None:
        one = sum(np.asarray(a).nbytes for a in jax.tree.leaves(w[0]))
        monkeypatch.setattr(module, "MOMENTUM_BYTES", chunk * one)
        assert module.momentum_chunk(one, 5) == chunk
    ctxs = [lossy(ctx, seed=r) if lost else ctx for r in range(2)]
    _, got = rounds("dfedavgm", ctx, 2, {"momentum": 0.8}, ctxs=ctxs)
    for c in ctxs:  # the momentum restarts each round
        trained = [gd(ctx, w[i], i, 3, 0.3, momentum=0.8) for i in range(5)]
        w = mixed(mh_matrix(ADJ, dense(ctx, c.neighbor_mask)), trained)
    assert_close(got, stack(w), 5e-5)


def test_dfedavgm_without_momentum_is_dpsgd():
    ctx = make_ctx(leaves=True)
    want = rounds("dpsgd", ctx, 2)[1]
    assert_close(rounds("dfedavgm", ctx, 2, {"momentum": 0.0})[1], want, 1e-6)
    with pytest.raises(ValueError, match=r"hparams\.dfedavgm\.momentum"):
        make_hparams(get_algorithm("dfedavgm"), {"momentum": 1.0})


# ----------------------------------------------------------------------- CHOCO-SGD
def topk_rows(d: np.ndarray, k: int) -> np.ndarray:
    out = np.zeros_like(d)
    for i, row in enumerate(d):
        top = np.argsort(-np.abs(row), kind="stable")[:k]
        out[i, top] = row[top]
    return out


def flat(params) -> np.ndarray:
    return np.concatenate([np.asarray(a).reshape(len(a), -1) for a in jax.tree.leaves(params)], 1)


@pytest.mark.parametrize("lost", [False, True])
def test_choco_topk_two_rounds_match_a_per_node_loop(lost):
    ctx = make_ctx()
    ctxs = [lossy(ctx, seed=r) if lost else ctx for r in range(2)]
    hp = {"compression": "topk", "fraction": 0.2, "gamma": 0.5}
    state, got = rounds("choco", ctx, 2, hp, ctxs=ctxs)
    alg = get_algorithm("choco")
    init = alg.init(jax.random.PRNGKey(0), ctx, make_hparams(alg, hp)).clients.params
    like, size = init, flat(init).shape[1]
    x = flat(init).astype(np.float64)
    hat = np.zeros_like(x)
    for c in ctxs:
        trained = [gd(ctx, node(unflat(x, like), i), i, 2, 0.3) for i in range(5)]
        half = flat(stack(trained)).astype(np.float64)
        hat = hat + topk_rows(half - hat, round(0.2 * size))
        w = mh_matrix(ADJ, dense(ctx, c.neighbor_mask))
        x = half + 0.5 * (w @ hat - hat)
    np.testing.assert_allclose(flat(got), x, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.bits, round(0.2 * size) * (32 + np.ceil(np.log2(size))))


def unflat(x: np.ndarray, like):
    leaves, treedef = jax.tree.flatten(like)
    out, at = [], 0
    for a in leaves:
        n = int(np.prod(a.shape[1:]))
        out.append(jnp.asarray(x[:, at : at + n].reshape(a.shape), a.dtype))
        at += n
    return jax.tree.unflatten(treedef, out)


def test_choco_with_the_identity_and_gamma_1_is_dpsgd():
    ctx = lossy(make_ctx(), seed=4)
    want = rounds("dpsgd", ctx, 2)[1]
    got = rounds("choco", ctx, 2, {"compression": "none", "gamma": 1.0})[1]
    assert_close(got, want, 1e-5)
    qsgd = rounds("choco", ctx, 2)[1]  # the default, 8-bit QSGD: close to it, not equal
    gap = np.abs(flat(qsgd) - flat(want)).max()
    assert 0 < gap < 0.05


# ----------------------------------------------------------------------- CFA
@pytest.mark.parametrize("lost", [False, True])
def test_cfa_two_rounds_match_a_per_device_loop(lost):
    ctx = make_ctx()
    ctxs = [lossy(ctx, seed=r) if lost else ctx for r in range(2)]
    _, got = rounds("cfa", ctx, 2, {"eps": 0.7}, ctxs=ctxs)
    alg = get_algorithm("cfa")
    w = [node(alg.init(jax.random.PRNGKey(0), ctx, None).clients.params, i) for i in range(5)]
    n = np.asarray(COUNTS, np.float64)
    for c in ctxs:
        heard = dense(ctx, c.neighbor_mask) & ~np.eye(5, dtype=bool)
        psi = []
        for k in range(5):
            nk = np.nonzero(heard[k])[0]
            alpha = {i: n[i] / n[nk].sum() for i in nk}
            psi.append(
                jax.tree.map(
                    lambda *a, k=k, nk=nk, alpha=alpha: (
                        a[k] + 0.7 * sum(alpha[i] * (a[i] - a[k]) for i in nk)
                    ),
                    *w,
                )
            )
        w = [gd(ctx, psi[k], k, 2, 0.3) for k in range(5)]
    assert_close(got, stack(w))


def test_cfa_with_eps_0_is_local():
    ctx = make_ctx()
    chex.assert_trees_all_close(
        rounds("cfa", ctx, 2, {"eps": 0.0})[1], rounds("local", ctx, 2)[1], rtol=1e-6, atol=1e-7
    )


# ----------------------------------------------------------------------- DisPFL
def masked_gd(ctx, w, mask, i, steps, lr):
    """Full-batch GD of node i on its masked model, the gradient masked (a plain loop)."""
    x, y = node_data(ctx, i)
    for _ in range(steps):
        g = jax.grad(lambda p: ce(ctx.model, jax.tree.map(jnp.multiply, p, mask), x, y))(w)
        w = jax.tree.map(lambda a, d, m: a - lr * d * m, w, g, mask)
    return w


@pytest.mark.parametrize("lost", [False, True])
def test_dispfl_two_rounds_match_a_per_node_loop(lost):
    ctx = make_ctx()
    ctxs = [lossy(ctx, seed=r) if lost else ctx for r in range(2)]
    _, got = rounds("dispfl", ctx, 2, ctxs=ctxs)
    alg = get_algorithm("dispfl")
    state0 = alg.init(jax.random.PRNGKey(0), ctx, make_hparams(alg))
    masks = [node(state0.masks, i) for i in range(5)]
    w = [node(state0.clients.params, i) for i in range(5)]
    kept = np.mean([np.asarray(a).mean() for a in jax.tree.leaves(state0.masks) if a.ndim >= 3])
    assert 0.3 < kept < 0.7  # about half of each weight matrix
    for c in ctxs:
        heard = dense(ctx, c.neighbor_mask) | np.eye(5, dtype=bool)
        avg = []
        for k in range(5):
            nk = np.nonzero(heard[k])[0]
            total = jax.tree.map(lambda *a: sum(a), *[w[j] for j in nk])  # masked already
            count = jax.tree.map(lambda *a: sum(a), *[masks[j] for j in nk])
            avg.append(
                jax.tree.map(
                    lambda t, n, own, m: jnp.where(n > 0, t / jnp.maximum(n, 1), own) * m,
                    total,
                    count,
                    w[k],
                    masks[k],
                )
            )
        w = [masked_gd(ctx, avg[k], masks[k], k, 2, 0.3) for k in range(5)]
    assert_close(got, stack(w))


def test_dispfl_masks_are_bool_per_slot_and_drawn_in_chunks_alike(monkeypatch):
    """A slot's mask depends on its index only (not on how many slots, nor on the chunk of
    slots drawn at once); bool, a quarter of a float32 copy."""
    import pfedwn_jax.algorithms.dispfl as module

    key = jax.random.PRNGKey(4)
    params = {"w": jnp.zeros((7, 6, 5)), "b": jnp.zeros((7, 5))}
    whole = module.draw_masks(key, params, 0.5)
    assert whole["w"].dtype == jnp.bool_ and bool(whole["b"].all())
    monkeypatch.setattr(module, "DRAW_CHUNK", 3)
    chunked = module.draw_masks(key, params, 0.5)
    fewer = module.draw_masks(key, {"w": params["w"][:4], "b": params["b"][:4]}, 0.5)
    np.testing.assert_array_equal(chunked["w"], whole["w"])
    np.testing.assert_array_equal(fewer["w"], whole["w"][:4])
    assert not np.array_equal(whole["w"][0], whole["w"][1])


def test_dispfl_dense_is_unweighted_cfa_on_a_complete_graph():
    ctx = make_ctx(np.ones((5, 5), bool), [6] * 5)
    want = rounds("cfa", ctx, 2, {"eps": 0.8})[1]  # (1 - eps) own + eps mean of the 4 others
    assert_close(rounds("dispfl", ctx, 2, {"density": 1.0})[1], want, 1e-6)


def ring(n):
    adj = np.eye(n, dtype=bool)
    for i in range(n):
        adj[i, (i + 1) % n] = adj[i, (i - 1) % n] = True
    return adj


@pytest.mark.parametrize("name", RING)
def test_without_training_consensus_distance_on_a_ring_falls_by_lambda_2_squared(name):
    n = 6
    ctx = make_ctx(ring(n), [6] * n, optimizer=optax.sgd(0.0))  # training changes nothing
    w = mh_matrix(ring(n), ring(n))
    vals, vecs = np.linalg.eigh(w)
    order = np.argsort(-np.abs(vals))
    lam2, v2 = vals[order[1]], vecs[:, order[1]]
    alg = get_algorithm(name)
    hp = make_hparams(alg)
    state = alg.init(jax.random.PRNGKey(0), ctx, hp)
    base = node(alg.eval_params(state, ctx, hp), 0)
    start = jax.tree.map(lambda a: jnp.asarray(np.multiply.outer(v2, np.asarray(a))), base)
    state = set_models(name, state, start)
    step = jax.jit(lambda st, key: round_step(alg, hp, st, key, ctx, (ctx.train, None)))
    run, dist, gap = RunState(state), [], []
    for r in range(4):  # the engine's round: its consensus and spectral-gap metrics
        run, out = step(run, jax.random.PRNGKey(r))
        dist.append(float(out.metrics["consensus_deviation"].mean()))
        gap.append(float(out.metrics["mixing_gap"][0]))
    np.testing.assert_allclose(np.array(dist[1:]) / dist[:-1], lam2**2, rtol=1e-4)
    np.testing.assert_allclose(gap, 1 - abs(lam2), rtol=1e-5)


def set_models(name, state, params):
    """The state of `name` with every slot's model replaced (its own layout)."""
    return state._replace(clients=state.clients._replace(params=params))


# ----------------------------------------------------------------------- smoke
@pytest.mark.parametrize(
    "names",
    [("pushsum", "choco"), pytest.param(GOSSIP, marks=pytest.mark.slow, id="all")],
    ids=["pushsum-choco", "all"],
)
def test_decentralized_methods_run_networked_with_lossy_stale_links(names):
    config = ExperimentConfig(
        **{**TINY_RUN, "rounds": 2},
        algorithms=names,
        mode="network",
        link_model="bernoulli",
        link_failure=0.3,
        stale=True,
    )
    res = pfedwn_jax.run(config, progress=False)
    for name in names:
        out = res.methods[name]
        assert np.isfinite(out["target_accuracy"]).all()
        assert len(out["consensus_distance"]) == 2 and np.isfinite(out["consensus_distance"]).all()
        if name != "dispfl":  # coordinate-wise averaging: no one mixing matrix
            assert np.all(np.asarray(out["spectral_gap"]) <= 1 + 1e-6)
        else:
            assert "spectral_gap" not in out


def test_a_sweep_of_gossip_methods_with_padded_slots_equals_its_runs():
    """Topology seeds 0 and 3 select 2 and 3 neighbors: one program, slots padded (every
    method in tests/test_sweep.py's slow registry-wide check)."""
    config = ExperimentConfig(**VARIED_RUN, algorithms=("pushsum",))
    grid = {"topology_seed": [0, 3]}
    swept = pfedwn_jax.sweep(config, seeds=[1], grid=grid, block=2, progress=False)
    for spec in expand(config, [1], grid):
        own = pfedwn_jax.run(run_config(config, spec), progress=False)
        for name in config.method_names:
            rows = (swept.rows["run"] == spec.index) & (swept.rows["method"] == name)
            want = own.methods[name]["target_accuracy"]
            np.testing.assert_allclose(swept.rows["target_accuracy"][rows], want, atol=1e-6)
