"""FedEM against a plain per-client EM loop written from the paper, its one-component limit
(FedAvg), and through run / sweep / network mode / stale lossy links."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from algo_reference import (
    NETWORK,
    SINGLE,
    assert_close,
    init,
    make_ctx,
    rows,
    smoke,
    tmap,
    trajectory,
    weights,
    wsum,
)

from pfedwn_jax.algorithms import get_algorithm, make_hparams


def _per_sample_ce(ctx, params, i):
    count = int(ctx.train.count[i])
    x, y = ctx.train.x[i, :count], ctx.train.y[i, :count]
    logp = jax.nn.log_softmax(ctx.model.apply(params, x))
    return -jnp.take_along_axis(logp, y[:, None], axis=1)[:, 0]


def fedem_reference(ctx, comps, n_rounds, epochs):
    """``comps[s][m]``: the initial components; full-batch steps (batch >= every count)."""
    lr, s, m = float(ctx.lr), ctx.num_slots, len(comps[0])
    pi = [np.full(m, 1.0 / m)] * s
    for _ in range(n_rounds):
        trained = []
        for i in range(s):
            losses = np.stack([np.asarray(_per_sample_ce(ctx, comps[i][c], i)) for c in range(m)])
            logit = np.log(pi[i])[:, None] - losses
            q = np.exp(logit - logit.max(0))
            q /= q.sum(0)
            pi[i] = q.mean(1)
            out = []
            for c in range(m):
                qc = jnp.asarray(q[c], jnp.float32)
                f = lambda p, i=i, qc=qc: jnp.sum(qc * _per_sample_ce(ctx, p, i)) / qc.shape[0]
                w = comps[i][c]
                for _ in range(epochs):
                    w = tmap(lambda a, g: a - lr * g, w, jax.grad(f)(w))
                out.append(w)
            trained.append(out)
        comps = [
            [wsum((weights(ctx, i)[j], trained[j][c]) for j in rows(ctx)[i]) for c in range(m)]
            for i in range(s)
        ]
    return comps, pi


@pytest.mark.parametrize("adjacency", [SINGLE, pytest.param(NETWORK, marks=pytest.mark.slow)])
def test_fedem_matches_a_per_client_em_loop(adjacency):
    counts = [5, 7, 6, 4] if adjacency else [5, 7, 6]
    ctx = make_ctx(counts, adjacency, lr=0.5, batch_size=8, epochs=1, repeat=False)
    alg, hp, state = init("fedem", ctx, {"components": 2})
    comps = [[tmap(lambda a, i=i, c=c: a[i, c], state.clients.params) for c in range(2)]
             for i in range(ctx.num_slots)]  # fmt: skip
    step = jax.jit(lambda st, key, c: alg.round(st, key, c, hp)[0])
    for r in range(2):
        state = step(state, jax.random.PRNGKey(r), ctx)
    want, pi = fedem_reference(ctx, comps, 2, 1)
    np.testing.assert_allclose(state.pi, np.stack(pi), rtol=1e-4, atol=1e-5)
    for i in range(ctx.num_slots):
        for c in range(2):
            assert_close(tmap(lambda a, i=i, c=c: a[i, c], state.clients.params), want[i][c])
    assert np.abs(np.asarray(state.pi) - 0.5).max() > 1e-3  # the weights moved
    top = np.argmax(np.asarray(state.pi), axis=1)  # evaluated with the dominant component
    assert_close(alg.eval_params(state, ctx, hp), tmap(lambda a: a[np.arange(len(top)), top],
                                                        state.clients.params))  # fmt: skip


def test_fedem_with_one_component_is_fedavg():
    ctx = make_ctx([4, 8, 12], repeat=False)
    got = trajectory("fedem", ctx, 2, {"components": 1})
    for a, b in zip(got, trajectory("fedavg", ctx, 2), strict=True):
        assert_close(a, b, 1e-6, 1e-7)


def test_fedem_runs_everywhere():
    smoke("fedem", {"components": 2})
    with pytest.raises(ValueError, match=r"hparams\.fedem\.components"):
        make_hparams(get_algorithm("fedem"), {"components": 0})
