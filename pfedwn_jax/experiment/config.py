"""`ExperimentConfig`: everything that defines one experiment, validated on construction.

A config is a frozen dataclass of plain values (JSON/TOML friendly). Every field is checked
in `__post_init__` with a message naming the field, so a bad config fails before any data is
loaded or anything is compiled. Checks that need the data (does the model fit the images?)
run in `run()` right after loading the data, still before compilation.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pfedwn_jax._checks import (
    INT32_MAX,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_seed,
    set_fields,
    split_list,
)
from pfedwn_jax.algorithms import (
    available_algorithms,
    default_algorithms,
    get_algorithm,
    make_hparams,
)
from pfedwn_jax.data.federate import POOLS
from pfedwn_jax.data.partition import ALL_SCHEMES
from pfedwn_jax.experiment.cost_config import check_cost
from pfedwn_jax.models import available_models
from pfedwn_jax.wireless import (
    FADING_KINDS,
    LINK_MODELS,
    MOMENT_MODES,
    ChannelParams,
    eps_ceiling_message,
)
from pfedwn_jax.wireless.params import CHANNEL_OVERRIDES, channel_params_from

log = logging.getLogger("pfedwn_jax")

MODES = ("single", "network")
# the cap of `pfedwn neighbors`: a network-wide run holds [S, S] matrices of S = n + 1 clients
MAX_NEIGHBORS = 10_000
#: Network size with candidate lists (`candidates`): nothing is [N, N] any more.
MAX_SPARSE_NODES = 1_000_000
TAILS = ("mean", "none")
#: Node mobility during training (`wireless.mobility`).
MOBILITY = ("none", "waypoint", "gaussian")
RECORD_DTYPES = ("float32", "float16")


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """One experiment: data, model, methods, training and the wireless network.

    Data:
      dataset: dataset name for `pfedwn_jax.data.load_dataset`, built in or given to arrays
        with `register_dataset` (None: the embedded MNIST default `DEFAULT_DATASET`).
      data_dir: directory for TFDS datasets (None: TFDS's default).
      partition: partition scheme for `make_federated`, one of "paper" (the paper's non-IID,
        unbalanced split), "dirichlet", "pathological", "iid" or "natural" (one client per
        writer of a naturally federated dataset, e.g. FEMNIST; needs writer ids).
      alpha: Dirichlet concentration for the Dirichlet-type schemes.
      train_frac: per-client train share (the paper: 0.75).
      data_seed: seed of the partition and of each client's train/test split (None: `seed`).
      pool: samples the partition splits: "union" of the dataset's train and test splits
        (default; as PFLlib, which the paper cites for its setup, does) or "train" only.
      classes_per_client: "paper": each client draws its number of classes from
        U{1..classes_per_client} (None: U{1..C}, the paper); "pathological": exactly this
        many (None: 2); must be None for the other schemes.
      val_fraction: share of each client's training samples held out as a validation split,
        in [0, 1) (0: none, the default). The runner then records the validation accuracy per
        round (`client_val_accuracy [R][S]` and the metric `target_val_accuracy` of each
        method's entry) for choosing hyperparameters.
      max_samples_per_client: if set, a client with more samples keeps a random subset of
        this many (changes the data; bounds the padded per-client arrays). None: all.

    Model and methods:
      model: "cnn", "resnet18", "mlp", "logreg" or a name given with `register_model`.
        Default "mlp" so the default run (the demo) fits its 5-minute CPU budget; the paper
        used the CNN for MNIST (`cnn`).
      algorithms: registered algorithm names to run, in order (empty: the paper's six and any
        algorithm a user registered: `pfedwn_jax.algorithms.default_algorithms()`).
      hparams: per-algorithm hyperparameter overrides, `{"fedprox": {"mu": 0.1}}`.

    Training:
      rounds: communication rounds (>= 1).
      local_epochs: local epochs per round (the paper: 1).
      local_steps: if set, local SGD steps per round instead of epochs.
      batch_size: local minibatch size.
      lr: SGD learning rate (> 0).
      momentum: SGD momentum in [0, 1) (0: plain SGD; momentum state stays local).
      seed: seed of model initialisation and of local batch order (same for every method).

    Wireless network:
      mode: "single" (one target and its selected neighbors train, the paper's setting) or
        "network" (every client is a target with its own selected neighbors).
      num_neighbors: neighbors around the target; the network has `num_neighbors + 1`
        clients and the partition as many data clients.
      gamma_th: SINR threshold (linear) of the error probability.
      eps: selection threshold in (0, 1): neighbor m is selected if P_err < eps.
      moments: moment mode of `error_probability`: "paper" (App. A as printed), "exact" or
        "physical" (see docs/wireless.md).
      topology_seed: seed of the node placement.
      target: data client index of the target (0..num_neighbors) or "random" (drawn from
        the topology seed). Ignored in network mode (every client is a target).
      channel: overrides of `ChannelParams` numbers, e.g. `{"num_subchannels": 20}`
        (`wireless.params.CHANNEL_OVERRIDES`; "fading_gamma" is Gamma = E[h^2]).
      fading: small-scale fading model: "rayleigh" (the paper's), "nakagami" or "rician"
        (`wireless.fading`; docs/wireless.md "Fading models").
      fading_param: its shape: Nakagami m >= 0.5 or Rician K in [0, 30] (linear); None: the
        value at which the model is Rayleigh (m = 1, K = 0). Runs that differ only in it
        share one compiled program.
      shadowing_db: standard deviation (dB) of log-normal shadowing of the path loss, drawn
        per link from the topology seed (0: none): the same value in the selection's P_err,
        the per-round physical draws and a moving network's P_err (a pair keeps its value as
        the nodes move). With `candidates` the lists are the nearest nodes (by distance,
        not by shadowed power) and a mean-field interference tail averages the shadowing.

    Large networks (network mode; see docs/wireless.md "Large networks"):
      min_samples: samples every client gets at least (default 20, the partitions' own);
        10,000 clients of full MNIST (70,000 samples) need 7 or fewer.
      node_density: nodes per m^2; the square area's side becomes `sqrt(clients / density)`
        (overrides `channel.area_m`), so a larger network covers a larger area. None: the
        channel's area (50 m, Table I).
      candidates: each node's candidate links are its `candidates` nearest nodes (selection
        `P_err < eps` among them); None: every other node (the dense model, <= 10,000 nodes).
      interference_cutoff: metres; only nodes this close to a receiver interfere (the rest as a
        mean field with `interference_tail="mean"`, or dropped with "none"); None: every node.
      interference_tail: "mean" or "none" (see `interference_cutoff`).

    Records (docs/experiments.md "Records"):
      record_every: keep the per-client rows (client accuracy and loss, pFedWN's pi, ...)
        every this many rounds and at the last round; target accuracy and the client-accuracy
        mean and quantiles are kept every round.
      record_dtype: "float32" or "float16": floats in the `.npz` of a network-mode result.

    Links during training (docs/robustness.md):
      link_model: "ideal" (every selected neighbor's model arrives every round), "bernoulli"
        (each link fails independently every round with its P_err, or `link_failure`) or
        "physical" (block fading and interference redrawn every round, `wireless.links`).
      link_failure: a fixed failure probability in [0, 1] of every link for "bernoulli"
        (None: each link's own P_err).
      selection: channel-aware neighbor selection `P_err < eps` (True, the paper); False:
        every neighbor in range trains together (every candidate in network mode), so
        selection can be compared with no selection under the same link model.
      stale: when a link fails, the target uses the last model it received over that link
        (its age recorded as `link_age`) instead of dropping it; needs a lossy `link_model`.
        Memory: K models per slot (the cache). Not in sweeps.

    Mobility during training (docs/robustness.md; dense networks, not in sweeps):
      mobility: "none", "waypoint" (random waypoint) or "gaussian" (Gaussian random walk):
        nodes move between rounds inside the area; single mode then trains every client.
      speed: node speed in m/s (>= 0; the RMS speed of the Gaussian walk).
      round_seconds: seconds of movement per round (> 0).
      reselect_every: re-select neighbors (`P_err < eps` at the current positions, at most
        the initial list width) every this many rounds; 0: never.

    Cost of a round (docs/wireless.md "The cost of a round"; off by default):
      cost: count every round's bits, airtime, energy and simulated clock (the outputs
        `bits_sent`, `airtime_s`, `energy_j`, `clock_s`); ARQ retries and the deadline then
        decide which models arrive. Works with every `link_model` ("ideal" included).
      rate_model: "threshold" (each link at the Shannon rate of `gamma_th` on its
        sub-channel), "shannon" (at the Shannon rate of its SINR) or "mcs" (the 802.11ax MCS
        its SINR meets); the last two need link_model="physical" (the round's SINR draw).
      reception: "parallel" (every link on its own sub-channel) or "serial" (a receiver takes
        its links one at a time).
      rate_efficiency: fraction of the Shannon rate achieved, in (0, 1].
      retries: ARQ retries per link and round (0: one attempt).
      header_bits: bits added to every model sent (per attempt).
      deadline_s: simulated seconds after which a round's late models are dropped (inf, the
        default: no deadline; `to_dict` writes it None, which reads back as inf).
      bits_per_param: bits of each model parameter sent (32: float32).
      device_distribution: "fixed" (every node the first of `device_profiles`), "mix" (each
        node one of them, uniformly) or "lognormal" (the first, its FLOP/s log-normal),
        drawn from the topology seed (`wireless.compute.draw_devices`).
      device_profiles: device names of `wireless.compute.DEVICE_PROFILES`.
    """

    dataset: str | None = None
    data_dir: str | None = None
    partition: str = "paper"
    alpha: float = 0.1
    train_frac: float = 0.75
    data_seed: int | None = None
    pool: str = "union"
    classes_per_client: int | None = None
    val_fraction: float = 0.0
    max_samples_per_client: int | None = None
    model: str = "mlp"
    algorithms: tuple[str, ...] = ()
    hparams: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    rounds: int = 30
    local_epochs: int = 1
    local_steps: int | None = None
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.0
    seed: int = 0
    mode: str = "single"
    num_neighbors: int = 10
    gamma_th: float = 5.0
    eps: float = 0.05
    moments: str = "paper"
    topology_seed: int = 0
    target: int | str = 0
    channel: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    fading: str = "rayleigh"
    fading_param: float | None = None
    shadowing_db: float = 0.0
    min_samples: int = 20
    node_density: float | None = None
    candidates: int | None = None
    interference_cutoff: float | None = None
    interference_tail: str = "mean"
    link_model: str = "ideal"
    link_failure: float | None = None
    selection: bool = True
    stale: bool = False
    mobility: str = "none"
    speed: float = 1.0
    round_seconds: float = 1.0
    reselect_every: int = 0
    record_every: int = 1
    record_dtype: str = "float32"
    cost: bool = False
    rate_model: str = "threshold"
    reception: str = "parallel"
    rate_efficiency: float = 1.0
    retries: int = 0
    header_bits: float = 0.0
    deadline_s: float = math.inf
    bits_per_param: int = 32
    device_distribution: str = "fixed"
    device_profiles: tuple[str, ...] = ("smartphone",)

    def __post_init__(self) -> None:
        # store what was checked, normalised (2.0 -> 2, tuples, plain dicts), so equal configs
        # compare equal, the object stays immutable and no unchecked value reaches JAX
        set_fields(self, **self._checked_fields())

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise ValueError naming the first bad field (no data loading, no compilation)."""
        self._checked_fields()

    def _checked_fields(self) -> dict[str, Any]:
        """Every field checked and normalised; a ValueError names the first bad one."""
        out = _check_data(self)
        out.update(_check_methods(self.model, self.algorithms, self.hparams))
        out.update(_check_training(self))
        out.update(_check_network(self))
        out.update(_check_records(self))
        out.update(check_cost(self))
        _note_eps_ceiling(out["eps"], out["moments"], out, out["selection"])
        return out

    # ------------------------------------------------------------------ derived values
    @property
    def num_clients(self) -> int:
        """Clients in the network (= data clients of the partition): target + neighbors."""
        return self.num_neighbors + 1

    @property
    def method_names(self) -> tuple[str, ...]:
        """The algorithms to run (`default_algorithms()` when `algorithms` is empty)."""
        return self.algorithms or default_algorithms()

    def hparams_for(self, alg: str) -> Any:
        """The validated hyperparameter dataclass of algorithm `alg`."""
        return make_hparams(get_algorithm(alg), self.hparams.get(alg, {}))

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-friendly dict (tuples as lists, no infinities)."""
        out = dataclasses.asdict(self)
        out["algorithms"] = list(self.algorithms)
        out["device_profiles"] = list(self.device_profiles)
        out["deadline_s"] = None if math.isinf(self.deadline_s) else self.deadline_s  # JSON
        return out

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExperimentConfig:
        """Build from a dict; unknown keys are a ValueError listing the allowed ones."""
        if not isinstance(data, Mapping):
            raise ValueError(f"config must be a table of ExperimentConfig fields; got {data!r}")
        unknown = sorted(set(data) - set(cls.field_names()), key=str)
        if unknown:
            raise ValueError(
                f"config: unknown field(s) {unknown}; allowed: {list(cls.field_names())}"
            )
        return cls(**dict(data))

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> ExperimentConfig:
        """Read a TOML file (top-level keys = field names; `[hparams.fedprox]` tables).

        `overrides` (e.g. from the command line) replace the file's values.
        """
        path = Path(path)
        if path.is_dir():
            raise ValueError(f"config file {path} is a directory; give a TOML file")
        try:
            with path.open("rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ValueError(f"config file not found: {path}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"config file {path} is not valid TOML: {e}") from None
        data.update(overrides)
        return cls.from_dict(data)

    def replace(self, **changes: Any) -> ExperimentConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------- field checks
def _optional_str(name: str, value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{name} must be a non-empty string or None; got {value!r}")
    return value


def _check_data(cfg: ExperimentConfig) -> dict[str, Any]:
    """Checked data fields: dataset, data_dir, partition, alpha, train_frac, data_seed."""
    return {
        "dataset": _optional_str("dataset", cfg.dataset),
        "data_dir": _optional_str("data_dir", cfg.data_dir),
        "partition": check_choice("partition", cfg.partition, ALL_SCHEMES),
        "alpha": check_float("alpha", cfg.alpha, 0.0, low_inclusive=False),
        "train_frac": check_float(
            "train_frac", cfg.train_frac, 0.0, 1.0, low_inclusive=False, high_inclusive=False
        ),
        "data_seed": None if cfg.data_seed is None else check_seed("data_seed", cfg.data_seed),
        "max_samples_per_client": _check_cap(cfg.max_samples_per_client, cfg.min_samples),
        **_check_partition_options(cfg),
    }


def _check_partition_options(cfg: ExperimentConfig) -> dict[str, Any]:
    """Checked pool, classes_per_client (only for the schemes that take it), val_fraction."""
    k = cfg.classes_per_client
    if k is not None:
        k = check_int("classes_per_client", k, 1, INT32_MAX)
        if cfg.partition not in ("paper", "pathological"):
            raise ValueError(
                "classes_per_client applies to partition 'paper' or 'pathological'; got "
                f"partition={cfg.partition!r}"
            )
    return {
        "pool": check_choice("pool", cfg.pool, POOLS),
        "classes_per_client": k,
        "val_fraction": check_float(
            "val_fraction", cfg.val_fraction, 0.0, 1.0, high_inclusive=False
        ),
    }


def _check_cap(cap: Any, min_samples: Any) -> int | None:
    """`max_samples_per_client`: None, or an int >= 2 and >= `min_samples` (when that is one)."""
    if cap is None:
        return None
    cap = check_int("max_samples_per_client", cap, 2, INT32_MAX)
    if isinstance(min_samples, int) and cap < min_samples:
        raise ValueError(
            f"max_samples_per_client={cap} is below min_samples={min_samples}: every client "
            "must keep its minimum; raise it or lower min_samples"
        )
    return cap


def _check_records(cfg: ExperimentConfig) -> dict[str, Any]:
    """Checked record fields: `record_every` in [1, rounds], `record_dtype`."""
    rounds = cfg.rounds if isinstance(cfg.rounds, int) and cfg.rounds >= 1 else INT32_MAX
    return {
        "record_every": check_int("record_every", cfg.record_every, 1, rounds),
        "record_dtype": check_choice("record_dtype", cfg.record_dtype, RECORD_DTYPES),
    }


def check_algorithms(algorithms: Any) -> tuple[str, ...]:
    """Registered, distinct names; a string is split at commas and must name one at least."""
    registered = list(available_algorithms())
    if isinstance(algorithms, str):
        if not algorithms.replace(",", "").strip():
            raise ValueError(
                f"algorithms: no algorithm named in {algorithms!r}; available: {registered}"
            )
        try:
            names = tuple(split_list("algorithms", algorithms, unique=False))
        except ValueError as e:
            raise ValueError(f"{e}; available: {registered}") from None
    elif isinstance(algorithms, list | tuple):
        names = tuple(algorithms)
    else:
        raise ValueError(
            f"algorithms must be a list of names or a comma-separated string; got {algorithms!r}"
        )
    for alg in names:
        if not isinstance(alg, str) or alg not in registered:
            raise ValueError(f"algorithms: unknown algorithm {alg!r}; available: {registered}")
    if len(set(names)) != len(names):
        raise ValueError(f"algorithms must not repeat a name; got {list(names)}")
    return names


def _check_methods(model: Any, algorithms: Any, hparams: Any) -> dict[str, Any]:
    """Checked model, algorithms and hparams (each override stored as its dataclass has it)."""
    registered = list(available_algorithms())
    hparams = {} if hparams is None else hparams
    if not isinstance(hparams, Mapping):
        raise ValueError(
            "hparams must map algorithm names to tables of overrides, e.g. "
            f"{{'fedprox': {{'mu': 0.1}}}}; got {hparams!r}"
        )
    checked = {}
    for alg, overrides in hparams.items():
        if alg not in registered:
            raise ValueError(f"hparams: unknown algorithm {alg!r}; available: {registered}")
        if not isinstance(overrides, Mapping):  # None too: a table is expected
            raise ValueError(
                f"hparams.{alg} must be a table of overrides, e.g. {{'mu': 0.1}}; got {overrides!r}"
            )
        hp = make_hparams(get_algorithm(alg), overrides)
        checked[alg] = {k: getattr(hp, k) for k in overrides}
    return {
        "model": check_choice("model", model, available_models()),
        "algorithms": check_algorithms(algorithms),
        "hparams": checked,
    }


def _check_training(cfg: ExperimentConfig) -> dict[str, Any]:
    """Checked training fields: rounds, epochs/steps, batch size, lr, momentum, seed."""
    steps = cfg.local_steps
    return {
        "rounds": check_int("rounds", cfg.rounds, 1, INT32_MAX),
        "local_epochs": check_int("local_epochs", cfg.local_epochs, 1, INT32_MAX),
        "local_steps": None if steps is None else check_int("local_steps", steps, 1, INT32_MAX),
        "batch_size": check_int("batch_size", cfg.batch_size, 1, INT32_MAX),
        "lr": check_float("lr", cfg.lr, 0.0, low_inclusive=False),
        "momentum": check_float("momentum", cfg.momentum, 0.0, 1.0, high_inclusive=False),
        "seed": check_seed("seed", cfg.seed),
    }


def _check_network(cfg: ExperimentConfig) -> dict[str, Any]:
    """Checked wireless fields: mode, network size, thresholds, topology, target, channel."""
    sparse = cfg.mode == "network" and cfg.candidates is not None
    n = check_int(
        "num_neighbors", cfg.num_neighbors, 1, MAX_SPARSE_NODES if sparse else MAX_NEIGHBORS
    )
    target = cfg.target
    if isinstance(target, str):
        if target != "random":
            raise ValueError(f"target must be an integer in [0, {n}] or 'random'; got {target!r}")
    else:
        target = check_int("target", target, 0, n)
    return {
        "mode": check_choice("mode", cfg.mode, MODES),
        "num_neighbors": n,
        "gamma_th": check_float("gamma_th", cfg.gamma_th, 0.0, low_inclusive=False),
        "eps": check_float("eps", cfg.eps, 0.0, 1.0, low_inclusive=False, high_inclusive=False),
        "moments": check_choice("moments", cfg.moments, MOMENT_MODES),
        "topology_seed": check_seed("topology_seed", cfg.topology_seed),
        "target": target,
        **_check_channel(cfg),
        **_check_large(cfg, n),
        **_check_links(cfg),
    }


def _note_eps_ceiling(
    eps: float, moments: str, checked: Mapping[str, Any], selection: bool
) -> None:
    """Warn (once per setting) when selection is on and `eps` is above the largest P_err of
    the formula: it then selects every neighbor, which is no selection. A warning, not an
    error: a sweep over `eps` may cross the ceiling on purpose."""
    if selection:
        params = channel_params_from(checked["channel"], checked["fading"], checked["fading_param"])
        _warn_once(eps_ceiling_message(eps, params, moments))


@functools.lru_cache(maxsize=64)
def _warn_once(message: str | None) -> None:
    if message is not None:
        log.warning("%s (or selection=False)", message)


def _check_large(cfg: ExperimentConfig, n: int) -> dict[str, Any]:
    """Checked large-network fields (density, candidate lists, interference cutoff)."""
    optional = {
        "node_density": lambda v: check_float("node_density", v, 0.0, low_inclusive=False),
        "candidates": lambda v: check_int("candidates", v, 1, n),
        "interference_cutoff": lambda v: check_float(
            "interference_cutoff", v, 0.0, low_inclusive=False
        ),
    }
    out = {k: None if getattr(cfg, k) is None else f(getattr(cfg, k)) for k, f in optional.items()}
    if cfg.mode != "network":
        for k in ("candidates", "interference_cutoff"):
            if out[k] is not None:
                raise ValueError(f"{k} applies to mode='network' only; got mode={cfg.mode!r}")
    out["min_samples"] = check_int("min_samples", cfg.min_samples, 1, INT32_MAX)
    out["interference_tail"] = check_choice("interference_tail", cfg.interference_tail, TAILS)
    return out


def _check_links(cfg: ExperimentConfig) -> dict[str, Any]:
    """Checked per-round link model and its failure probability."""
    model = check_choice("link_model", cfg.link_model, LINK_MODELS)
    failure = cfg.link_failure
    if failure is not None:
        failure = check_float("link_failure", failure, 0.0, 1.0)
        if model != "bernoulli":
            raise ValueError(
                f"link_failure applies to link_model='bernoulli' only; got link_model={model!r}"
            )
    stale = check_bool("stale", cfg.stale)
    if stale and model == "ideal":
        raise ValueError("stale applies to a lossy link_model ('bernoulli' or 'physical')")
    return {
        "link_model": model,
        "link_failure": failure,
        "selection": check_bool("selection", cfg.selection),
        "stale": stale,
        **_check_mobility(cfg),
    }


def _check_mobility(cfg: ExperimentConfig) -> dict[str, Any]:
    """Checked mobility fields (model, speed, round duration, re-selection period)."""
    mobility = check_choice("mobility", cfg.mobility, MOBILITY)
    return {
        "mobility": mobility,
        "speed": check_float("speed", cfg.speed, 0.0),
        "round_seconds": check_float("round_seconds", cfg.round_seconds, 0.0, low_inclusive=False),
        "reselect_every": check_int("reselect_every", cfg.reselect_every, 0, INT32_MAX),
    }


def _check_channel(cfg: ExperimentConfig) -> dict[str, Any]:
    """Checked channel overrides (known fields, one finite number each, in range), fading model
    and shadowing deviation."""
    channel = {} if cfg.channel is None else cfg.channel
    if not isinstance(channel, Mapping):
        raise ValueError(
            f"channel must map ChannelParams fields to numbers, e.g. "
            f"{{'num_subchannels': 20}}; got {channel!r}"
        )
    defaults = {f.name: f.default for f in dataclasses.fields(ChannelParams)}
    checked = {}
    for key, value in channel.items():
        if key not in CHANNEL_OVERRIDES:
            where = " (a config field of its own)" if key in ("fading", "shadowing_db") else ""
            raise ValueError(
                f"channel.{key}: unknown ChannelParams field{where}; allowed: "
                f"{list(CHANNEL_OVERRIDES)}"
            )
        check = check_int if isinstance(defaults.get(key), int) else check_float
        checked[key] = check(f"channel.{key}", value)
    fading = check_choice("fading", cfg.fading, FADING_KINDS)
    param = cfg.fading_param
    if param is not None:
        param = check_float("fading_param", param)
    shadow = check_float("shadowing_db", cfg.shadowing_db, 0.0)
    try:  # the physical ranges (positive powers, >= 1 sub-channel, m >= 1/2...)
        channel_params_from(checked, fading, param, shadow)
    except ValueError as e:
        msg = str(e).replace("ChannelParams.", "channel.").replace("fading.param", "fading_param")
        raise ValueError(msg.replace("fading.gamma", "channel.fading_gamma")) from None
    return {"channel": checked, "fading": fading, "fading_param": param, "shadowing_db": shadow}
