"""Bad input never reaches JAX: config, hyperparameters, TOML and CLI fail with one ValueError.

Example tests cover each kind of bad value through the API, a TOML file and `pfedwn run`;
property tests (hypothesis) feed random wrong types and values and check that construction
either raises `ValueError` or stores the value normalised. Nothing here runs an experiment.
"""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pfedwn_jax._checks import INT32_MAX, SEED_MAX
from pfedwn_jax.algorithms import (
    available_algorithms,
    default_algorithms,
    get_algorithm,
    make_hparams,
)
from pfedwn_jax.cli import main
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.config import MAX_NEIGHBORS
from pfedwn_jax.experiment.federation import place_nodes
from pfedwn_jax.experiment.setup import round_keys
from pfedwn_jax.wireless import ChannelParams

# field -> (low, high) of the integer fields; None-able ones listed in OPTIONAL
INT_FIELDS = {
    "rounds": (1, INT32_MAX),
    "local_epochs": (1, INT32_MAX),
    "local_steps": (1, INT32_MAX),
    "batch_size": (1, INT32_MAX),
    "num_neighbors": (1, MAX_NEIGHBORS),
    "seed": (0, SEED_MAX),
    "data_seed": (0, SEED_MAX),
    "topology_seed": (0, SEED_MAX),
    "min_samples": (1, INT32_MAX),
    "classes_per_client": (1, INT32_MAX),
    "max_samples_per_client": (20, INT32_MAX),  # >= the default min_samples
    "record_every": (1, 30),  # <= the default rounds
    "reselect_every": (0, INT32_MAX),
    "retries": (0, INT32_MAX),
    "bits_per_param": (1, 64),
}
# field -> (low, high, low_inclusive, high_inclusive) of the float fields
FLOAT_FIELDS = {
    "alpha": (0.0, math.inf, False, False),
    "train_frac": (0.0, 1.0, False, False),
    "lr": (0.0, math.inf, False, False),
    "momentum": (0.0, 1.0, True, False),
    "gamma_th": (0.0, math.inf, False, False),
    "eps": (0.0, 1.0, False, False),
    "val_fraction": (0.0, 1.0, True, False),
    "speed": (0.0, math.inf, True, False),
    "round_seconds": (0.0, math.inf, False, False),
    "shadowing_db": (0.0, math.inf, True, False),
    "rate_efficiency": (0.0, 1.0, False, True),
    "header_bits": (0.0, math.inf, True, False),
}
CHOICE_FIELDS = (
    "partition",
    "model",
    "mode",
    "moments",
    "interference_tail",
    "link_model",
    "pool",
    "record_dtype",
    "mobility",
    "fading",
    "rate_model",
    "reception",
    "device_distribution",
)
# candidates / interference_cutoff need mode="network", link_failure link_model="bernoulli":
# on their own only None passes
OPTIONAL = (
    "local_steps",
    "max_samples_per_client",
    "data_seed",
    "dataset",
    "data_dir",
    "node_density",
    "candidates",
    "interference_cutoff",
    "link_failure",
    "classes_per_client",
    "fading_param",
)
HPARAM_FIELDS = [
    (name, f.name)
    for name in available_algorithms()
    for f in dataclasses.fields(get_algorithm(name).hparams)
]
CHANNEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ChannelParams)}

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CLI_FAST = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _raises(field: str, match: str | None = None, **kwargs) -> str:
    """Build a config from `kwargs`; assert a ValueError naming `field`; return its text."""
    with pytest.raises(ValueError, match=match) as info:
        ExperimentConfig(**kwargs)
    assert field in str(info.value)
    return str(info.value)


def _cli_error(capsys, argv: list[str]) -> str:
    """Run `pfedwn` with `argv`; assert exit status 2 and one stderr line; return that line."""
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def _toml_and_cli_fail(tmp_path, capsys, toml: str, argv: list[str], match: str) -> None:
    """`toml` as a config file and `argv` as `pfedwn run` flags both fail naming `match`."""
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(ValueError, match=match):
        ExperimentConfig.from_toml(path)
    line = _cli_error(capsys, ["run", *argv, "--out", str(tmp_path / "o")])
    assert re.search(match, line), line


