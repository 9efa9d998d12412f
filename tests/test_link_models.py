"""Per-round link realisations (pfedwn_jax.wireless.links): bernoulli and physical models,
the link age state and input checks.

Statistical tests use a stated false-alarm rate: every per-test family of comparisons is
Bonferroni-corrected to a total of ALPHA = 1e-6 (exact binomial tests via scipy, or a
two-sample z test at the matching normal quantile).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from pfedwn_jax.wireless import (
    LINK_MODELS,
    ChannelParams,
    LinkAge,
    bernoulli_received,
    check_link_model,
    error_probability,
    nearest_interferers,
    path_gain,
    physical_received,
    place_network,
    simulate_links,
)

ALPHA = 1e-6
P = ChannelParams()


def _binom_ok(failures, trials, p, alpha=ALPHA):
    """Exact two-sided binomial tests of each count, Bonferroni over all of them."""
    failures, p = np.atleast_1d(failures), np.broadcast_to(p, np.shape(np.atleast_1d(failures)))
    pvals = [stats.binomtest(int(k), trials, float(q)).pvalue for k, q in zip(failures, p)]
    return min(pvals) > alpha / len(pvals), pvals


def test_link_models_and_check():
    assert LINK_MODELS == ("ideal", "bernoulli", "physical")
    for name in LINK_MODELS:
        assert check_link_model(name) == name
    with pytest.raises(ValueError, match="link_model must be one of"):
        check_link_model("lossy")


# --------------------------------------------------------------------------------- bernoulli


def _bernoulli_rounds(key, perr, mask, rounds, **kw):
    keys = jax.random.split(key, rounds)
    return np.asarray(jax.jit(jax.vmap(lambda k: bernoulli_received(k, perr, mask, **kw)))(keys))


def test_bernoulli_failure_frequency_matches_probability():
    perr = jnp.asarray(np.linspace(0.0, 1.0, 41), jnp.float32).reshape(1, 41)
    perr = jnp.concatenate([perr, perr[:, ::-1]])  # [S=2, K=41]
    rounds = 3000
    ok = _bernoulli_rounds(jax.random.key(0), perr, jnp.ones((2, 41), bool), rounds)
    assert ok.shape == (rounds, 2, 41)
    fails = (~ok).sum(0).ravel()
    passed, _ = _binom_ok(fails, rounds, np.asarray(perr, float).ravel())
    assert passed
    # and the test has power: a 0.02 shift in every probability is detected
    shifted = np.clip(np.asarray(perr, float).ravel() + 0.02, 0, 1)
    assert not _binom_ok(fails[(shifted > 0.1) & (shifted < 0.9)], rounds, 0.5)[0]


def test_bernoulli_fixed_failure_probability_and_extremes():
    rng = np.random.default_rng(0)
    mask = jnp.asarray(rng.random((5, 12)) < 0.6)
    perr = jnp.full((5, 12), 0.5)
    ok = _bernoulli_rounds(jax.random.key(1), perr, mask, 2000, failure=0.3)
    m = np.asarray(mask)
    assert not ok[:, ~m].any()  # unmasked links never arrive
    assert _binom_ok((~ok[:, m]).sum(), 2000 * int(m.sum()), 0.3)[0]
    none = _bernoulli_rounds(jax.random.key(2), perr, mask, 50, failure=1.0)
    every = _bernoulli_rounds(jax.random.key(3), perr, mask, 50, failure=0.0)
    assert not none.any()
    np.testing.assert_array_equal(every, np.broadcast_to(m, every.shape))
    # perr may be omitted with a fixed failure; shapes broadcast
    out = bernoulli_received(jax.random.key(4), None, mask[0], failure=jnp.array(0.0))
    np.testing.assert_array_equal(out, mask[0])


def test_bernoulli_determinism_independence_and_vmap():
    perr, mask = jnp.full((3, 8), 0.5), jnp.ones((3, 8), bool)
    a = bernoulli_received(jax.random.key(7), perr, mask)
    np.testing.assert_array_equal(a, bernoulli_received(jax.random.key(7), perr, mask))
    assert not np.array_equal(a, bernoulli_received(jax.random.key(8), perr, mask))
    keys = jax.random.split(jax.random.key(9), 4)
    batched = jax.vmap(lambda k: bernoulli_received(k, perr, mask))(keys)
    for i in range(4):
        np.testing.assert_array_equal(batched[i], bernoulli_received(keys[i], perr, mask))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"failure": 1.5}, r"failure must be in \[0.0, 1.0\]"),
        ({"failure": -0.1}, "failure must be in"),
        ({"perr": [0.1, float("nan")]}, "perr must be finite"),
        ({"perr": [0.1, 2.0]}, "perr must be in"),
        ({"perr": None}, "needs perr"),
        ({"mask": [1, 0]}, "mask must be a boolean"),
    ],
)
def test_bernoulli_rejects_bad_input(kwargs, match):
    args = {"key": jax.random.key(0), "perr": [0.1, 0.2], "mask": [True, False]}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        bernoulli_received(**args)


# ---------------------------------------------------------------------------------- physical


def _star(seed=0, n=10):
    """Target (node 0) and its n neighbors (1..n) of topology seed `seed` as one network."""
    t, nb = place_network(seed, n)
    pos = jnp.concatenate([t[None], nb])
    return t, nb, pos, jnp.zeros(n, jnp.int32), jnp.arange(1, n + 1), jnp.arange(n + 1) > 0


def _physical_rounds(key, rounds, *args, **kw):
    keys = jax.random.split(key, rounds)
    return np.asarray(jax.jit(jax.vmap(lambda k: physical_received(k, *args, **kw)))(keys))


def test_physical_matches_packet_level_monte_carlo_and_formula_bounds():
    t, nb, pos, rx, tx, active = _star()
    rounds, draws = 4000, 100_000
    ok = _physical_rounds(jax.random.key(11), rounds, pos, rx, tx, active, 5.0)
    rate = 1.0 - ok.mean(0)
    mc = 1.0 - np.asarray(simulate_links(jax.random.key(12), t, nb, 5.0, draws)).mean(0)
    sd = np.sqrt(rate * (1 - rate) / rounds + mc * (1 - mc) / draws)
    z_max = stats.norm.isf(ALPHA / (2 * len(rate)))  # two-sided, Bonferroni over links: 5.3
    assert np.all(np.abs(rate - mc) <= z_max * sd), (rate, mc)
    # Formula (paper moments): P_err <= e^{-b} while the packet-level loss includes not
    # transmitting at all, (1 - e^{-b})^F; losses rank like P_err (distance).
    b = P.fading_threshold**2 / P.fading.gamma
    floor = (1 - math.exp(-b)) ** P.num_subchannels
    perr = np.asarray(error_probability(t, nb, 5.0))
    assert np.all(perr <= math.exp(-b) + 1e-6)
    assert np.all(rate >= floor - z_max * np.sqrt(floor * (1 - floor) / rounds))
    assert stats.spearmanr(rate, perr).statistic > 0.9


@pytest.mark.parametrize("params", [P, ChannelParams(tx_power_w=3e-4)])
def test_physical_without_interferers_matches_closed_form(params):
    # one link at 30 m, nobody else transmitting: fails iff max_f u_f < max(b, kappa)
    pos = jnp.array([[0.0, 0.0], [24.0, 18.0], [1.0, 1.0]])
    active = jnp.array([False, True, False])  # node 2 is idle: it must not interfere
    gamma_th, rounds = 10.0, 5000
    c = params.tx_power_w * float(path_gain(30.0, params))
    kappa = gamma_th * params.noise_w / (c * params.fading.gamma)
    b = params.fading_threshold**2 / params.fading.gamma
    p_fail = (1 - math.exp(-max(b, kappa))) ** params.num_subchannels
    ok = _physical_rounds(
        jax.random.key(13), rounds, pos, jnp.array([0]), jnp.array([1]), active, gamma_th, params
    )
    assert _binom_ok((~ok).sum(), rounds, p_fail)[0]


def test_physical_pair_keying_truncation_and_candidates():
    rng = np.random.default_rng(1)
    n, num_links = 40, 120
    pos = jnp.asarray(rng.uniform(0, 50, (n, 2)), jnp.float32)
    rx = jnp.asarray(rng.integers(0, n, num_links))
    tx = jnp.asarray((np.asarray(rx) + rng.integers(1, n, num_links)) % n)  # never rx
    active = jnp.asarray(rng.random(n) < 0.8)
    key = jax.random.key(21)
    full = np.asarray(physical_received(key, pos, rx, tx, active, 5.0))
    assert full.dtype == bool and full.shape == (num_links,)
    assert not full[~np.asarray(active)[np.asarray(tx)]].any()  # idle transmitters
    # the same fading wherever a pair appears: a subset of the links gives the same outcomes
    sub = np.asarray(physical_received(key, pos, rx[::3], tx[::3], active, 5.0))
    np.testing.assert_array_equal(sub, full[::3])
    # all interferers kept = the full model; fewer interferers never turn a success into a loss
    np.testing.assert_array_equal(
        physical_received(key, pos, rx, tx, active, 5.0, num_interferers=n), full
    )
    trunc = np.asarray(physical_received(key, pos, rx, tx, active, 5.0, num_interferers=3))
    assert np.all(trunc >= full) and (trunc > full).any()
    cand = nearest_interferers(pos, rx, tx, active, 3)
    np.testing.assert_array_equal(
        physical_received(key, pos, rx, tx, active, 5.0, interferers=cand), trunc
    )
    # the candidates are the 3 nearest eligible nodes (plain loop)
    xy, act = np.asarray(pos, float), np.asarray(active)
    for i in range(0, num_links, 17):
        r, s = int(rx[i]), int(tx[i])
        ok = [j for j in range(n) if act[j] and j not in (r, s)]
        d = np.linalg.norm(xy[ok] - xy[r], axis=1)
        assert set(np.asarray(cand[i]).tolist()) == {ok[j] for j in np.argsort(d)[:3]}


def test_physical_cutoff_self_links_and_per_link_thresholds():
    rng = np.random.default_rng(1)
    n, num_links = 40, 120
    pos = jnp.asarray(rng.uniform(0, 50, (n, 2)), jnp.float32)
    rx = jnp.asarray(rng.integers(0, n, num_links))
    tx = jnp.asarray((np.asarray(rx) + rng.integers(1, n, num_links)) % n)
    active = jnp.asarray(rng.random(n) < 0.8)
    key = jax.random.key(21)
    full = np.asarray(physical_received(key, pos, rx, tx, active, 5.0))
    # a tiny cutoff removes every interferer, exactly like empty candidate lists
    none = -jnp.ones((num_links, 1), jnp.int32)
    np.testing.assert_array_equal(
        physical_received(key, pos, rx, tx, active, 5.0, cutoff_m=1e-3),
        physical_received(key, pos, rx, tx, active, 5.0, interferers=none),
    )
    # self links never arrive; per-link thresholds; another key gives other outcomes
    assert not physical_received(key, pos, jnp.array([3]), jnp.array([3]), active, 5.0)[0]
    g = jnp.where(jnp.arange(num_links) % 2 == 0, 5.0, 1e9)
    mixed = np.asarray(physical_received(key, pos, rx, tx, active, g))
    np.testing.assert_array_equal(mixed[::2], full[::2])
    assert not mixed[1::2].any()
    assert not np.array_equal(full, physical_received(jax.random.key(22), pos, rx, tx, active, 5))


def test_physical_jits_inside_a_round():
    _, _, pos, rx, tx, active = _star()

    @jax.jit
    def round_fn(key, mask):
        return mask & physical_received(key, pos, rx, tx, active, 5.0)

    mask = jnp.arange(10) % 2 == 0
    out = round_fn(jax.random.key(5), mask)
    np.testing.assert_array_equal(
        out,
        np.asarray(mask)
        & np.asarray(physical_received(jax.random.key(5), pos, rx, tx, active, 5.0)),
    )


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"positions": np.zeros((4, 3))}, "positions must have shape"),
        ({"receivers": [0, 4]}, r"receivers must be in \[0, 3\]"),
        ({"transmitters": [1.0, 2.0]}, "transmitters must hold integer"),
        ({"transmitters": [1]}, "transmitters must have shape"),
        ({"active_tx": [1, 1, 1, 1]}, "active_tx must be a boolean"),
        ({"active_tx": [True] * 3}, "active_tx must have shape"),
        ({"gamma_th": 0.0}, "gamma_th must be in"),
        ({"gamma_th": [5.0, 5.0, 5.0]}, "gamma_th must be a scalar or have shape"),
        ({"num_interferers": 0}, "num_interferers must be in"),
        ({"num_interferers": 5}, "num_interferers must be in"),
        ({"cutoff_m": -1.0}, "cutoff_m must be in"),
        ({"interferers": [[0], [9]]}, r"interferers must be in \[-1, 3\]"),
        ({"params": "table1"}, "params must be a ChannelParams"),
    ],
)
def test_physical_rejects_bad_input(kwargs, match):
    args = {
        "key": jax.random.key(0),
        "positions": np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 7.0], [9.0, 9.0]]),
        "receivers": [0, 0],
        "transmitters": [1, 2],
        "active_tx": [False, True, True, True],
        "gamma_th": 5.0,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        physical_received(**args)


# ------------------------------------------------------------------------------- link age


def test_link_age_against_a_plain_loop():
    rng = np.random.default_rng(4)
    history = rng.random((30, 3, 5)) < 0.3
    state = LinkAge.init((3, 5))
    assert state.age.dtype == jnp.int32 and not np.asarray(state.seen).any()
    age, seen = np.zeros((3, 5), int), np.zeros((3, 5), bool)
    update = jax.jit(LinkAge.update)
    for received in history:
        state = update(state, received)
        for s in range(3):
            for k in range(5):
                age[s, k] = 0 if received[s, k] else age[s, k] + 1
                seen[s, k] |= received[s, k]
        np.testing.assert_array_equal(state.age, age)
        np.testing.assert_array_equal(state.seen, seen)
    assert np.asarray(LinkAge.init((2,), seen=True).seen).all()
    top = LinkAge(jnp.array([2**31 - 1], jnp.int32), jnp.array([True]))
    assert int(top.update(jnp.array([False])).age[0]) == 2**31 - 1  # saturates


# ------------------------------------------------------------------ slow: more rounds, 10k nodes


@pytest.mark.slow
def test_physical_matches_monte_carlo_with_many_rounds():
    t, nb, pos, rx, tx, active = _star(seed=3)
    rounds = 40_000
    ok = np.concatenate(
        [
            _physical_rounds(jax.random.key(100 + i), 10_000, pos, rx, tx, active, 10.0)
            for i in range(4)
        ]
    )
    rate = 1.0 - ok.mean(0)
    mc = 1.0 - np.asarray(simulate_links(jax.random.key(12), t, nb, 10.0, 400_000)).mean(0)
    sd = np.sqrt(rate * (1 - rate) / rounds + mc * (1 - mc) / 400_000)
    assert np.all(np.abs(rate - mc) <= stats.norm.isf(ALPHA / 20) * sd), (rate, mc)


@pytest.mark.slow
def test_physical_on_ten_thousand_nodes():
    rng = np.random.default_rng(6)
    n, per = 10_000, 4
    area = 50.0 * math.sqrt(n / 11)  # the density of 11 nodes in Table I's 50 m square
    pos = jnp.asarray(rng.uniform(0, area, (n, 2)), jnp.float32)
    rx = jnp.repeat(jnp.arange(n), per)
    tx = (rx + jnp.asarray(rng.integers(1, n, n * per))) % n
    active = jnp.ones(n, bool)
    params = P.replace(area_m=area)
    cand = nearest_interferers(pos, rx, tx, active, 16)
    out = physical_received(jax.random.key(0), pos, rx, tx, active, 5.0, params, interferers=cand)
    assert out.shape == (n * per,) and 0.0 < float(out.mean()) < 1.0
