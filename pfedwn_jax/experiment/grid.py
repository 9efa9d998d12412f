"""The runs of a sweep: seeds, a grid of swept values, and the config of each run.

A sweep is one base `ExperimentConfig`, a list of seeds and a grid: a mapping from swept keys
to lists of values. A key is a config field (`"lr"`, `"eps"`, `"topology_seed"`, ...; see
`GRID_FIELDS`) or `"<method>.<field>"`, a hyperparameter of one of the methods run
(`"pfedwn.a"`, `"fedprox.mu"`). `expand` lists the runs (`RunSpec`s) and validates each run's
config on the host, so a bad key or value fails before anything is compiled; `run_config`
gives one run's config, a plain `ExperimentConfig`: `run(run_config(config, spec))` is that
run on its own.

A key belongs to what it sets (`key_method`): `"<method>.<field>"` concerns that method
alone, a config field every method. A method runs at the grid points that differ in the keys
that concern it, once per seed: a sweep of `{"pfedwn.a": [0.3, 0.7]}` over local, fedavg and
pfedwn runs pfedwn at both values and the others once (at the first point, where the other
keys take their first values). A run (`RunSpec`) names the methods it runs; a grid point that
runs none is no run.

Seeds. Each run sets `seed` (model initialisation and local batch order) to its own seed; the
base config's `seed` is ignored. Of the two other seeds:

- `data_seed` follows the run's seed when it is None (the default): every seed then draws its
  own partition and train/test split. A `data_seed` set in the config, or swept in the grid,
  is fixed: every seed of a grid point trains on the same data.
- `topology_seed` never follows the run's seed (default 0): every run of a sweep places the
  same network (same neighbors, same selection) unless `topology_seed` is in the grid.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from pfedwn_jax._checks import check_bool, check_seed
from pfedwn_jax.algorithms import get_algorithm
from pfedwn_jax.experiment.config import ExperimentConfig

# The config fields a grid may sweep: the knobs of one experiment's training, data split,
# wireless selection, links during training and mobility (a value that changes the program,
# such as the link model, groups its runs into another program). Not sweepable: `seed` (the
# `seeds` argument), `algorithms` and `hparams` (the methods run; their hyperparameters are
# swept as "<method>.<field>"), `rounds` (the runs of a sweep share one round axis), and what
# defines the experiment itself rather than a setting of it: `dataset`, `data_dir`, `model`,
# `mode`, `num_neighbors`, `channel` (but for `CHANNEL_GRID_KEYS`).
GRID_FIELDS = (
    "lr",
    "momentum",
    "local_epochs",
    "local_steps",
    "batch_size",
    "partition",
    "alpha",
    "classes_per_client",
    "pool",
    "min_samples",
    "max_samples_per_client",
    "train_frac",
    "val_fraction",
    "data_seed",
    "eps",
    "gamma_th",
    "moments",
    "fading",
    "fading_param",
    "shadowing_db",
    "topology_seed",
    "target",
    "selection",
    "link_model",
    "link_failure",
    "stale",
    "mobility",
    "speed",
    "round_seconds",
    "reselect_every",
    "cost",
    "rate_model",
    "reception",
    "rate_efficiency",
    "retries",
    "header_bits",
    "deadline_s",
    "bits_per_param",
    "device_distribution",
)

# The channel's numbers a grid may sweep, as "channel.<field>" (merged into the config's
# `channel` overrides): the transmit power and bandwidth are leaves of a run's program.
CHANNEL_GRID_KEYS = ("channel.tx_power_w", "channel.bandwidth_hz")

# Most runs (and seeds) one sweep may describe: every run's config is validated on the host.
MAX_RUNS = 100_000

_RANGE = re.compile(r"^(\d+)\s*-\s*(\d+)$")
_INT = re.compile(r"^[+-]?\d+$")


class RunSpec(NamedTuple):
    """One run of a sweep: its position in the sweep, its seed and its swept values.

    `values` maps each grid key to this run's value, normalised as the config stores it
    (`{"lr": 0.05, "pfedwn.a": 0.3}`); empty when nothing but the seed is swept. `methods`:
    the methods this run runs, in the config's order (empty: all of the config's).
    """

    # shadows `tuple.index`; a public field name older than the type check
    index: int  # type: ignore[assignment]
    seed: int
    values: dict[str, Any]
    methods: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------- seeds
def parse_seeds(spec: str | int | Sequence[int]) -> tuple[int, ...]:
    """The seeds of `spec`, in order: `"0-15"` (inclusive: 16 seeds), `"0,3,7"`, `"0-3,8"`,
    `"5"`, an int (that one seed) or a sequence of ints.

    Each seed is checked with `check_seed`; no seeds, a repeated seed, an empty range or more
    than `MAX_RUNS` seeds is a ValueError.
    """
    if isinstance(spec, str):
        seeds = [s for part in spec.split(",") for s in _seed_item(part.strip(), spec)]
    elif isinstance(spec, Sequence | np.ndarray):
        if len(spec) > MAX_RUNS:
            raise ValueError(f"seeds: {len(spec)} seeds; at most {MAX_RUNS}")
        seeds = [check_seed(f"seeds[{i}]", s) for i, s in enumerate(list(spec))]
    else:
        seeds = [check_seed("seeds", spec)]
    if not seeds:
        raise ValueError(f"seeds: no seed in {spec!r}; e.g. '0-15', '0,3,7' or '5'")
    if len(seeds) > MAX_RUNS:
        raise ValueError(f"seeds: {spec!r} gives {len(seeds)} seeds; at most {MAX_RUNS}")
    seen: set[int] = set()
    for s in seeds:
        if s in seen:
            raise ValueError(f"seeds: seed {s} appears twice in {spec!r}; each seed runs once")
        seen.add(s)
    return tuple(seeds)


def _seed_item(item: str, spec: str) -> list[int]:
    """The seeds of one comma-separated item of `spec`: `"5"` or an inclusive range `"0-15"`."""
    match = _RANGE.match(item)
    if match is None:
        if not _INT.match(item):
            raise ValueError(
                f"seeds: {item!r} in {spec!r} is neither a seed nor a range low-high "
                "(e.g. '0-15', '0,3,7' or '5')"
            )
        return [check_seed("seeds", int(item))]
    low, high = (check_seed("seeds", int(g)) for g in match.groups())
    if low > high:
        raise ValueError(f"seeds: range {item!r} is empty ({low} > {high}); write low-high")
    if high - low + 1 > MAX_RUNS:
        raise ValueError(f"seeds: range {item!r} has {high - low + 1} seeds; at most {MAX_RUNS}")
    return list(range(low, high + 1))


# ------------------------------------------------------------------------------ grid keys
def grid_keys(config: ExperimentConfig) -> tuple[str, ...]:
    """The keys a grid over `config` may sweep: `GRID_FIELDS`, then `"<method>.<field>"` for
    every hyperparameter of every method in `config.method_names` (in that order)."""
    methods = tuple(
        f"{m}.{f.name}"
        for m in config.method_names
        for f in dataclasses.fields(get_algorithm(m).hparams)
    )
    return GRID_FIELDS + CHANNEL_GRID_KEYS + methods


def key_method(key: str) -> str | None:
    """The method grid key `key` belongs to (`"pfedwn.a"` -> `"pfedwn"`), or None for a
    config field or a `"channel.<field>"`, which concern every method."""
    method, dot, _ = key.partition(".")
    return method if dot and method != "channel" else None


def concerns(key: str, method: str) -> bool:
    """Whether grid key `key` changes what `method` computes (see the module doc)."""
    return key_method(key) in (None, method)


def _check_key(config: ExperimentConfig, key: Any) -> None:
    """ValueError naming `key` and the allowed keys unless `key` is one of `grid_keys`."""
    allowed = grid_keys(config)
    if isinstance(key, str) and key in allowed:
        return
    hint = ""
    if key == "seed":
        hint = " (seeds are their own argument: seeds=/--seeds, not a grid key)"
    elif key in ("algorithms", "methods"):
        hint = " (the methods are the config's `algorithms`)"
    elif isinstance(key, str) and "." in key:
        hint = f" (methods run: {list(config.method_names)})"
    raise ValueError(f"grid: unknown key {key!r}{hint}; allowed: {list(allowed)}")


# ------------------------------------------------------------------------------ run config
def run_config(config: ExperimentConfig, spec: RunSpec) -> ExperimentConfig:
    """The config of run `spec`: `seed=spec.seed`, swept fields replaced, `"<method>.<field>"`
    of a method the run runs merged into `config.hparams[method]` (other overrides kept), and
    `algorithms` the run's `methods` where they are fewer than the config's. Validated as
    any config."""
    fields: dict[str, Any] = {}
    hparams = {m: dict(h) for m, h in config.hparams.items()}
    methods = spec.methods or config.method_names
    for key, value in spec.values.items():
        _check_key(config, key)
        method, dot, name = key.partition(".")
        if not dot:
            fields[key] = value
        elif method == "channel":
            fields["channel"] = {**fields.get("channel", config.channel), name: value}
        elif method in methods:
            hparams.setdefault(method, {})[name] = value
    if hparams != config.hparams:
        fields["hparams"] = hparams
    if tuple(methods) != config.method_names:
        fields["algorithms"] = tuple(methods)
    return config.replace(seed=spec.seed, **fields)


def _stored(config: ExperimentConfig, key: str) -> Any:
    """The value of grid key `key` as `config` holds it (normalised by its validation)."""
    method, dot, name = key.partition(".")
    if method == "channel":
        return config.channel[name]
    return getattr(config.hparams_for(method), name) if dot else getattr(config, key)


# ---------------------------------------------------------------------------------- expand
def expand(
    config: ExperimentConfig,
    seeds: str | int | Sequence[int],
    grid: Mapping[str, Sequence[Any]] | None = None,
    *,
    zip: bool = False,  # the sweep API's name; the builtin is not needed here
) -> tuple[RunSpec, ...]:
    """The runs of a sweep, in order: the product of the grid's lists (first key outermost)
    and `seeds` (`parse_seeds`), seeds innermost. `zip=True` pairs the lists position by
    position instead (equal lengths). Each run runs the methods for which its grid point is
    the first with its values of the keys that concern them (`concerns`); points that run
    no method are left out. Every run's config is validated here (see module doc).

    Raises ValueError for an unknown key (naming it and the allowed keys), a value that is not
    a non-empty list, a value the config rejects (naming `grid[<key>]` and the value), a
    combination the config rejects (naming the grid point) and a repeated grid point.
    """
    zip = check_bool("zip", zip)
    seeds = parse_seeds(seeds)
    raw = _raw_lists(config, grid)
    lengths = [len(v) for v in raw.values()]
    num_points = (max(lengths, default=1) if zip else math.prod(lengths)) or 1
    if num_points * len(seeds) > MAX_RUNS:  # before any value is checked or point listed
        raise ValueError(
            f"a sweep of {num_points} grid point(s) x {len(seeds)} seed(s) = "
            f"{num_points * len(seeds)} runs; at most {MAX_RUNS}"
        )
    lists = _checked_lists(config, raw, paired=zip)
    points = _points(lists, paired=zip)
    for point in points:  # combinations (seeds are checked; they cannot make a point invalid)
        try:
            run_config(config, RunSpec(0, seeds[0], point))
        except ValueError as e:
            raise ValueError(f"grid point {point}: {e}") from None
    methods = point_methods(config, points)
    runs = [(p, methods[i]) for i, p in enumerate(points) if methods[i]]
    return tuple(
        RunSpec(i, s, dict(p), m) for i, ((p, m), s) in enumerate(itertools.product(runs, seeds))
    )


def point_methods(
    config: ExperimentConfig, points: Sequence[Mapping[str, Any]]
) -> list[tuple[str, ...]]:
    """Per grid point, the methods run there: each method at the first point with each
    combination of the values of the keys that concern it (`concerns`)."""
    seen: set[tuple] = set()
    out = []
    for point in points:
        here = []
        for m in config.method_names:
            own = (m, *((k, v) for k, v in point.items() if concerns(k, m)))
            if own not in seen:
                seen.add(own)
                here.append(m)
        out.append(tuple(here))
    return out


def _raw_lists(
    config: ExperimentConfig, grid: Mapping[str, Sequence[Any]] | None
) -> dict[str, list[Any]]:
    """`grid` with known keys, each value a non-empty list (values not checked yet: the
    number of runs is capped first, so a huge list is refused at once)."""
    if grid is None:
        return {}
    if not isinstance(grid, Mapping):
        raise ValueError(
            f"grid must map keys to lists of values, e.g. {{'lr': [0.01, 0.05]}}; got {grid!r}"
        )
    lists = {}
    for key, values in grid.items():
        _check_key(config, key)
        if isinstance(values, np.ndarray) and values.ndim == 1:
            values = values.tolist()
        if isinstance(values, str | bytes) or not isinstance(values, Sequence):
            raise ValueError(f"grid[{key}] must be a list of values; got {_short(values)}")
        if not values:
            raise ValueError(f"grid[{key}] must be a non-empty list of values; got {values!r}")
        lists[key] = list(values)
    return lists


def _short(value: Any, limit: int = 200) -> str:
    """`repr(value)`, cut to `limit` characters (a grid list may hold a million values)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + " ...]"


