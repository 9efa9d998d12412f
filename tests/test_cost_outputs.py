"""The cost of a round from the config to the outputs: `cost=True` puts `bits_sent`,
`airtime_s`, `energy_j` (per round, summed over the slots; per slot in `client_...`) and the
simulated clock `clock_s` into `Result`, `SweepResult` and the CSV; a sweep over the
threshold and the deadline is one program whose runs equal their own `run()`."""

from __future__ import annotations

import csv
import importlib.util
import io
import math

import jax
import numpy as np
import pytest
from helpers import VARIED_RUN, scalar_series, toml_text

import pfedwn_jax
from pfedwn_jax import ExperimentConfig, sweep
from pfedwn_jax.experiment.grid import expand, run_config
from pfedwn_jax.experiment.setup import setup
from pfedwn_jax.models import get_model
from pfedwn_jax.runner.writers import TensorBoardWriter

COST = dict(cost=True, retries=1, header_bits=64.0)
KEY = jax.random.key(0)
COST_KEYS = ("bits_sent", "airtime_s", "energy_j", "clock_s", "cumulative_energy_j")


def _config(**changes):
    return ExperimentConfig(**{**VARIED_RUN, "algorithms": ("pfedwn",), **COST, **changes})


@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
    """A run with the cost counted, logged to TensorBoard where tensorboardX is installed
    (`tb`: the event folder, else None)."""
    config = _config()
    tb = None
    if importlib.util.find_spec("tensorboardX") is not None:
        tb = tmp_path_factory.mktemp("cost_logs")
    writers = [] if tb is None else [TensorBoardWriter(tb)]
    return config, pfedwn_jax.run(config, progress=False, writers=writers), tb


def test_a_run_reports_the_cost_summed_by_hand(one_run):
    config, result, _ = one_run
    m = result.methods["pfedwn"]
    rec = {k: result.records("pfedwn", k) for k in ("bits_sent", "airtime_s", "energy_j")}
    for key, per_slot in rec.items():  # [R, S] as sender
        np.testing.assert_allclose(m[key], per_slot.sum(axis=1), rtol=1e-6)
        np.testing.assert_allclose(m[f"client_{key}"], per_slot, rtol=1e-6)
    np.testing.assert_allclose(m["clock_s"], np.cumsum(result.records("pfedwn", "round_s")))
    # every slot of the selected group sends one model to each of the others (no failures:
    # ideal links, so one attempt each): parameters x 32 bits + the header
    model = get_model("logreg", 10, (28, 28, 1))
    params = sum(x.size for x in jax.tree.leaves(model.init(jax.random.key(0))))
    slots = rec["bits_sent"].shape[1]
    want = (slots - 1) * (32 * params + 64.0)
    np.testing.assert_allclose(rec["bits_sent"], want)
    rate = 100e6 / 14 * math.log2(1 + config.gamma_th)  # the threshold rate, Table I channel
    np.testing.assert_allclose(rec["airtime_s"], want / rate, rtol=1e-5)
    assert np.all(rec["energy_j"] >= 0.2 * rec["airtime_s"])  # plus the compute energy
    assert np.all(np.diff(m["clock_s"]) > 0)
    np.testing.assert_allclose(m["cumulative_energy_j"], np.cumsum(m["energy_j"]))
    summary = result.summary()["pfedwn"]
    assert summary["time_to_90"] in set(m["clock_s"])
    assert summary["energy_to_90"] in set(m["cumulative_energy_j"])


def test_tensorboard_receives_the_cost_of_every_round(one_run):
    _, result, tb = one_run
    if tb is None:
        pytest.skip("tensorboardX is not installed")
    series = scalar_series(tb / "seed=0" / "pfedwn")
    entry = result.methods["pfedwn"]
    for tag in COST_KEYS:
        steps, values = zip(*series[tag], strict=True)
        assert steps == (1, 2), tag
        np.testing.assert_allclose(values, entry[tag], rtol=1e-6, err_msg=tag)
        assert np.all(np.asarray(values) > 0), tag


