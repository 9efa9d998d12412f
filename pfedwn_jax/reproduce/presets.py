"""Presets of the paper reproduction: each a base config and a grid per method.

A preset names its datasets (label, `ExperimentConfig.dataset`, model, per-client sample cap),
the config fields every run shares (`base`), the seeds, per method the grid of swept
hyperparameters chosen on a validation split (`grids`) plus fixed ones (`hparams`), how the
cases' targets are chosen (`criterion`, `reproduce.cases`), pFedWN's EM variants and the
crossover study (`crossover`). `tiny` (the test, seconds), `quick` (2 CPU cores, minutes,
real data subsets from the shared data folder, MLPs), `mnist-full` (full MNIST on 2 CPU
cores, under an hour for Table II; the CNN where an accelerator is present) and `paper` (full
datasets, the paper's models, 100 rounds; for a GPU). Nothing downloads: `with_data_dir`
points a preset's datasets at `.npz` files or prepared TFDS data in one folder.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from pfedwn_jax._checks import check_choice
from pfedwn_jax.reproduce.cases import CRITERIA
from pfedwn_jax.reproduce.paper_numbers import METHODS

#: pFedWN's EM read the other ways the paper allows (hyperparameter overrides of the
#: default): re-estimate pi every round (Alg. 1's loop), mix M-step 2's fine-tuned components
#: in Eq. 5, or both.
EM_VARIANTS: tuple[Mapping[str, Any], ...] = (
    {"em_every": 1},
    {"mix_components": True},
    {"em_every": 1, "mix_components": True},
)
#: The EM readings compared at fixed points in `mnist-full`: pi estimated on the components
#: after M-step 2 (App. B read literally) and Eq. 5 mixing the fine-tuned components.
EM_READINGS: tuple[Mapping[str, Any], ...] = (
    {"pi_from": "components"},
    {"mix_components": True},
)
#: How EM variants are compared: "tuned" (each over pFedWN's grid on validation, like a
#: method) or "fixed" (at `a = FIXED_A` and at the default's chosen point, the default's lr).
VARIANT_POINTS = ("tuned", "fixed")
FIXED_A = 0.9


DATA_ENV = "PFEDWN_SHARED_DATA"


class DataSpec(NamedTuple):
    """One dataset of a preset: table label, `ExperimentConfig.dataset`, model, sample cap,
    and the model used instead where JAX's default backend is an accelerator (None: the
    same); `runs.dataset_base` decides at run time."""

    label: str
    dataset: str | None
    model: str
    max_samples: int | None
    accel_model: str | None = None


class Crossover(NamedTuple):
    """The crossover study (`reproduce.crossover`): where collaboration pays.

    Every Table II case target of the preset's first dataset under each of `criteria`
    (distinct targets) trains with every client capped at each of `caps` samples
    (`max_samples_per_client`; None: the dataset's own cap, none in `mnist-full`), `methods`
    at fixed hyperparameters (`lr`, the methods' defaults and the preset's fixed `hparams`)
    and pFedWN at each of `a`.
    """

    caps: tuple[int | None, ...]
    seeds: tuple[int, ...]
    rounds: int
    lr: float
    a: tuple[float, ...]
    methods: tuple[str, ...] = METHODS[:-1]  # the methods beside pFedWN
    criteria: tuple[str, ...] = ("counts", "similarity")


@dataclasses.dataclass(frozen=True)
class Preset:
    """What one preset runs (see the module docstring).

    Attributes:
      datasets: the datasets, in table order; `fig1`/`fig8`/`fig9` name the label used.
      base: `ExperimentConfig` fields shared by every run (rounds, batch size, ...).
      seeds: the seeds of every grid point.
      grids: per method, the swept keys and values (chosen on the validation split).
      hparams: per method, fixed hyperparameters (e.g. FedAMP's `sigma_mode`).
      variants: datasets whose pFedWN EM variants run (`em_variants`, compared as
        `variant_points` says).
      window: rounds of the "last" statistic (and of the validation score).
      methods: the methods run (default all six).
      criterion: how the cases' targets are chosen (`reproduce.cases.CRITERIA`).
      em_variants: pFedWN hyperparameter overrides, one per variant.
      variant_points: "tuned" (each variant over pFedWN's grid, chosen on validation, like
        a method) or "fixed" (at `a = FIXED_A` and at the default's chosen `a`,
        with the default's chosen lr, paired by seed with the default at the same point).
      crossover: the crossover study's settings (None: the preset has none).
      max_runs: runs per compiled program (None: as many as the memory plan fits when the
        sweep starts; on a shared machine other processes may take that memory meanwhile).
    """

    name: str
    datasets: tuple[DataSpec, ...]
    base: Mapping[str, Any]
    seeds: tuple[int, ...]
    grids: Mapping[str, Mapping[str, tuple[Any, ...]]]
    hparams: Mapping[str, Mapping[str, Any]]
    fig1: str
    fig8: str
    fig9: str
    variants: tuple[str, ...] = ()
    window: int = 5
    methods: tuple[str, ...] = METHODS
    description: str = ""
    criterion: str = "counts"
    em_variants: tuple[Mapping[str, Any], ...] = EM_VARIANTS
    variant_points: str = "tuned"
    crossover: Crossover | None = None
    max_runs: int | None = None

    def __post_init__(self) -> None:

        check_choice("criterion", self.criterion, CRITERIA)
        check_choice("variant_points", self.variant_points, VARIANT_POINTS)
        a_grid = self.grids.get("pfedwn", {}).get("pfedwn.a", ())
        if self.variants and self.variant_points == "fixed" and FIXED_A not in a_grid:
            raise ValueError(f"variant_points='fixed' needs a = {FIXED_A} in pFedWN's grid")


def shared_data_dir() -> Path:
    """The shared real-data folder: `$PFEDWN_SHARED_DATA` or `$PFEDWN_DATA_DIR` (the data
    modules' variable), else `../shared/data` next to the repository (or its worktree folder)."""
    for name in (DATA_ENV, "PFEDWN_DATA_DIR"):
        if os.environ.get(name):
            return Path(os.environ[name])
    for parent in Path(__file__).resolve().parents[2:]:
        if (parent / "shared" / "data").is_dir():
            return parent / "shared" / "data"
    return Path(__file__).resolve().parents[3] / "shared" / "data"


def _npz(name: str) -> str:
    return f"npz:{shared_data_dir() / name}"


QUICK_GRID: dict[str, dict[str, tuple[Any, ...]]] = {
    "local": {"lr": (0.02, 0.1)},
    "fedavg": {"lr": (0.02, 0.1)},
    "fedprox": {"lr": (0.02, 0.1), "fedprox.mu": (0.01, 0.1)},
    "perfedavg": {"lr": (0.02, 0.1), "perfedavg.alpha": (0.005, 0.02)},
    "fedamp": {"lr": (0.02, 0.1), "fedamp.sigma_scale": (0.5, 2.0)},
    "pfedwn": {"lr": (0.02, 0.1), "pfedwn.a": (0.3, 0.6, 0.9)},
}


_FIXED = {"fedamp": {"sigma_mode": "auto"}, "perfedavg": {"variant": "fo"}}


def _tiny() -> Preset:
    return Preset(
        name="tiny",
        datasets=(DataSpec("MNIST", None, "logreg", 40),),
        base={"rounds": 2, "batch_size": 16, "val_fraction": 0.2, "data_seed": 0},
        seeds=(0, 1),
        grids={m: {"lr": (0.05, 0.1)} for m in METHODS},
        hparams=_FIXED,
        fig1="MNIST",
        fig8="MNIST",
        fig9="MNIST",
        variants=("MNIST",),
        window=2,
        description="embedded MNIST subset, logistic regression, 2 rounds, 2 seeds (a test)",
        crossover=Crossover(
            caps=(20, None),
            seeds=(0, 1),
            rounds=2,
            lr=0.1,
            a=(0.5,),
            methods=("local",),
            criteria=("counts",),
        ),
    )


def _quick() -> Preset:
    return Preset(
        name="quick",
        datasets=(
            DataSpec("MNIST", _npz("mnist_10k_2k.npz"), "mlp", 300),
            DataSpec("CIFAR-10", _npz("cifar10_exact_subset.npz"), "mlp", 150),
            DataSpec("CIFAR-100", _npz("cifar100_exact_subset.npz"), "mlp", 150),
        ),
        base={"rounds": 10, "batch_size": 32, "val_fraction": 0.2, "data_seed": 0},
        seeds=(0, 1, 2, 3, 4),
        grids=QUICK_GRID,
        hparams=_FIXED,
        fig1="CIFAR-10",
        fig8="CIFAR-10",
        fig9="CIFAR-100",
        variants=("MNIST",),
        description=(
            "shared real-data subsets (MNIST 12k, CIFAR-10 6.2k, CIFAR-100 2.0k images), "
            "at most 300 (MNIST) / 150 (CIFAR) samples per client, the MLP for every dataset "
            "(the CNN costs ~2 s per run-round on this CPU), 10 rounds of 1 local epoch, "
            "5 seeds, a 2-6 point grid per method"
        ),
    )


_PAPER_LR = (0.005, 0.01, 0.05)


PAPER_GRID: dict[str, dict[str, tuple[Any, ...]]] = {
    "local": {"lr": _PAPER_LR},
    "fedavg": {"lr": _PAPER_LR},
    "fedprox": {"lr": _PAPER_LR, "fedprox.mu": (0.001, 0.01, 0.1)},
    "perfedavg": {"lr": _PAPER_LR, "perfedavg.alpha": (0.001, 0.01)},
    "fedamp": {"lr": _PAPER_LR, "fedamp.sigma_scale": (0.5, 1.0, 2.0)},
    "pfedwn": {"lr": _PAPER_LR, "pfedwn.a": (0.1, 0.3, 0.5, 0.7, 0.9)},
}


def _paper() -> Preset:
    """`quick`'s seeds, fixed hyperparameters and figures at the paper's scale."""
    return dataclasses.replace(
        _quick(),
        name="paper",
        datasets=(
            DataSpec("MNIST", "mnist", "cnn", None),
            DataSpec("CIFAR-10", "cifar10", "resnet18", None),
            DataSpec("CIFAR-100", "cifar100", "resnet18", None),
        ),
        base={"rounds": 100, "batch_size": 32, "val_fraction": 0.2, "data_seed": 0},
        grids=PAPER_GRID,
        variants=("MNIST", "CIFAR-10", "CIFAR-100"),
        description="TFDS full datasets, CNN (MNIST) / ResNet18 (CIFAR), 100 rounds, 5 seeds",
    )


def _mnist_source() -> str:
    """Full MNIST: the shared `mnist.npz` where it is, else TFDS `mnist` (prepared data)."""
    path = shared_data_dir() / "mnist.npz"
    return f"npz:{path}" if path.is_file() else "mnist"


_FULL_LR = (0.03, 0.1)
_FULL_LR4 = (0.01, 0.03, 0.1, 0.3)


#: `mnist-full`'s grid: every method tunes its own hyperparameters on validation with the
#: same budget, 4 grid points (`FULL_POINTS`): the learning rate of Local and FedAvg (the
#: only one they have), and the lr with each other method's own: FedProx's mu, Per-FedAvg's
#: alpha (its beta is the lr), FedAMP's sigma scale, pFedWN's a (a = 1 is Local: the
#: tables also report pFedWN chosen among a < 1, `BELOW_ONE`).
FULL_GRID: dict[str, dict[str, tuple[Any, ...]]] = {
    "local": {"lr": _FULL_LR4},
    "fedavg": {"lr": _FULL_LR4},
    "fedprox": {"lr": _FULL_LR, "fedprox.mu": (0.01, 0.1)},
    "perfedavg": {"lr": _FULL_LR, "perfedavg.alpha": (0.005, 0.02)},
    "fedamp": {"lr": _FULL_LR, "fedamp.sigma_scale": (0.5, 2.0)},
    "pfedwn": {"lr": _FULL_LR, "pfedwn.a": (0.9, 1.0)},
}
#: Grid points per method in `mnist-full` (the same for every method).
FULL_POINTS = 4
FULL_FIXED: dict[str, dict[str, Any]] = {
    "perfedavg": {"variant": "fo"},
    "fedamp": {"sigma_mode": "auto"},
}
#: pFedWN's extra table row: chosen on validation among its grid points with a < 1.
BELOW_ONE = "pfedwn a<1"


FULL_BASE = {"rounds": 30, "local_epochs": 1, "batch_size": 32, "val_fraction": 0.2, "data_seed": 0}


def _mnist_full() -> Preset:
    return Preset(
        name="mnist-full",
        datasets=(DataSpec("MNIST", _mnist_source(), "mlp", None, accel_model="cnn"),),
        base=FULL_BASE,
        seeds=(0, 1, 2, 3, 4),
        grids=FULL_GRID,
        hparams=FULL_FIXED,
        fig1="MNIST",
        fig8="MNIST",
        fig9="MNIST",
        variants=("MNIST",),
        criterion="similarity",
        em_variants=EM_READINGS,
        variant_points="fixed",
        max_runs=10,
        crossover=Crossover(
            caps=(50, 150, 500, 1500, None), seeds=(0, 1, 2), rounds=30, lr=0.05, a=(0.5, 0.9)
        ),
        description=(
            "full MNIST (70,000 images), the paper's partition over 11 clients (21 for Table "
            "III), no per-client cap, cases chosen by label similarity, the MLP on a CPU (the "
            "paper's CNN where JAX's backend is an accelerator), 30 rounds of 1 local epoch, "
            "5 seeds, 4 grid points per method chosen on validation: lr in {0.01, 0.03, 0.1, "
            "0.3} (Local, FedAvg), lr in {0.03, 0.1} x FedProx mu {0.01, 0.1}, Per-FedAvg "
            "alpha {0.005, 0.02}, FedAMP sigma scale {0.5, 2}, pFedWN a {0.9, 1}"
        ),
    )


PRESETS = {p.name: p for p in (_tiny(), _quick(), _mnist_full(), _paper())}


#: The file (`NAME.npz`) or prepared TFDS folder (`NAME/`) `with_data_dir` looks for.
DATA_NAMES = {"MNIST": "mnist", "CIFAR-10": "cifar10", "CIFAR-100": "cifar100"}


def with_data_dir(preset: Preset, folder: str | Path) -> Preset:
    """`preset` reading every dataset from `folder`: `NAME.npz` (`npz:`, keys `x_train`,
    `y_train`, `x_test`, `y_test`) where it exists, else TFDS data prepared there (`NAME/`,
    read with `download=False`); NAME per label in `DATA_NAMES`. Raises ValueError naming
    what is missing, before any run."""
    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise ValueError(f"--data-dir {str(folder)!r} is not a folder")
    specs = []
    for spec in preset.datasets:
        name = DATA_NAMES.get(spec.label)
        if name is None:
            raise ValueError(f"--data-dir: no file name known for dataset {spec.label!r}")
        if (folder / f"{name}.npz").is_file():
            specs.append(spec._replace(dataset=f"npz:{folder / f'{name}.npz'}"))
        elif (folder / name).is_dir():
            specs.append(spec._replace(dataset=name))
        else:
            raise ValueError(
                f"--data-dir {str(folder)!r} holds neither {name}.npz nor prepared TFDS data "
                f"({name}/) for {spec.label}"
            )
    base = {**preset.base, "data_dir": str(folder)}
    return dataclasses.replace(preset, datasets=tuple(specs), base=base)


def with_datasets(preset: Preset, labels: str | Sequence[str]) -> Preset:
    """`preset` with only the datasets labelled in `labels` ("MNIST,CIFAR-10" or a list),
    in the preset's order (ValueError naming the allowed labels)."""
    names = [x.strip() for x in labels.split(",")] if isinstance(labels, str) else list(labels)
    known = [spec.label for spec in preset.datasets]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ValueError(f"datasets: unknown {bad or names}; preset {preset.name!r} has {known}")
    specs = tuple(spec for spec in preset.datasets if spec.label in names)
    return dataclasses.replace(preset, datasets=specs)


def get_preset(name: str | Preset) -> Preset:
    """A preset by name (ValueError naming the allowed ones)."""
    if isinstance(name, Preset):
        return name
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}; got {name!r}")
    return PRESETS[name]
