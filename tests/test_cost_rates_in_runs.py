"""Rate models from each link's SINR inside the round: with the physical link model the
round's own draw hands every listed link's SINR on its sub-channel to the cost, so
``rate_model="shannon"`` and ``"mcs"`` price a link at its rate; checked against the
formulas applied by hand to the public SINR draw of the same key."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY_RUN, VARIED_RUN, link_round_context

import pfedwn_jax
from pfedwn_jax import ExperimentConfig
from pfedwn_jax.algorithms import RoundContext
from pfedwn_jax.experiment.cost_config import cost_params
from pfedwn_jax.experiment.grid import expand, run_config
from pfedwn_jax.experiment.link_setup import Links
from pfedwn_jax.runner.links import LINK_SALT, begin_round
from pfedwn_jax.wireless import ChannelParams
from pfedwn_jax.wireless.cost import CostParams, CostSetup
from pfedwn_jax.wireless.links import physical_draw, physical_received, physical_sinr

# five slots 20 m to 400 m apart: SINRs from below 802.11ax's MCS 0 to above its MCS 11
POS = np.array([[0, 0], [20, 0], [0, 60], [150, 0], [0, 400]], np.float32)
S = len(POS)
GAMMA = 5.0
PAYLOAD = 1e6  # bits of a model
COMPUTE = np.array([0.001, 0.002, 0.003, 0.004, 0.005])
W_SUB = 100e6 / 14  # Table I: W / F
# 802.11ax HE-SU, 1 spatial stream, 0.8 us GI, 20 MHz: data rates (Mb/s) and minimum
# sensitivities (dBm) over the noise floor -174 dBm/Hz + 10 log10(20 MHz) + 10 dB
HE_MBPS = [8.6, 17.2, 25.8, 34.4, 51.6, 68.8, 77.4, 86.0, 103.2, 114.7, 129.0, 143.4]
HE_DBM = [-82, -79, -77, -74, -70, -66, -65, -64, -59, -57, -54, -52]
FLOOR_DBM = -174 + 10 * math.log10(20e6) + 10


def _context(rate_model: str) -> RoundContext:
    setup = CostSetup(
        CostParams(rate_model=rate_model),
        jnp.float32(PAYLOAD),
        jnp.asarray(COMPUTE, jnp.float32),
        jnp.full((S,), 2.0),
    )
    links = Links(
        perr=jnp.zeros((S, S), jnp.float32),
        positions=jnp.asarray(POS),
        active=jnp.ones((S,), bool),
        gamma_th=jnp.float32(GAMMA),
        failure=None,
        params=ChannelParams(),
        model="physical",
        cost=setup,
    )
    return link_round_context(links)


def _sinr_by_hand(key: jax.Array, nbr: np.ndarray) -> np.ndarray:
    """`[S, K]` each listed link's SINR from the public draw `physical_sinr`, same key."""
    rx = np.repeat(np.arange(S), nbr.shape[1]).astype(np.int32)
    sinr = physical_sinr(
        jax.random.fold_in(key, LINK_SALT), POS, rx, nbr.reshape(-1), np.ones(S, bool), GAMMA
    )
    return np.asarray(sinr, np.float64).reshape(nbr.shape)


def _mcs_rate(sinr: np.ndarray) -> np.ndarray:
    """The table read by hand: the highest MCS whose threshold the SINR meets, 0 below."""
    thresholds = 10 ** ((np.array(HE_DBM) - FLOOR_DBM) / 10)
    eta = np.array(HE_MBPS) / 20.0
    m = (sinr[..., None] >= thresholds).sum(-1) - 1
    return np.where(m >= 0, W_SUB * eta[np.maximum(m, 0)], 0.0)


RATES = {
    "threshold": lambda sinr: np.full(sinr.shape, W_SUB * math.log2(1 + GAMMA)),
    "shannon": lambda sinr: W_SUB * np.log2(1 + sinr),
    "mcs": _mcs_rate,
}


KEYS = jax.random.split(jax.random.key(3), 6)


@functools.cache
def _all_rounds() -> dict:
    """Rate model -> the round's context and records for each of `KEYS` (one program)."""

    def rounds(key: jax.Array) -> dict:
        return {rate: begin_round(_context(rate), None, key)[:2] for rate in RATES}

    return jax.jit(jax.vmap(rounds))(KEYS)


def _rounds(rate_model: str) -> tuple:
    return _all_rounds()[rate_model]


def _threshold_arrivals() -> np.ndarray:
    return np.asarray(_rounds("threshold")[0].neighbor_mask)


