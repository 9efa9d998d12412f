"""`ExperimentConfig`: everything that defines one experiment, validated on construction.

A config is a frozen dataclass of plain values (JSON/TOML friendly). Every field is checked
in `__post_init__` with a message naming the field, so a bad config fails before any data is
loaded or anything is compiled. Checks that need the data (does the model fit the images?)
run in `run()` right after loading the data, still before compilation.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pfedwn_jax._checks import check_choice, check_int, check_range

MODES = ("single", "network")


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """One experiment: data, model, methods, training and the wireless network.

    Data:
      dataset: dataset name for `pfedwn_jax.data.load_dataset` (None: the embedded MNIST
        default `DEFAULT_DATASET`).
      data_dir: directory for TFDS datasets (None: TFDS's default).
      partition: partition scheme for `make_federated` ("paper" is the paper's non-IID,
        unbalanced split).
      alpha: Dirichlet concentration for the Dirichlet-type schemes.
      train_frac: per-client train share (the paper: 0.75).
      data_seed: seed of the partition and of each client's train/test split (None: `seed`).

    Model and methods:
      model: "cnn", "resnet18", "mlp" or "logreg". Default "mlp" so the default run (the
        demo) fits its 5-minute CPU budget; the paper used the CNN for MNIST (`cnn`).
      algorithms: registered algorithm names to run, in order (empty: every registered one).
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
      channel: overrides of `ChannelParams` fields, e.g. `{"num_subchannels": 20}`.
    """

    dataset: str | None = None
    data_dir: str | None = None
    partition: str = "paper"
    alpha: float = 0.1
    train_frac: float = 0.75
    data_seed: int | None = None
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

    def __post_init__(self) -> None:
        # normalise containers so equal configs compare equal and the object stays immutable
        algs = self.algorithms
        if isinstance(algs, str):
            algs = tuple(a.strip() for a in algs.split(",") if a.strip())
        object.__setattr__(self, "algorithms", tuple(algs))
        object.__setattr__(
            self, "hparams", {str(k): dict(v) for k, v in dict(self.hparams or {}).items()}
        )
        object.__setattr__(self, "channel", dict(self.channel or {}))
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise ValueError naming the first bad field (no data loading, no compilation)."""
        from pfedwn_jax.algorithms import available_algorithms
        from pfedwn_jax.models import available_models
        from pfedwn_jax.wireless import MOMENT_MODES

        for name in ("dataset", "data_dir"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string or None; got {value!r}")
        if not isinstance(self.partition, str) or not self.partition:
            raise ValueError(f"partition must be a non-empty string; got {self.partition!r}")
        check_range("alpha", self.alpha, 0.0, low_inclusive=False)
        check_range(
            "train_frac", self.train_frac, 0.0, 1.0, low_inclusive=False, high_inclusive=False
        )
        if self.data_seed is not None:
            check_int("data_seed", self.data_seed, 0)
        check_choice("model", self.model, available_models())
        registered = available_algorithms()
        for alg in self.algorithms:
            if alg not in registered:
                raise ValueError(
                    f"algorithms: unknown algorithm {alg!r}; available: {list(registered)}"
                )
        if len(set(self.algorithms)) != len(self.algorithms):
            raise ValueError(f"algorithms must not repeat a name; got {list(self.algorithms)}")
        for alg, overrides in self.hparams.items():
            if alg not in registered:
                raise ValueError(
                    f"hparams: unknown algorithm {alg!r}; available: {list(registered)}"
                )
            self._make_hparams(alg, overrides)
        check_int("rounds", self.rounds, 1)
        check_int("local_epochs", self.local_epochs, 1)
        if self.local_steps is not None:
            check_int("local_steps", self.local_steps, 1)
        check_int("batch_size", self.batch_size, 1)
        check_range("lr", self.lr, 0.0, low_inclusive=False)
        check_range("momentum", self.momentum, 0.0, 1.0, high_inclusive=False)
        check_int("seed", self.seed, 0)
        check_choice("mode", self.mode, MODES)
        check_int("num_neighbors", self.num_neighbors, 1)
        check_range("gamma_th", self.gamma_th, 0.0, low_inclusive=False)
        check_range("eps", self.eps, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
        check_choice("moments", self.moments, MOMENT_MODES)
        check_int("topology_seed", self.topology_seed, 0)
        if self.target != "random":
            if isinstance(self.target, str):
                raise ValueError(
                    f"target must be an integer in [0, {self.num_neighbors}] or "
                    f"'random'; got {self.target!r}"
                )
            check_int("target", self.target, 0, self.num_neighbors)
        for key in self.channel:
            if not isinstance(key, str):
                raise ValueError(f"channel keys must be ChannelParams field names; got {key!r}")

    @staticmethod
    def _make_hparams(alg: str, overrides: Mapping[str, Any]) -> Any:
        from pfedwn_jax.algorithms import get_algorithm, make_hparams

        return make_hparams(get_algorithm(alg), overrides)

    # ------------------------------------------------------------------ derived values
    @property
    def num_clients(self) -> int:
        """Clients in the network (= data clients of the partition): target + neighbors."""
        return self.num_neighbors + 1

    @property
    def method_names(self) -> tuple[str, ...]:
        """The algorithms to run (every registered one when `algorithms` is empty)."""
        from pfedwn_jax.algorithms import available_algorithms

        return self.algorithms or available_algorithms()

    def hparams_for(self, alg: str) -> Any:
        """The validated hyperparameter dataclass of algorithm `alg`."""
        return self._make_hparams(alg, self.hparams.get(alg, {}))

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-friendly dict (tuples as lists)."""
        out = dataclasses.asdict(self)
        out["algorithms"] = list(self.algorithms)
        return out

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExperimentConfig:
        """Build from a dict; unknown keys are a ValueError listing the allowed ones."""
        unknown = sorted(set(data) - set(cls.field_names()))
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
        try:
            with path.open("rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ValueError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"config file {path}: {e}") from None
        data.update(overrides)
        return cls.from_dict(data)

    def replace(self, **changes: Any) -> ExperimentConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