def _checked_lists(
    config: ExperimentConfig, lists: dict[str, list[Any]], *, paired: bool
) -> dict[str, list[Any]]:
    """`lists` (from `_raw_lists`) with every value checked alone and normalised (`2` -> `2.0`
    for a float field), in time linear in the values; a repeated value of one list is an
    error unless the lists are paired."""
    checked = {}
    for key, values in lists.items():
        checked[key] = [_checked_value(config, key, v) for v in values]
        repeated = _first_repeat(checked[key])
        if repeated is not None and not paired:
            raise ValueError(f"grid[{key}] repeats the value {repeated[0]!r}; got {_short(values)}")
    return checked


def _checked_value(config: ExperimentConfig, key: str, value: Any) -> Any:
    """`value` as the config stores it at `key`; ValueError naming `grid[key]` and `value`."""
    try:
        return _stored(run_config(config, RunSpec(0, config.seed, {key: value})), key)
    except ValueError as e:
        raise ValueError(f"grid[{key}]: value {value!r} is not allowed: {e}") from None


def _points(lists: dict[str, list[Any]], *, paired: bool) -> list[dict[str, Any]]:
    """The grid points (`key -> value` dicts): the lists' product, or zipped when `paired`."""
    keys = list(lists)
    if not paired:
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*lists.values())]
    lengths = {k: len(v) for k, v in lists.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"grid: zip=True pairs the lists, so they need one length; got {lengths}")
    points = [dict(zip(keys, combo, strict=True)) for combo in zip(*lists.values(), strict=True)]
    repeated = _first_repeat([tuple(p.items()) for p in points])
    if repeated is not None:
        raise ValueError(
            f"grid: the point {dict(repeated[0])} appears twice (zip=True pairs the lists)"
        )
    return points or [{}]