@pytest.mark.parametrize("rate_model", ["shannon", "mcs", "threshold"])
def test_a_rounds_airtime_is_each_links_rate_of_its_drawn_sinr(rate_model):
    contexts, all_records = _rounds(rate_model)
    seen = {"below MCS 0": 0, "between": 0, "above MCS 11": 0, "silent": 0}
    for i, key in enumerate(KEYS):
        records = {k: np.asarray(v[i]) for k, v in all_records.items()}
        nbr = np.asarray(contexts.neighbors[i])
        sinr = _sinr_by_hand(key, nbr)
        rate = RATES[rate_model](sinr)
        used = np.ones(nbr.shape, bool)
        used[:, 0] = False
        used &= rate > 0  # a link with no rate (silent sender; below MCS 0) is not used
        airtime = np.where(used, PAYLOAD / np.where(used, rate, 1.0), 0.0)
        by_sender = np.zeros(S)
        np.add.at(by_sender, nbr, airtime)
        np.testing.assert_allclose(records["airtime_s"], by_sender, rtol=2e-5)
        bits = np.zeros(S)
        np.add.at(bits, nbr, np.where(used, PAYLOAD, 0.0))
        np.testing.assert_allclose(records["bits_sent"], bits, rtol=1e-6)
        finish = np.where(used, COMPUTE[nbr] + airtime, 0.0).max(axis=1)
        np.testing.assert_allclose(records["round_s"], np.maximum(COMPUTE, finish).max(), rtol=2e-5)
        # what arrives is the physical draw (SINR >= gamma_th) over the used links
        arrived = _threshold_arrivals()[i] & (used | (np.arange(nbr.shape[1]) == 0))
        np.testing.assert_array_equal(contexts.neighbor_mask[i], arrived)
        db = 10 * np.log10(sinr[:, 1:][sinr[:, 1:] > 0])
        low, high = db < HE_DBM[0] - FLOOR_DBM, db >= HE_DBM[-1] - FLOOR_DBM
        seen["below MCS 0"] += int(low.sum())
        seen["above MCS 11"] += int(high.sum())
        seen["between"] += int((~low & ~high).sum())
        seen["silent"] += int((sinr[:, 1:] == 0).sum())
    assert all(n > 0 for n in seen.values()), seen  # the draws cover every case


def test_the_one_pass_draw_is_the_success_draw_and_the_sinr_draw():
    rx = np.repeat(np.arange(S), S).astype(np.int32)
    tx = np.tile(np.arange(S), S).astype(np.int32)
    for key in KEYS[:2]:
        args = (key, POS, rx, tx, np.ones(S, bool), GAMMA)
        got, sinr = physical_draw(*args)
        np.testing.assert_array_equal(got, physical_received(*args))
        np.testing.assert_array_equal(sinr, physical_sinr(*args))


VARIED_RUN_CHANGES = {k: v for k, v in VARIED_RUN.items() if TINY_RUN.get(k) != v}
RUN = {**TINY_RUN, "rounds": 2, "algorithms": ("pfedwn",), "link_model": "physical", "cost": True}


def _run(rate_model: str) -> dict:
    config = ExperimentConfig(**RUN, rate_model=rate_model)
    return pfedwn_jax.run(config, progress=False).methods["pfedwn"]


def test_the_config_hands_its_rate_model_to_the_round():
    config = ExperimentConfig(**RUN, rate_model="mcs")
    assert cost_params(config).rate_model == "mcs"


@pytest.mark.slow  # the quick tier checks the round itself and the config's hand-over
def test_a_run_prices_its_links_at_the_rate_of_their_sinr():
    entry = _run("shannon")
    airtime, bits = np.asarray(entry["airtime_s"]), np.asarray(entry["bits_sent"])
    assert np.all(np.isfinite(airtime)) and np.all(bits > 0)
    fixed = bits / (W_SUB * math.log2(1 + TINY_RUN["gamma_th"]))  # what "threshold" takes
    assert not np.allclose(airtime, fixed, rtol=1e-3)


@pytest.mark.slow
def test_shannon_changes_only_the_cost_and_mcs_drops_links_below_its_table():
    thr, sha, mcs = (_run(r) for r in ("threshold", "shannon", "mcs"))
    received = [np.asarray(r["records"]["link_received"]) for r in (thr, sha, mcs)]
    # no deadline: Shannon delivers exactly the physical draw's links, so training is equal
    np.testing.assert_array_equal(received[1], received[0])
    assert sha["target_accuracy"] == thr["target_accuracy"]
    assert not np.allclose(sha["airtime_s"], thr["airtime_s"])
    # the threshold model spends an attempt on a silent sender's link, Shannon does not
    assert np.all(np.asarray(sha["bits_sent"]) <= np.asarray(thr["bits_sent"]))
    assert np.all(received[2] <= received[0])  # MCS drops links below its table, adds none
    assert all(np.all(np.asarray(r["energy_j"]) > 0) for r in (thr, sha, mcs))


@pytest.mark.parametrize("rate_model", ["shannon", "mcs"])
@pytest.mark.parametrize("link_model", ["ideal", "bernoulli"])
def test_an_sinr_rate_model_without_the_physical_draw_names_both_fields(rate_model, link_model):
    with pytest.raises(ValueError, match=rf"rate_model='{rate_model}'.*link_model='physical'"):
        ExperimentConfig(**{**RUN, "link_model": link_model}, rate_model=rate_model)


@pytest.mark.slow
def test_a_sweep_with_mcs_rates_is_one_program_equal_to_its_runs():
    """Seeds 0 and 3 select 2 and 3 neighbors: padded slots share the program (no SINR, no
    link); a 30 ms deadline makes stragglers of slow links."""
    config = ExperimentConfig(**{**RUN, **VARIED_RUN_CHANGES}, rate_model="mcs", retries=1)
    grid = {"deadline_s": [math.inf, 0.03]}
    result = pfedwn_jax.sweep(config, seeds="0,3", grid=grid, progress=False)
    assert result.meta["programs"] == 1
    for spec in expand(config, "0,3", grid):
        own = pfedwn_jax.run(run_config(config, spec), progress=False).methods["pfedwn"]
        sel = result.rows["run"] == spec.index
        for key in ("target_accuracy", "airtime_s", "clock_s", "cumulative_energy_j"):
            np.testing.assert_allclose(result.rows[key][sel], own[key], rtol=1e-5, err_msg=key)
