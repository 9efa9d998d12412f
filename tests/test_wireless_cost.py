"""The cost model: rates against the Shannon formula and the MCS table by hand, ARQ and
airtime against a packet-level Monte Carlo (a NumPy loop over attempts), and bits, airtime,
energy and the clock summed by hand on three nodes."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pfedwn_jax.engine.compression import Identity, Quantize
from pfedwn_jax.wireless import ChannelParams
from pfedwn_jax.wireless.arq import arq_attempts, expected_attempts
from pfedwn_jax.wireless.compute import Devices
from pfedwn_jax.wireless.cost import (
    CostParams,
    CostSetup,
    cost_records,
    make_cost_setup,
    round_cost,
    subchannel_hz,
)
from pfedwn_jax.wireless.rates import HE_MCS_TABLE, link_rate, mcs_index, mcs_rate, shannon_rate


# ------------------------------------------------------------------------------------- rates
def test_shannon_rate_by_hand():
    np.testing.assert_allclose(shannon_rate(3.0, 1e6, 0.5), 0.5 * 1e6 * 2.0)
    np.testing.assert_allclose(shannon_rate(jnp.array([0.0, 15.0]), 2e6), [0.0, 8e6])
    # the paper's band: W = 100 MHz over F = 14 sub-channels; threshold rate at gamma_th = 7
    w_sub = float(subchannel_hz(ChannelParams()))
    assert w_sub == pytest.approx(100e6 / 14)
    np.testing.assert_allclose(link_rate("threshold", None, w_sub, 7.0, 0.8), 0.8 * w_sub * 3.0)
    np.testing.assert_allclose(
        link_rate("threshold", jnp.zeros((2, 3)), w_sub, 7.0), np.full((2, 3), 3 * w_sub)
    )


def test_mcs_table_by_hand():
    table = ((0.0, 10.0), (1.0, 2.5))  # 0 dB -> 1 b/s/Hz, 10 dB -> 2.5 b/s/Hz
    sinr = jnp.array([0.5, 1.0, 9.99, 10.0, 1e4])
    np.testing.assert_array_equal(mcs_index(sinr, table[0]), [-1, 0, 0, 1, 1])
    np.testing.assert_allclose(mcs_rate(sinr, 1e6, table), [0.0, 1e6, 1e6, 2.5e6, 2.5e6])
    np.testing.assert_allclose(
        link_rate("mcs", sinr, 1e6, 7.0, 1.0, table), mcs_rate(sinr, 1e6, table)
    )


def test_he_table_is_the_standards_rates_and_sensitivities():
    thresholds, eta = HE_MCS_TABLE
    assert len(thresholds) == len(eta) == 12
    # MCS 7: 86.0 Mb/s in 20 MHz; sensitivity -64 dBm over a -174 + 73.01 + 10 dBm floor
    assert eta[7] == pytest.approx(4.3)
    assert thresholds[7] == pytest.approx(-64 + 174 - 10 * math.log10(20e6) - 10, abs=0.01)
    assert thresholds[0] == pytest.approx(8.99) and eta[-1] == pytest.approx(7.17)
    at_20db = 10.0**2.0  # 20 dB: MCS 3 (16.99 dB) but not MCS 4 (20.99 dB)
    np.testing.assert_allclose(mcs_rate(at_20db, 20e6), 34.4e6, rtol=1e-5)


def test_rate_errors_name_the_value():
    with pytest.raises(ValueError, match=r"rate_model must be one of"):
        link_rate("turbo", None, 1e6, 1.0)
    with pytest.raises(ValueError, match="needs each link's SINR"):
        link_rate("mcs", None, 1e6, 1.0)
    with pytest.raises(ValueError, match="strictly increasing"):
        mcs_rate(1.0, 1e6, ((5.0, 1.0), (1.0, 2.0)))
    with pytest.raises(ValueError, match="reception must be one of"):
        CostParams(reception="both")
    for field, bad in [("efficiency", 0.0), ("efficiency", 1.5), ("retries", -1),
                       ("retries", 1.5), ("header_bits", -8), ("deadline_s", 0.0)]:  # fmt: skip
        with pytest.raises(ValueError, match=field):
            CostParams(**{field: bad})
    CostParams(retries=np.array([0, 3]), deadline_s=np.array([np.inf, 0.5]))  # sweep values


# --------------------------------------------------------------------------------------- ARQ
def test_expected_attempts_by_hand():
    np.testing.assert_allclose(expected_attempts([0.0, 0.5, 1.0], 2), [1.0, 1.75, 3.0])
    np.testing.assert_allclose(expected_attempts(0.5, 0), 1.0)


def _packet_level(p: np.ndarray, retries: int, trials: int, seed: int) -> np.ndarray:
    """`[trials, L]` attempts of each link, one packet at a time: stop at the first success
    or after `retries + 1` tries; negative (-attempts) where every attempt failed."""
    rng = np.random.default_rng(seed)
    out = np.zeros((trials, len(p)), np.int64)
    for t in range(trials):
        for link, fail in enumerate(p):
            n = 0
            while True:
                n += 1
                if rng.random() >= fail:
                    out[t, link] = n
                    break
                if n == retries + 1:
                    out[t, link] = -n
                    break
    return out


def _draw_arq(p: np.ndarray, retries: int, trials: int) -> tuple[np.ndarray, np.ndarray]:
    """ARQ `trials` times: the first attempt drawn as the bernoulli link model draws it."""

    def one(key):
        k1, k2 = jax.random.split(key)
        first = jax.random.uniform(k1, p.shape) >= p
        return arq_attempts(k2, first, jnp.asarray(p, jnp.float32), retries)

    n, ok = jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(3), trials))
    return np.asarray(n), np.asarray(ok)


@pytest.mark.parametrize("retries", [0, 3])
def test_arq_attempts_match_a_packet_level_monte_carlo(retries):
    p, trials = np.array([0.0, 0.2, 0.6, 1.0]), 4000
    n, ok = _draw_arq(p, retries, trials)
    ref = _packet_level(p, retries, trials, seed=11)
    ref_n, ref_ok = np.abs(ref), ref > 0
    for link in range(len(p)):
        for k in range(1, retries + 2):  # P(N = k), the two samples and the formula
            a, b = (n[:, link] == k).mean(), (ref_n[:, link] == k).mean()
            q = p[link] ** (k - 1) * ((1 - p[link]) if k <= retries else 1.0)
            se = math.sqrt(max(q * (1 - q), 1e-12) / trials)
            assert abs(a - q) <= 5 * se + 1e-9 and abs(b - q) <= 5 * se + 1e-9, (link, k)
        fail = p[link] ** (retries + 1)
        se = math.sqrt(max(fail * (1 - fail), 1e-12) / trials)
        assert abs((~ok[:, link]).mean() - fail) <= 5 * se + 1e-9
        assert abs((~ref_ok[:, link]).mean() - fail) <= 5 * se + 1e-9
    mean = np.asarray(expected_attempts(p, retries))
    sd = n.std(0) + 1e-9
    np.testing.assert_array_less(np.abs(n.mean(0) - mean), 5 * sd / math.sqrt(trials) + 1e-6)
    np.testing.assert_array_less(np.abs(ref_n.mean(0) - mean), 5 * sd / math.sqrt(trials) + 1e-6)


def _packet_airtime(p: np.ndarray, retries: int, bits: float, rate: float, trials: int):
    """Airtime of each link, one packet at a time: every attempt is on air bits / rate s."""
    rng = np.random.default_rng(5)
    air = np.zeros((trials, len(p)))
    for t in range(trials):
        for link, fail in enumerate(p):
            for _ in range(retries + 1):
                air[t, link] += bits / rate
                if rng.random() >= fail:
                    break
    return air


def test_round_airtime_per_link_matches_a_packet_level_monte_carlo():
    # slot 0 receives from 1, 2, 3 over links of P_err 0.1, 0.5, 0.9; 2 retries; 1 ms/attempt
    p = jnp.array([[0.0, 0.1, 0.5, 0.9]] + [[0.0] * 4] * 3)
    nbr = jnp.array([[0, 1, 2, 3], [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]])
    listed = jnp.array([[True] * 4] + [[True, False, False, False]] * 3)
    channel = ChannelParams(bandwidth_hz=4e6, num_subchannels=4)
    cost = CostParams(retries=2, header_bits=0)

    def one(key):
        k1, k2 = jax.random.split(key)
        first = jax.random.uniform(k1, p.shape) >= p
        setup = CostSetup(cost, jnp.float32(1e3), jnp.zeros(4), jnp.zeros(4))
        return round_cost(k2, setup, channel, 1.0, nbr, listed, first, p).airtime_s

    trials = 4000
    air = np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(0), trials)))
    ref = _packet_airtime(np.array([0.1, 0.5, 0.9]), 2, 1e3, 1e6, trials)
    for link in range(3):  # sender link + 1 sends only to slot 0
        got, want = air[:, link + 1], ref[:, link]
        for k in (1, 2, 3):  # the airtime distribution: 1, 2 or 3 ms
            a, b = np.isclose(got, k * 1e-3).mean(), np.isclose(want, k * 1e-3).mean()
            assert abs(a - b) <= 5 * math.sqrt(0.25 * 2 / trials), (link, k)
        se = math.hypot(got.std(), want.std()) / math.sqrt(trials)
        assert abs(got.mean() - want.mean()) <= 5 * se + 1e-9
    mean = 1e-3 * np.asarray(expected_attempts(jnp.array([0.1, 0.5, 0.9]), 2))
    np.testing.assert_allclose(air[:, 1:].mean(0), mean, rtol=0.05)


# ------------------------------------------------------------------------------ three nodes
# Slot 0 receives from 1 and 2, slot 1 from 0, slot 2 from 0 (its entry for 1 unlisted).
NBR = jnp.array([[0, 1, 2], [1, 0, 1], [2, 0, 1]])
LISTED = jnp.array([[True, True, True], [True, True, False], [True, True, False]])
# First attempts: 0<-1 ok; 0<-2 fails and every retry fails (p = 1); 1<-0 fails, the retry
# succeeds (p = 0); 2<-0 ok.
RECEIVED = jnp.array([[True, True, False], [True, False, False], [True, True, False]])
PERR = jnp.array([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
# gamma_th = 3: log2(1 + 3) = 2 b/s/Hz x 0.5 efficiency x 1 MHz sub-channels = 1 Mb/s;
# 976 bits + 24 header bits: 1 ms an attempt
CHANNEL = ChannelParams(bandwidth_hz=4e6, num_subchannels=4, tx_power_w=0.2)
# training: 1e4 FLOPs a sample, 2 epochs of 200, 300, 250 samples at 1 GFLOP/s: 4, 6, 5 ms
DEVICES = Devices(jnp.full((3,), 1e9), jnp.array([2.0, 3.0, 4.0]))


def _setup(cost: CostParams, payload: float = 976.0) -> CostSetup:
    return make_cost_setup(cost, payload, DEVICES, 1e4, jnp.array([200, 300, 250]), 2)


def _three(reception="parallel", deadline=math.inf, payload=976.0):
    cost = CostParams(
        reception=reception, efficiency=0.5, retries=2, header_bits=24, deadline_s=deadline
    )
    args = (NBR, LISTED, RECEIVED, PERR)
    return jax.jit(round_cost)(jax.random.key(0), _setup(cost, payload), CHANNEL, 3.0, *args)


def test_three_nodes_bits_airtime_energy_by_hand():
    c = _three()
    np.testing.assert_array_equal(c.attempts, [[0, 1, 3], [0, 2, 0], [0, 1, 0]])
    # sender 0: 2 + 1 attempts, sender 1: 1, sender 2: 3; 1000 bits and 1 ms each
    np.testing.assert_allclose(c.bits_sent, [3000.0, 1000.0, 3000.0])
    np.testing.assert_allclose(c.airtime_s, [0.003, 0.001, 0.003], rtol=1e-5)
    # 0.2 W x airtime + compute power x compute time
    energy = [0.2 * 0.003 + 2 * 0.004, 0.2 * 0.001 + 3 * 0.006, 0.2 * 0.003 + 4 * 0.005]
    np.testing.assert_allclose(c.energy_j, energy, rtol=1e-5)
    np.testing.assert_array_equal(c.delivered, [[1, 1, 0], [1, 1, 0], [1, 1, 0]])
    assert not c.straggler.any()
    records = cost_records(c)
    assert set(records) >= {"bits_sent", "airtime_s", "energy_j", "round_s"}
    np.testing.assert_array_equal(records["link_attempts"], c.attempts)


def test_three_nodes_clock_parallel_serial_and_deadline():
    # parallel: 0<-1 at 0.006 + 0.001, 0<-2 at 0.005 + 0.003, 1<-0 at 0.004 + 0.002,
    # 2<-0 at 0.004 + 0.001; each slot ends at max(own compute, its links)
    c = _three()
    np.testing.assert_allclose(c.finish_s, [0.008, 0.006, 0.005], rtol=1e-5)
    np.testing.assert_allclose(c.round_s, 0.008, rtol=1e-5)
    # serial: slot 0 takes 2's (ready 0.005, done 0.008), then 1's (ready 0.006, 0.008 -> 0.009)
    c = _three("serial")
    np.testing.assert_allclose(c.finish_s, [0.009, 0.006, 0.005], rtol=1e-5)
    np.testing.assert_allclose(c.round_s, 0.009, rtol=1e-5)
    # deadline 6.5 ms: 0<-1 (delivered at 7 ms) is a straggler, dropped; 0<-2 (failing) is
    # waited for until the deadline; the round ends at the deadline
    c = _three(deadline=0.0065)
    np.testing.assert_array_equal(c.straggler, [[0, 1, 0], [0, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(c.delivered, [[1, 0, 0], [1, 1, 0], [1, 1, 0]])
    np.testing.assert_allclose(c.finish_s, [0.0065, 0.006, 0.005], rtol=1e-5)
    np.testing.assert_allclose(c.round_s, 0.0065, rtol=1e-5)
    np.testing.assert_allclose(c.bits_sent, _three().bits_sent)  # stragglers still cost


def test_inactive_slots_spend_nothing_and_do_not_set_the_round():
    cost = CostParams(efficiency=0.5, retries=2, header_bits=24)
    # slot 0 is a sweep's padding: no list names it, its own list is empty
    listed = LISTED.at[0].set(jnp.array([True, False, False])).at[1:, 1].set(False)
    args = (NBR, listed, RECEIVED, PERR)
    active = jnp.array([False, True, True])
    setup = _setup(cost).replace(compute_s=jnp.array([0.1, 0.006, 0.005]))
    c = round_cost(jax.random.key(0), setup, CHANNEL, 3.0, *args, active=active)
    np.testing.assert_allclose(c.energy_j[0], 0.0)
    np.testing.assert_allclose(c.bits_sent, 0.0)
    np.testing.assert_allclose(c.finish_s, [0.1, 0.006, 0.005], rtol=1e-5)
    np.testing.assert_allclose(c.round_s, 0.006, rtol=1e-5)  # the slowest active slot


def test_serial_reception_against_a_queue_loop():
    """Each receiver serves its links one at a time in the order they are ready (ties by
    column): a plain loop over random ready times, airtimes and unused links."""
    from pfedwn_jax.wireless.cost import _finish_times

    rng = np.random.default_rng(4)
    ready = np.round(rng.uniform(0, 1, (6, 7)), 1)  # rounded: ties happen
    air = rng.uniform(0.05, 0.5, (6, 7))
    used = rng.uniform(size=(6, 7)) < 0.7
    got = np.asarray(
        _finish_times("serial", jnp.asarray(ready), jnp.asarray(air), jnp.asarray(used))
    )
    want = np.zeros_like(ready)
    for i in range(6):
        t = -np.inf
        for k in sorted(np.flatnonzero(used[i]), key=lambda k: (ready[i, k], k)):
            t = max(t, ready[i, k]) + air[i, k]
            want[i, k] = t
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_payload_is_the_compressors_count():
    tree = {"w": jnp.zeros((3, 10, 4)), "b": jnp.zeros((3, 4))}
    assert Identity(value_bits=16).bits(tree) == 44 * 16  # parameters x bits per parameter
    c = _three(payload=float(Quantize(bits_per_value=4).bits(tree)))  # 4 x 44 + 2 x 32 = 240
    np.testing.assert_allclose(c.bits_sent, np.array([3, 1, 3]) * (240 + 24))


def test_no_retries_keeps_the_draw_and_an_mcs_outage_is_not_used():
    cost = CostParams(rate_model="mcs", retries=0)
    sinr = jnp.array([[0.0, 100.0, 1.0], [0.0, 100.0, 100.0], [0.0, 100.0, 100.0]])
    setup = _setup(cost, 1e3)
    c = round_cost(jax.random.key(1), setup, CHANNEL, 3.0, NBR, LISTED, RECEIVED, 0.5, sinr=sinr)
    # 0<-2 at 0 dB is below MCS 0 (8.99 dB): no attempt, no airtime, not delivered
    np.testing.assert_array_equal(c.attempts, [[0, 1, 0], [0, 1, 0], [0, 1, 0]])
    np.testing.assert_array_equal(c.delivered, RECEIVED & LISTED)
    rate = 1.72e6  # 20 dB: MCS 3 (16.99 dB), 34.4 / 20 b/s/Hz on 1 MHz
    np.testing.assert_allclose(c.airtime_s, [2e3 / rate, 1e3 / rate, 0.0], rtol=1e-5)


def test_round_cost_vmaps_over_swept_deadlines_and_retries():
    def one(deadline, retries):
        cost = CostParams(efficiency=0.5, retries=retries, header_bits=24, deadline_s=deadline)
        args = (NBR, LISTED, RECEIVED, PERR)
        return round_cost(jax.random.key(0), _setup(cost), CHANNEL, 3.0, *args)

    c = jax.jit(jax.vmap(one))(jnp.array([math.inf, 0.0065]), jnp.array([2, 0]))
    np.testing.assert_allclose(c.round_s, [0.008, 0.0065], rtol=1e-5)
    np.testing.assert_array_equal(c.attempts[1], [[0, 1, 1], [0, 1, 0], [0, 1, 0]])
