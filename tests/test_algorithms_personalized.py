"""pFedWN, Per-FedAvg and FedAMP: exact expectations from the issue and independent references."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_groups import CLASSES, GROUP, SHAPE, compiled_round, leaves, make_ctx, make_data, run

from pfedwn_jax.algorithms import (
    dense_adjacency,
    get_algorithm,
    make_hparams,
    neighbor_lists,
)
from pfedwn_jax.algorithms.common import proximal_loss
from pfedwn_jax.algorithms.fedamp import attention_matrix, attention_weights
from pfedwn_jax.algorithms.perfedavg import full_batch_grad, meta_grad_fn
from pfedwn_jax.algorithms.pfedwn import aggregation_matrix, aggregation_weights, em_pairs
from pfedwn_jax.engine import ClientState, default_loss, local_train, per_sample_ce
from pfedwn_jax.models import get_model

# --- pFedWN ------------------------------------------------------------------------------


def test_pfedwn_with_a_1_equals_local():
    ctx = make_ctx(GROUP)
    overrides = {"a": 1.0, "warmup_rounds": 1, "em_steps": 2}  # full EM runs in round 2
    state, pf = run("pfedwn", ctx, 3, overrides)
    _, local = run("local", ctx, 3)
    chex.assert_trees_all_equal(pf, local)
    pi = np.asarray(state.pi)
    assert pi[0].sum() == pytest.approx(1.0, abs=1e-5) and pi[0, 0] == 0
    assert np.all(pi[1:] == 0)  # only the target row aggregates
    assert state.pi_trace.shape == (4, 3, 3)  # prior, 2 EM steps, final
    np.testing.assert_array_equal(state.pi_trace[-1], state.pi)
    np.testing.assert_allclose(state.pi_trace[0, 0], [0, 0.5, 0.5])  # uniform prior


def test_pfedwn_with_a_0_one_neighbor_and_pi_1_takes_the_neighbors_model():
    ctx = make_ctx([[0, 1], [2, 3]], lr=0.0)  # lr 0: training leaves models unchanged
    alg = get_algorithm("pfedwn")
    hp = make_hparams(alg, {"a": 0.0, "warmup_rounds": 0, "component_updates": False})
    state = alg.init(jax.random.PRNGKey(0), ctx, hp)
    params = jax.vmap(ctx.model.init)(jax.random.split(jax.random.PRNGKey(1), 2))
    state = state._replace(clients=ClientState(params, state.clients.opt_state))
    params = jax.tree.map(jnp.array, params)  # keep a copy: the round may donate its input
    state = compiled_round("pfedwn", hp)(state, jax.random.PRNGKey(2), ctx)
    np.testing.assert_allclose(state.pi, [[0.0, 1.0], [0.0, 0.0]])
    after = alg.eval_params(state, ctx, hp)
    for got, before in zip(leaves(after), leaves(params), strict=True):
        np.testing.assert_array_equal(got[0], before[1])  # the target took the neighbor's
        np.testing.assert_array_equal(got[1], before[1])  # the neighbor kept its own
    assert max(np.abs(b[0] - b[1]).max() for b in leaves(params)) > 1e-3  # they differed


def test_aggregation_matrix_is_eq5():
    rng = np.random.default_rng(0)
    pi = rng.uniform(size=(4, 4)) * (1 - np.eye(4))
    pi[2] = 0.0  # a target without neighbors
    pi /= np.maximum(pi.sum(1, keepdims=True), 1e-30)
    apply = np.array([True, False, True, True])
    got = np.asarray(aggregation_matrix(jnp.asarray(pi), 0.3, jnp.asarray(apply)))
    for i in range(4):
        ref = np.eye(4)[i] if (not apply[i] or i == 2) else 0.3 * np.eye(4)[i] + 0.7 * pi[i]
        np.testing.assert_allclose(got[i], ref, atol=1e-6)
    # the [S, K] weights of the lists are the dense matrix's entries at the listed columns
    adj = np.array([[1, 1, 0, 1], [1, 1, 1, 1], [0, 0, 1, 0], [0, 1, 0, 1]], bool)
    nbr, mask = neighbor_lists(adj)
    rows = np.arange(4)[:, None]
    pi_sparse = np.where(mask, (pi * adj)[rows, nbr], 0.0)
    pi_sparse /= np.maximum(pi_sparse.sum(1, keepdims=True), 1e-30)
    dense = np.zeros((4, 4))
    dense[rows, nbr] = pi_sparse
    got = np.asarray(aggregation_weights(jnp.asarray(pi_sparse), 0.3, jnp.asarray(apply)))
    want = np.asarray(aggregation_matrix(jnp.asarray(dense), 0.3, jnp.asarray(apply)))
    np.testing.assert_allclose(np.where(mask, got, 0), want[rows, nbr] * mask, atol=1e-7)
    np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-6)


def test_pfedwn_em_weights_the_similar_neighbor_in_network_mode():
    """Network mode: every slot a target; slot 2 does not hear slot 0 (adjacency row)."""
    adjacency = [[1, 1, 1], [1, 1, 0], [0, 1, 1]]
    ctx = make_ctx(GROUP, adjacency, is_target=[True, True, True])
    overrides = {"warmup_rounds": 2, "component_updates": False, "floor": 1e-4}
    state, _ = run("pfedwn", ctx, 3, overrides)
    sparse = np.asarray(state.pi)  # [S, K]: columns as in ctx.neighbors
    assert sparse.shape == (3, 3) and np.all(sparse[:, 0] == 0)
    np.testing.assert_array_equal(ctx.neighbors, [[0, 1, 2], [1, 0, 1], [2, 1, 2]])
    pi = np.zeros((3, 3))  # the dense view [S, S]
    pi[np.arange(3)[:, None], np.asarray(ctx.neighbors)] += sparse
    # target 0 (classes 0, 1): its similar neighbor 1 dominates, unrelated neighbor 2 ~ 0
    assert pi[0, 1] > 0.95 and pi[0, 2] < 0.05
    np.testing.assert_allclose(pi[1], [1, 0, 0], atol=1e-6)  # only neighbor on its row
    np.testing.assert_allclose(pi[2], [0, 1, 0], atol=1e-6)
    assert np.all(pi[~np.asarray(adjacency, bool)] == 0) and np.all(np.diag(pi) == 0)
    pairs = em_pairs(ctx)  # S (K - 1) = 6 pairs, the 4 real ones first in row-major order
    assert pairs.valid.tolist() == [True] * 4 + [False] * 2
    got = list(zip(pairs.slot.tolist(), pairs.neighbor.tolist(), strict=True))[:4]
    assert got == [(0, 1), (0, 2), (1, 0), (2, 1)]


# --- FedAMP ------------------------------------------------------------------------------


def test_fedamp_attention_matrix_matches_numpy_loop():
    rng = np.random.default_rng(1)
    d = rng.uniform(0, 3, size=(4, 4))
    d = (d + d.T) * (1 - np.eye(4))
    adj = np.array([[1, 1, 1, 1], [1, 1, 0, 1], [0, 0, 1, 0], [1, 1, 1, 1]], bool)
    for alpha_k, sigma in [(0.2, 1.0), (5.0, 0.5)]:  # the second overshoots: rows rescaled
        got = np.asarray(attention_matrix(jnp.asarray(d), jnp.asarray(adj), alpha_k, sigma))
        nbr, mask = neighbor_lists(adj)  # the sparse weights are the same numbers
        rows = np.arange(4)[:, None]
        xi = np.asarray(attention_weights(jnp.asarray(d[rows, nbr]), mask, alpha_k, sigma))
        np.testing.assert_allclose(np.where(mask, xi, 0), np.where(mask, got[rows, nbr], 0))
        np.testing.assert_array_equal(dense_adjacency(nbr, mask, 4), adj | np.eye(4, dtype=bool))
        ref = np.zeros((4, 4))
        for i in range(4):
            for j in range(4):
                if j != i and adj[i, j]:
                    ref[i, j] = alpha_k * np.exp(-d[i, j] / sigma) / sigma
            if ref[i].sum() > 1:
                ref[i] /= ref[i].sum()
            ref[i, i] = 1 - ref[i].sum()
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
    # sigma tiny: exactly the identity for distinct models (no overflow, no NaN)
    eye = np.asarray(attention_matrix(jnp.asarray(d + 0.1), jnp.asarray(adj), 1.0, 1e-30))
    np.testing.assert_array_equal(eye, np.eye(4))


def test_fedamp_tiny_sigma_behaves_like_local():
    """sigma -> 0: u_i = w_i, so a FedAMP round is Local training plus a proximal pull to the
    slot's own round-start model, built here directly from the engine and FedProx's loss."""
    ctx = make_ctx(GROUP)
    local_state, _ = run("local", ctx, 1)  # distinct models (at round 1 all are equal)
    start = jax.tree.map(jnp.array, local_state.clients)
    _, amp = run("fedamp", ctx, 1, {"sigma": 1e-30, "lam": 0.5}, state=local_state)
    prox = proximal_loss(default_loss(ctx.model), 0.5 / 1.0)
    ref, _ = local_train(
        ctx.model,
        ctx.optimizer,
        start,
        ctx.train,
        ctx.data_client,
        jax.random.PRNGKey(100),
        batch_size=8,
        loss_fn=prox,
        aux=start.params,
    )
    chex.assert_trees_all_close(amp, ref.params, rtol=0, atol=1e-6)
    # the proximal gradient is really there: the models moved less than plain Local's
    _, local = run("local", ctx, 1, state=local_state)
    moved = lambda p: sum(np.abs(a - b).sum() for a, b in zip(leaves(p), leaves(start.params)))
    assert moved(amp) < moved(local)


def test_fedamp_proximal_gradient_is_lam_over_alpha_k_times_w_minus_u():
    model = get_model("logreg", CLASSES, SHAPE)
    data = make_data([[0, 1]])
    w = model.init(jax.random.PRNGKey(0))
    u = model.init(jax.random.PRNGKey(1))
    x, y, wt = data.x[0, :8], data.y[0, :8], jnp.ones(8)
    lam, alpha_k = 0.7, 0.2
    loss = proximal_loss(default_loss(model), lam / alpha_k)
    got = jax.grad(loss)(w, x, y, wt, u)
    ce_grad = jax.grad(lambda p: per_sample_ce(model.apply(p, x), y).mean())(w)
    ref = jax.tree.map(lambda g, a, b: g + lam / alpha_k * (a - b), ce_grad, w, u)
    chex.assert_trees_all_close(got, ref, rtol=0, atol=1e-5)


# --- Per-FedAvg --------------------------------------------------------------------------


def test_perfedavg_alpha_0_equals_fedavg():
    ctx = make_ctx(GROUP)
    _, fedavg = run("fedavg", ctx, 2)
    # (HF adds alpha * H g, also 0 at alpha = 0; its formula is checked below)
    _, per = run("perfedavg", ctx, 2, {"alpha": 0.0, "split_batch": False})
    chex.assert_trees_all_close(per, fedavg, rtol=0, atol=1e-6)


def _batch():
    model = get_model("logreg", CLASSES, SHAPE)
    data = make_data([[0, 1, 2]])
    w = model.init(jax.random.PRNGKey(3))
    wt = jnp.asarray(np.r_[np.ones(10), np.zeros(2)], jnp.float32)  # two padded samples
    return model, w, data.x[0, :12], data.y[0, :12], wt


@pytest.mark.parametrize("split", [False, True])
def test_perfedavg_meta_gradients_match_autodiff_through_the_inner_step(split):
    model, w, x, y, wt = _batch()
    base = default_loss(model)
    alpha = 0.3
    hp_fo = make_hparams(get_algorithm("perfedavg"), {"alpha": alpha, "split_batch": split})
    hp_hf = make_hparams(
        get_algorithm("perfedavg"), {"alpha": alpha, "variant": "hf", "split_batch": split}
    )
    pos = np.arange(12)
    part = lambda k, r: wt * jnp.asarray(pos % k == r) if split else wt
    step = lambda a, g: a - alpha * g
    inner = lambda p, d: jax.tree.map(step, p, jax.grad(base)(p, x, y, d, None))
    # FO: gradient of the outer loss at the adapted point
    _, g_fo = meta_grad_fn(base, hp_fo)(w, x, y, wt, None, None)
    adapted = inner(w, part(2, 0))
    chex.assert_trees_all_close(
        g_fo, jax.grad(base)(adapted, x, y, part(2, 1), None), rtol=0, atol=1e-6
    )
    # HF: (I - alpha H) grad; when the Hessian batch is the inner batch it is the exact MAML
    # gradient, i.e. autodiff through the inner step
    _, g_hf = meta_grad_fn(base, hp_hf)(w, x, y, wt, None, None)
    if not split:
        maml = jax.grad(lambda p: base(inner(p, wt), x, y, wt, None))(w)
    else:  # inner D = parts 0, outer D' = 1, Hessian D'' = 2: (I - a H(D'')) grad f(w'; D')
        g_out = jax.grad(base)(inner(w, part(3, 0)), x, y, part(3, 1), None)
        hvp = jax.jvp(lambda p: jax.grad(base)(p, x, y, part(3, 2), None), (w,), (g_out,))[1]
        maml = jax.tree.map(lambda g, h: g - alpha * h, g_out, hvp)
    chex.assert_trees_all_close(g_hf, maml, rtol=0, atol=1e-5)


@pytest.mark.parametrize("real", [19, 9, 0])  # the last chunk partial; padded chunks; none
def test_perfedavg_full_batch_grad_matches_direct_gradient(real):
    model, w, _, _, _ = _batch()
    data = make_data([[0, 1, 2]], n=23)
    x, y = data.x[0], data.y[0]
    mask = jnp.arange(23) < real
    got = full_batch_grad(model, w, x, y, mask, chunk=5)
    loss = lambda p: (per_sample_ce(model.apply(p, x), y) * mask).sum() / max(real, 1)
    ref = jax.grad(loss)(w)
    chex.assert_trees_all_close(got, ref, rtol=0, atol=1e-6)


# --- hyperparameters ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "overrides", "match"),
    [
        ("pfedwn", {"a": 1.5}, r"pfedwn\.a"),
        ("pfedwn", {"floor": 1.5}, r"pfedwn\.floor"),
        ("pfedwn", {"em_every": -1}, r"pfedwn\.em_every"),
        ("pfedwn", {"component_updates": "yes"}, r"pfedwn\.component_updates"),
        ("perfedavg", {"variant": "so"}, r"perfedavg\.variant"),
        ("perfedavg", {"alpha": -1.0}, r"perfedavg\.alpha"),
        ("fedamp", {"sigma": 0.0}, r"fedamp\.sigma"),
        ("fedamp", {"alpha_k": -1.0}, r"fedamp\.alpha_k"),
    ],
)
def test_bad_hparams_are_value_errors(name, overrides, match):
    with pytest.raises(ValueError, match=match):
        make_hparams(get_algorithm(name), overrides)


def test_pfedwn_full_em_is_e_step_m_step_then_weighted_training():
    """One outer EM step of `estimate_pi`, recomposed by hand from the public pieces: with
    `pi_from="components"` (App. B literally) the refinement evaluates the components after
    M-step 2; by default it evaluates the received models."""
    from pfedwn_jax.algorithms.pfedwn import estimate_pi
    from pfedwn_jax.em import estimate_weights, m_step, responsibilities
    from pfedwn_jax.engine import cross_evaluate, take_slots

    ctx = make_ctx([[0, 1, 2, 3], [0, 1], [2, 3]])  # the target mixes both neighbors
    local_state, _ = run("local", ctx, 1)  # trained, distinct neighbor models
    params = local_state.clients.params
    hp = make_hparams(get_algorithm("pfedwn"), {"em_steps": 1, "pi_from": "components"})
    pt, pn = np.array([0, 0]), np.array([1, 2])  # the target's two (target, neighbor) pairs
    key = jax.random.PRNGKey(5)
    pi, trace = jax.jit(lambda p: estimate_pi(p, key, ctx, hp))(params)
    # the target's list is [0, 1, 2], so its [S, K] columns are the slots (dense reference)
    np.testing.assert_array_equal(ctx.neighbors[0], [0, 1, 2])

    nmask = np.zeros((3, 3), bool)
    nmask[pt, pn] = True
    nmask = jnp.asarray(nmask)
    smask = ctx.train.mask[ctx.data_client]
    dc = ctx.data_client[pt]

    def dense(comp):
        per = cross_evaluate(ctx.model, comp, ctx.train, np.arange(len(pt)), dc)["loss"]
        return jnp.zeros((3, 3, per.shape[1])).at[pt, pn].set(per)

    comp = take_slots(params, pn)
    lam = responsibilities(dense(comp), nmask / nmask.sum(1, keepdims=True), smask, nmask)
    pi1 = m_step(lam, smask, nmask, hp.floor)
    state = ClientState(comp, jax.vmap(ctx.optimizer.init)(comp))
    state, _ = local_train(
        ctx.model,
        ctx.optimizer,
        state,
        ctx.train,
        dc,
        jax.random.fold_in(key, 0),
        batch_size=8,
        sample_weight=lam[pt, pn],
    )
    ref = estimate_weights(
        dense(state.params),
        smask,
        nmask,
        pi1,
        num_iters=hp.em_iters,
        tol=hp.em_tol,
        floor=hp.floor,
    )
    np.testing.assert_allclose(trace[1], pi1, atol=1e-5)
    np.testing.assert_allclose(pi, ref, atol=1e-4)
    # the component update mattered: without it the refinement ends elsewhere
    fixed = estimate_weights(
        dense(comp), smask, nmask, pi1, num_iters=hp.em_iters, tol=hp.em_tol, floor=hp.floor
    )
    assert np.abs(np.asarray(fixed) - np.asarray(pi)).max() > 1e-3
    # the default: the same E-step and pi update, then the refinement on the received models
    default = make_hparams(get_algorithm("pfedwn"), {"em_steps": 1})
    pi_d, trace_d = jax.jit(lambda p: estimate_pi(p, key, ctx, default))(params)
    np.testing.assert_allclose(trace_d[1], pi1, atol=1e-5)
    np.testing.assert_allclose(pi_d, fixed, atol=1e-4)


@pytest.mark.slow  # the quick tier keeps a cheaper check of the same property
def test_pfedwn_mix_components_mixes_the_fine_tuned_components_when_em_runs():
    """Round 2 (the EM round after one warm-up round): Eq. 5 over M-step 2's components,
    written out per (target, neighbor) pair here, then local training; without M-step 2 the
    components are the received models, so the option changes nothing."""
    from pfedwn_jax.algorithms.common import local_update
    from pfedwn_jax.algorithms.pfedwn import em_components, estimate_pi, weighed

    ctx = make_ctx([[0, 1, 2, 3], [0, 1], [2, 3], [0, 1]])
    on = {"mix_components": True, "em_steps": 1, "a": 0.3}
    warm, _ = run("pfedwn", ctx, 1, on)
    key = jax.random.PRNGKey(100)  # `run`'s key of its first round
    got, _ = run("pfedwn", ctx, 1, on, state=warm)

    hp = make_hparams(get_algorithm("pfedwn"), on)
    params = warm.clients.params
    em_key = jax.random.fold_in(key, 0x5EED)
    pi, _ = jax.jit(lambda p: estimate_pi(p, em_key, ctx, hp))(params)
    comps = jax.jit(lambda p: em_components(p, em_key, ctx, hp))(params)  # [S, K - 1, ...]
    received = jax.tree.map(lambda a: a[np.asarray(ctx.neighbors)[:, 1:]], params)
    assert max(np.abs(a - b).max() for a, b in zip(leaves(comps), leaves(received),
               strict=True)) > 1e-4  # fmt: skip  # M-step 2 moved the components
    real = [(i, k) for i, k in zip(*np.nonzero(np.asarray(weighed(ctx))), strict=True)]

    def eq5(w, c):
        w, c = np.asarray(w, np.float64), np.asarray(c, np.float64)
        out = w.copy()
        for i in {i for i, _ in real}:
            out[i] = 0.3 * w[i]
        for i, k in real:
            out[i] += 0.7 * float(pi[i, k]) * c[i, k - 1]
        return out.astype(np.float32)

    mixed = jax.tree.map(eq5, params, comps)
    want, _ = jax.jit(lambda c: local_update(ctx, c, key))(warm.clients._replace(params=mixed))
    chex.assert_trees_all_close(got.clients.params, want.params, atol=1e-6)

    off = {**on, "component_updates": False}
    same, _ = run("pfedwn", ctx, 1, off, state=warm)
    ref, _ = run("pfedwn", ctx, 1, {**off, "mix_components": False}, state=warm)
    chex.assert_trees_all_equal(same.clients.params, ref.clients.params)


# --- statistical (slow) ------------------------------------------------------------------


@pytest.mark.slow
def test_pfedwn_em_weights_concentrate_on_same_distribution_neighbors_over_seeds():
    """Two neighbors share the target's label distribution, two do not: over 10 data and
    initialisation seeds, EM (with the default component updates) gives the two similar
    neighbors all of the target's weight but the floor every time. How it splits between the
    two similar ones varies (the mixture cannot tell them apart), with no bias to either."""
    classes = [[0, 1], [0, 1], [2, 3], [0, 1], [2, 3]]  # target, similar, other, similar, other
    alg = get_algorithm("pfedwn")
    overrides = {"warmup_rounds": 2}
    hp = make_hparams(alg, overrides)
    similar = []
    for seed in range(10):
        ctx = make_ctx(classes).replace(train=make_data(classes, seed=seed))
        state0 = alg.init(jax.random.PRNGKey(seed), ctx, hp)
        state, _ = run("pfedwn", ctx, 3, overrides, state=state0)
        pi = np.asarray(state.pi)[0]
        assert pi.sum() == pytest.approx(1.0, abs=1e-5) and pi[0] == 0
        similar.append(pi[[1, 3]])
    similar = np.array(similar)
    assert similar.sum(1).min() > 1 - 3 * hp.floor, similar  # the others keep only the floor
    first_wins = int((similar[:, 0] > similar[:, 1]).sum())
    assert 2 <= first_wins <= 8, similar