def _toml(value) -> str:
    """A TOML literal for a JSON-like Python value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return {math.inf: "inf", -math.inf: "-inf"}.get(value, repr(value))
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{" + ", ".join(f'"{k}" = {_toml(v)}' for k, v in value.items()) + "}"


# ------------------------------------------------------------------------ 1. normalised storage
def test_integral_floats_are_stored_as_ints():
    cfg = ExperimentConfig(rounds=2.0, num_neighbors=4.0, target=np.int64(3), seed=np.float32(7))
    assert (cfg.rounds, cfg.num_neighbors, cfg.target, cfg.seed) == (2, 4, 3, 7)
    assert all(type(v) is int for v in (cfg.rounds, cfg.num_neighbors, cfg.target, cfg.seed))
    assert type(ExperimentConfig(lr=1).lr) is float


@pytest.mark.parametrize("value", [2.5, True, "2", None, [2], {"n": 2}, math.inf, math.nan])
def test_bad_integer_is_rejected(value):
    _raises("rounds", "rounds must be", rounds=value)


@pytest.mark.parametrize(
    ("hparams", "field"),
    [
        ({"pfedwn": {"a": "0.5"}}, "hparams.pfedwn.a"),
        ({"pfedwn": {"em_steps": 2.5}}, "hparams.pfedwn.em_steps"),
        ({"pfedwn": {"component_updates": 1}}, "hparams.pfedwn.component_updates"),
        ({"fedprox": {"mu": "0.1"}}, "hparams.fedprox.mu"),
        ({"fedamp": {"sigma": [1.0]}}, "hparams.fedamp.sigma"),
        ({"fedamp": {"lam": None}}, "hparams.fedamp.lam"),
        ({"perfedavg": {"alpha": True}}, "hparams.perfedavg.alpha"),
        ({"perfedavg": {"variant": ["fo"]}}, "hparams.perfedavg.variant"),
        ({"perfedavg": {"split_batch": "yes"}}, "hparams.perfedavg.split_batch"),
        ({"fedprox": 0.1}, "hparams.fedprox"),
        ({"fedprox": [0.1]}, "hparams.fedprox"),
        ([("fedprox", {"mu": 0.1})], "hparams"),
    ],
)
def test_bad_hparams_name_the_field(hparams, field):
    _raises(field, hparams=hparams)


def test_hparams_are_stored_normalised():
    cfg = ExperimentConfig(
        hparams={"pfedwn": {"a": 1, "em_steps": 2.0}, "perfedavg": {"split_batch": np.bool_(0)}}
    )
    assert cfg.hparams == {"pfedwn": {"a": 1.0, "em_steps": 2}, "perfedavg": {"split_batch": False}}
    assert type(cfg.hparams["pfedwn"]["a"]) is float
    assert type(cfg.hparams["pfedwn"]["em_steps"]) is int
    hp = cfg.hparams_for("pfedwn")
    assert (type(hp.a), type(hp.em_steps)) == (float, int)
    assert type(make_hparams(get_algorithm("fedprox"), {"mu": 1}).mu) is float


def test_toml_values_are_checked_and_normalised(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("rounds = 2.0\nnum_neighbors = 4.0\n[hparams.fedprox]\nmu = 1\n")
    cfg = ExperimentConfig.from_toml(path)
    assert (cfg.rounds, cfg.num_neighbors, cfg.hparams) == (2, 4, {"fedprox": {"mu": 1.0}})
    assert type(cfg.rounds) is int and type(cfg.hparams["fedprox"]["mu"]) is float
    for text, field in [
        ('[hparams.pfedwn]\na = "0.5"\n', "hparams.pfedwn.a"),
        ("hparams = {fedprox = 0.1}\n", "hparams.fedprox"),
        ("rounds = 2.5\n", "rounds"),
        ('rounds = "3"\n', "rounds"),
    ]:
        path.write_text(text)
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            ExperimentConfig.from_toml(path)


def test_cli_bad_hparams_in_config_file(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text("hparams = {fedprox = 0.1}\n")
    line = _cli_error(capsys, ["run", "--config", str(path), "--out", str(tmp_path / "o")])
    assert "hparams.fedprox" in line


# ------------------------------------------------------------------------ 2. seeds
@pytest.mark.parametrize("field", ["seed", "data_seed", "topology_seed"])
@pytest.mark.parametrize("value", [-1, SEED_MAX + 1, 2**63, 2**64])
def test_seed_out_of_range_names_the_range(field, value):
    _raises(field, rf"\[0, {SEED_MAX}\]", **{field: value})


@pytest.mark.parametrize("value", [0, SEED_MAX])
def test_seed_edges_run_through_prng_key(value):
    cfg = ExperimentConfig(seed=value, data_seed=value, topology_seed=value, num_neighbors=3)
    init_key, _ = round_keys(cfg.seed)  # key data
    assert init_key.shape == (2,) and init_key.dtype == np.uint32
    _, others, _ = place_nodes(cfg)
    assert others.shape == (3, 2) and np.all(np.isfinite(others))
    assert np.asarray(jax.random.PRNGKey(cfg.data_seed)).tolist() == [0, value]


def test_seed_edges_give_distinct_keys():
    low, high = round_keys(0)[0], round_keys(SEED_MAX)[0]
    assert not np.array_equal(low, high)


def test_toml_and_cli_seed_overflow(tmp_path, capsys):
    match = rf"seed must be in \[0, {SEED_MAX}\]"
    _toml_and_cli_fail(tmp_path, capsys, f"seed = {2**64}\n", ["--seed", str(2**64)], match)
    argv = ["--topology-seed", str(SEED_MAX + 1)]
    _toml_and_cli_fail(tmp_path, capsys, f"topology_seed = {2**64}\n", argv, "topology_" + match)


# ------------------------------------------------------------------------ 3. non-finite floats
@pytest.mark.parametrize("field", sorted(FLOAT_FIELDS))
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_float_is_rejected(field, value):
    _raises(field, "finite", **{field: value})


@pytest.mark.parametrize(
    "hparams",
    [
        {"fedprox": {"mu": math.inf}},
        {"fedamp": {"alpha_k": math.nan}},
        {"pfedwn": {"em_tol": math.inf}},
    ],
)
def test_non_finite_hparam_is_rejected(hparams):
    _raises("hparams.", "finite", hparams=hparams)


def test_non_finite_channel_override_is_rejected():
    _raises("channel.area_m", "finite", channel={"area_m": math.inf})


def test_toml_and_cli_inf_lr(tmp_path, capsys):
    _toml_and_cli_fail(tmp_path, capsys, "lr = inf\n", ["--lr", "nan"], "lr must be a finite")


# ------------------------------------------------------------------------ 4. empty method list
@pytest.mark.parametrize("text", [",", " , ", "", ",,"])
def test_empty_method_string_is_rejected(text):
    msg = _raises("algorithms", "no algorithm named", algorithms=text)
    assert "available" in msg and "fedavg" in msg


def test_default_empty_tuple_means_the_default_methods():
    assert ExperimentConfig().method_names == default_algorithms()
    assert default_algorithms()[:6] == (
        "local",
        "fedavg",
        "fedprox",
        "perfedavg",
        "fedamp",
        "pfedwn",
    )
    assert ExperimentConfig(algorithms=" fedavg, local ").algorithms == ("fedavg", "local")


def test_toml_and_cli_empty_method_list(tmp_path, capsys):
    toml = 'algorithms = ","\n'
    _toml_and_cli_fail(tmp_path, capsys, toml, ["--algorithms", ","], "no algorithm named")


# ------------------------------------------------------------------------ 5. arrays, channel
@pytest.mark.parametrize("value", [[0.1], np.array([0.1, 0.2]), np.array([0.1]), (0.1,)])
def test_array_for_a_scalar_field_is_rejected(value):
    _raises("eps", eps=value)


@pytest.mark.parametrize(
    ("channel", "field"),
    [
        ({"bogus": 1.0}, "channel.bogus"),
        ({"area_m": -1.0}, "channel.area_m"),
        ({"area_m": "50"}, "channel.area_m"),
        ({"area_m": [50.0, 60.0]}, "channel.area_m"),
        ({"num_subchannels": 2.5}, "channel.num_subchannels"),
        ({"num_subchannels": 0}, "channel.num_subchannels"),
        ({"tx_power_w": True}, "channel.tx_power_w"),
        ([("area_m", 50.0)], "channel"),
    ],
)
def test_bad_channel_override_names_the_key(channel, field):
    _raises(field, channel=channel)


def test_channel_overrides_are_stored_normalised(tmp_path, capsys):
    cfg = ExperimentConfig(channel={"num_subchannels": 20.0, "area_m": 60})
    assert cfg.channel == {"num_subchannels": 20, "area_m": 60.0}
    assert type(cfg.channel["num_subchannels"]) is int and type(cfg.channel["area_m"]) is float
    path = tmp_path / "c.toml"
    path.write_text("eps = [0.1]\n[channel]\nnum_subchannels = 20\n")
    with pytest.raises(ValueError, match="eps must be a number"):
        ExperimentConfig.from_toml(path)
    path.write_text("[channel]\nbogus = 1\n")
    line = _cli_error(capsys, ["run", "--config", str(path), "--out", str(tmp_path / "o")])
    assert "channel.bogus" in line


# ------------------------------------------------------------------------ 6. property tests
HUGE = st.integers(min_value=2**63 - 10, max_value=2**80) | st.integers(max_value=-(2**63))
ANY_VALUE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | HUGE
    | st.floats()
    | st.sampled_from([math.inf, -math.inf, math.nan, 2.0, 0.5])
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
FIELDS = sorted(ExperimentConfig.field_names())


def _assert_stored_normalised(field: str, given_value, stored) -> None:
    """A value that passed validation is stored as a plain, valid Python value."""
    if stored is None:
        assert given_value is None and field in OPTIONAL
    elif field in INT_FIELDS:
        low, high = INT_FIELDS[field]
        assert type(stored) is int and low <= stored <= high and stored == given_value
    elif field in FLOAT_FIELDS:
        assert type(stored) is float and math.isfinite(stored) and stored == float(given_value)
    elif field in CHOICE_FIELDS or field in ("dataset", "data_dir"):
        assert type(stored) is str and stored == given_value
    elif field == "target":
        assert stored == "random" or (type(stored) is int and stored == given_value)
    elif field == "node_density":  # optional float
        assert type(stored) is float and 0 < stored < math.inf and stored == float(given_value)
    elif field == "fading_param":  # optional float; its range depends on `fading`
        assert type(stored) is float and math.isfinite(stored) and stored == float(given_value)
    elif field == "deadline_s":  # a positive float or inf (None: inf)
        assert type(stored) is float and stored > 0
    elif field == "device_profiles":
        assert type(stored) is tuple and stored and all(type(p) is str for p in stored)
    elif field in ("selection", "stale", "cost"):
        assert type(stored) is bool and stored == given_value
    elif field == "algorithms":
        assert type(stored) is tuple and all(a in available_algorithms() for a in stored)
    else:  # hparams, channel: plain dicts
        assert type(stored) is dict


@FAST
@given(field=st.sampled_from(FIELDS), value=ANY_VALUE)
def test_any_value_for_any_field_is_stored_normalised_or_a_value_error(field, value):
    try:
        cfg = ExperimentConfig(**{field: value})
    except ValueError as e:
        assert field in str(e)
        return
    _assert_stored_normalised(field, value, getattr(cfg, field))


WRONG_NUMBER = (
    st.text(max_size=6)
    | st.booleans()
    | st.lists(st.floats(0.1, 0.9), min_size=1, max_size=3)
    | st.dictionaries(st.text(max_size=3), st.integers(), min_size=1, max_size=2)
    | st.sampled_from([math.inf, -math.inf, math.nan])
    | st.builds(np.array, st.lists(st.floats(0.1, 0.9), min_size=2, max_size=3))
)
WRONG_INT = WRONG_NUMBER | st.floats(0.01, 1e6).filter(lambda x: not x.is_integer()) | HUGE


@FAST
@given(field=st.sampled_from(sorted(INT_FIELDS)), value=WRONG_INT)
def test_wrong_integer_is_a_value_error_naming_the_field(field, value):
    _raises(field, **{field: value})


@FAST
@given(field=st.sampled_from(sorted(FLOAT_FIELDS)), value=WRONG_NUMBER | st.none())
def test_wrong_float_is_a_value_error_naming_the_field(field, value):
    _raises(field, **{field: value})


@st.composite
def valid_int(draw, field: str):
    low, high = INT_FIELDS[field]
    high = min(high, 2**53)  # exactly representable as a float too
    x = draw(st.integers(low, high))
    return x, draw(st.sampled_from([x, float(x), np.int64(x), np.float64(x)]))


@FAST
@given(data=st.data(), field=st.sampled_from(sorted(INT_FIELDS)))
def test_valid_integer_is_stored_as_int(data, field):
    x, given_value = data.draw(valid_int(field))
    stored = getattr(ExperimentConfig(**{field: given_value}), field)
    assert type(stored) is int and stored == x


@FAST
@given(data=st.data(), field=st.sampled_from(sorted(FLOAT_FIELDS)))
def test_valid_float_is_stored_as_float(data, field):
    low, high, low_inc, high_inc = FLOAT_FIELDS[field]
    x = data.draw(
        st.floats(
            low,
            min(high, 1e300),
            exclude_min=not low_inc,
            exclude_max=not high_inc,
            allow_nan=False,
        )
    )
    given_value = data.draw(st.sampled_from([x, np.float64(x)]))
    stored = getattr(ExperimentConfig(**{field: given_value}), field)
    assert type(stored) is float and stored == x


@FAST
@given(pair=st.sampled_from(HPARAM_FIELDS), value=ANY_VALUE)
def test_any_hparam_value_is_stored_normalised_or_a_value_error(pair, value):
    alg, field = pair
    default = getattr(get_algorithm(alg).hparams(), field)
    try:
        cfg = ExperimentConfig(hparams={alg: {field: value}})
    except ValueError as e:
        assert f"hparams.{alg}.{field}" in str(e)
        return
    stored = cfg.hparams[alg][field]
    assert type(stored) is type(default) and stored == type(stored)(value)
    assert getattr(cfg.hparams_for(alg), field) == stored


@FAST
@given(key=st.sampled_from(sorted(CHANNEL_DEFAULTS)) | st.text(max_size=5), value=ANY_VALUE)
def test_any_channel_override_is_stored_normalised_or_a_value_error(key, value):
    try:
        cfg = ExperimentConfig(channel={key: value})
    except ValueError as e:
        assert f"channel.{key}" in str(e)
        return
    stored = cfg.channel[key]
    assert type(stored) is type(CHANNEL_DEFAULTS[key]) and stored == type(stored)(value)


TOML_VALUE = st.recursive(
    st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()
    | st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text("abcxyz", min_size=1, max_size=3), inner, max_size=2)
    ),
    max_leaves=5,
)


@FAST
@given(field=st.sampled_from(FIELDS), value=TOML_VALUE)
def test_toml_loader_stores_normalised_or_raises_value_error(tmp_path_factory, field, value):
    path = tmp_path_factory.mktemp("toml") / "c.toml"
    path.write_text(f"{field} = {_toml(value)}\n")
    try:
        cfg = ExperimentConfig.from_toml(path)
    except ValueError:
        return
    _assert_stored_normalised(field, value, getattr(cfg, field))


@st.composite
def invalid_toml(draw):
    """A TOML line that sets one field to a value the config must reject."""
    field = draw(st.sampled_from(sorted(INT_FIELDS) + sorted(FLOAT_FIELDS)))
    wrong = WRONG_NUMBER.filter(lambda v: not isinstance(v, np.ndarray))
    if field in INT_FIELDS:
        wrong = wrong | st.floats(0.01, 1e6).filter(lambda x: not x.is_integer())
        wrong = wrong | st.integers(INT_FIELDS[field][1] + 1, 2**63 - 1)
    return f"{field} = {_toml(draw(wrong))}\n"


@CLI_FAST
@given(line=invalid_toml())
def test_cli_config_file_with_a_bad_value_exits_2(tmp_path_factory, capsys, line):
    path = tmp_path_factory.mktemp("cli") / "c.toml"
    path.write_text(line)
    _cli_error(capsys, ["run", "--config", str(path), "--out", str(path.parent / "o")])


@CLI_FAST
@given(
    flag=st.sampled_from(["--lr", "--eps"]),
    text=st.sampled_from(["inf", "-inf", "nan", "1e999", "-1", "0", "1.5"]),
    algorithms=st.text(", ", min_size=1, max_size=4),
)
def test_cli_bad_flags_exit_2(tmp_path_factory, capsys, flag, text, algorithms):
    out = str(tmp_path_factory.mktemp("cli") / "o")
    if flag == "--lr" and text == "1.5":
        text = "-1.5"  # an lr of 1.5 is valid; this test only sends bad values
    _cli_error(capsys, ["run", f"{flag}={text}", "--out", out])  # "=": argparse and "-inf"
    _cli_error(capsys, ["run", "--algorithms", algorithms, "--out", out])


@pytest.mark.parametrize(
    "argv, match",
    [
        (["run", "--rounds", "2.5"], "--rounds"),
        (["run", "--bogus-flag"], "--bogus-flag"),
        (["neighbors", "--seed", "x"], "--seed"),
        (["no-such-command"], "no-such-command"),
    ],
)
def test_cli_usage_errors_are_one_line(capsys, argv, match):
    line = _cli_error(capsys, argv)
    assert match in line and "--help" in line