def test_each_method_is_charged_what_it_sends():
    """At 16 bits a parameter over ideal links (one attempt each), to each of the others:
    SCAFFOLD its model and control variate, CHOCO its 4-bit QSGD difference (4 bits a
    parameter and a 32-bit norm a leaf), each plus the header; Local nothing: no bits, no
    airtime, its energy its training's and its round the slowest slot's training."""
    hp = {"choco": {"bits": 4}}
    config = _config(algorithms=("local", "scaffold", "choco"), hparams=hp, bits_per_param=16)
    result = pfedwn_jax.run(config, progress=False)
    params = sum(x.size for x in jax.tree.leaves(get_model("logreg", 10, (28, 28, 1)).init(KEY)))
    bits = {m: result.records(m, "bits_sent") for m in config.algorithms}
    others = bits["local"].shape[1] - 1
    np.testing.assert_allclose(bits["scaffold"], others * (2 * 16 * params + 64.0))
    np.testing.assert_allclose(bits["choco"], others * (4 * params + 32 * 2 + 64.0))
    cost = setup(config).ctx.links.cost
    assert not bits["local"].any() and not result.records("local", "airtime_s").any()
    compute_j = np.asarray(cost.compute_w) * np.asarray(cost.compute_s)
    np.testing.assert_allclose(result.records("local", "energy_j"), [compute_j] * 2, rtol=1e-6)
    rounds = result.records("local", "round_s")
    np.testing.assert_allclose(rounds, np.asarray(cost.compute_s).max(), rtol=1e-6)


def test_cost_off_leaves_no_cost_outputs():
    result = pfedwn_jax.run(ExperimentConfig(**VARIED_RUN, algorithms=("local",)), progress=False)
    entry = result.methods["local"]
    assert not set(COST_KEYS) & set(entry) and "client_bits_sent" not in entry
    assert "time_to_90" not in result.summary()["local"]


def test_a_sweep_over_threshold_power_and_deadline_is_one_program_equal_to_its_runs():
    config = _config()
    grid = {
        "gamma_th": [5.0, 3.0],
        "channel.tx_power_w": [0.2, 0.5],
        "deadline_s": [math.inf, 0.004],
        "retries": [1, 0],
    }
    result = sweep(config, seeds="0-1", grid=grid, zip=True, progress=False)
    assert result.meta["programs"] == 1 and result.num_runs == 4
    text = result.to_csv()
    header = next(csv.reader(io.StringIO(text)))
    assert set(COST_KEYS) <= set(header) and "channel.tx_power_w" in header
    for spec in expand(config, "0-1", grid, zip=True):
        own = pfedwn_jax.run(run_config(config, spec), progress=False).methods["pfedwn"]
        sel = result.rows["run"] == spec.index
        for key in ("target_accuracy", *COST_KEYS):
            np.testing.assert_allclose(result.rows[key][sel], own[key], rtol=1e-5, err_msg=key)
    ends = [e[f"{k}_to_90_mean"] for e in result.summary() for k in ("time", "energy")]
    assert len(ends) == 4 and all(np.isfinite(ends))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cost": "yes"}, "cost"),
        ({"rate_model": "shannon"}, "rate_model"),
        ({"reception": "both"}, "reception"),
        ({"rate_efficiency": 1.5}, "rate_efficiency"),
        ({"retries": -1}, "retries"),
        ({"header_bits": -8}, "header_bits"),
        ({"deadline_s": 0.0}, "deadline_s"),
        ({"bits_per_param": 0}, "bits_per_param"),
        ({"device_distribution": "normal"}, "device_distribution"),
        ({"device_profiles": ("toaster",)}, "device_profiles"),
        ({"device_profiles": ()}, "device_profiles"),
    ],
)
def test_a_bad_cost_value_names_its_field(change, field):
    with pytest.raises(ValueError, match=field):
        _config(**change)


def test_cost_fields_round_trip_through_dict_and_toml(tmp_path):
    config = _config(deadline_s=0.5, reception="serial", device_profiles=["smartphone"])
    assert ExperimentConfig.from_dict(config.to_dict()) == config
    path = tmp_path / "c.toml"
    path.write_text(toml_text({k: v for k, v in config.to_dict().items() if v is not None}))
    assert ExperimentConfig.from_toml(path) == config
    assert _config(deadline_s=None).deadline_s == math.inf  # None (a JSON inf): no deadline