def _first_repeat(items: list[Any]) -> tuple[Any] | None:
    """`(item,)` for the first item equal to an earlier one, else None (items hashable)."""
    seen: set[Any] = set()
    for item in items:
        if item in seen:
            return (item,)
        seen.add(item)
    return None


# ------------------------------------------------------------------------------------ CLI
def parse_grid_arg(text: str) -> tuple[str, list[Any]]:
    """A command-line `KEY=V1,V2,...` as `(key, values)`: `"lr=0.01,0.05"` -> `("lr", [0.01,
    0.05])`. Integers and floats become numbers, true/false booleans, anything else a string."""
    key, sep, rest = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"--grid takes KEY=V1,V2,... (e.g. lr=0.01,0.05); got {text!r}")
    items = [v.strip() for v in rest.split(",")]
    if not all(items):
        raise ValueError(f"--grid {key}: an empty value in {rest!r}; give V1,V2,...")
    return key, [_scalar(v) for v in items]


def _scalar(text: str) -> Any:
    """`"3"` -> 3, `"0.5"`/`"1e-3"` -> float, `"true"`/`"false"` -> bool, else the text."""
    if _INT.match(text):
        return int(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return float(text)  # "nan"/"inf" too: the config's checks reject them by name
    except ValueError:
        return text
