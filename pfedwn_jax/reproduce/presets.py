"""Presets of the paper reproduction: each a base config and a grid per method.

A preset names its datasets (label, `ExperimentConfig.dataset`, model, per-client sample cap),
the config fields every run shares (`base`), the seeds, and per method the grid of swept
hyperparameters chosen on a validation split (`grids`) plus fixed ones (`hparams`). `tiny`
(the test, seconds), `quick` (2 CPU cores, minutes, real data from the shared data folder,
MLPs) and `paper` (TFDS full datasets, the paper's models, 100 rounds; for a GPU). Nothing
downloads in `tiny` or `quick`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

METHODS = ("local", "fedavg", "fedprox", "perfedavg", "fedamp", "pfedwn")


#: pFedWN's EM read both ways the paper allows: (em_every, mix_components), i.e. estimate
#: once and freeze or re-estimate every round, mixing the neighbors' received models or
#: M-step 2's fine-tuned components; the first is the default.
EM_VARIANTS = ((0, False), (1, False), (0, True), (1, True))


DATA_ENV = "PFEDWN_SHARED_DATA"


class DataSpec(NamedTuple):
    """One dataset of a preset: table label, `ExperimentConfig.dataset`, model, sample cap."""

    label: str
    dataset: str | None
    model: str
    max_samples: int | None


@dataclasses.dataclass(frozen=True)
class Preset:
    """What one preset runs (see the module docstring).

    Attributes:
      datasets: the datasets, in table order; `fig1`/`fig8`/`fig9` name the label used.
      base: `ExperimentConfig` fields shared by every run (rounds, batch size, ...).
      seeds: the seeds of every grid point.
      grids: per method, the swept keys and values (chosen on the validation split).
      hparams: per method, fixed hyperparameters (e.g. FedAMP's `sigma_mode`).
      variants: datasets whose pFedWN EM variants run as extra Table II rows.
      window: rounds of the "last" statistic (and of the validation score).
      methods: the methods run (default all six).
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


QUICK_GRID = {
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


PAPER_GRID = {
    "local": {"lr": _PAPER_LR},
    "fedavg": {"lr": _PAPER_LR},
    "fedprox": {"lr": _PAPER_LR, "fedprox.mu": (0.001, 0.01, 0.1)},
    "perfedavg": {"lr": _PAPER_LR, "perfedavg.alpha": (0.001, 0.01)},
    "fedamp": {"lr": _PAPER_LR, "fedamp.sigma_scale": (0.5, 1.0, 2.0)},
    "pfedwn": {"lr": _PAPER_LR, "pfedwn.a": (0.1, 0.3, 0.5, 0.7, 0.9)},
}


def _paper() -> Preset:
    return Preset(
        name="paper",
        datasets=(
            DataSpec("MNIST", "mnist", "cnn", None),
            DataSpec("CIFAR-10", "cifar10", "resnet18", None),
            DataSpec("CIFAR-100", "cifar100", "resnet18", None),
        ),
        base={"rounds": 100, "batch_size": 32, "val_fraction": 0.2, "data_seed": 0},
        seeds=(0, 1, 2, 3, 4),
        grids=PAPER_GRID,
        hparams=_FIXED,
        fig1="CIFAR-10",
        fig8="CIFAR-10",
        fig9="CIFAR-100",
        variants=("MNIST", "CIFAR-10", "CIFAR-100"),
        description="TFDS full datasets, CNN (MNIST) / ResNet18 (CIFAR), 100 rounds, 5 seeds",
    )


PRESETS = {p.name: p for p in (_tiny(), _quick(), _paper())}


def get_preset(name: str | Preset) -> Preset:
    """A preset by name (ValueError naming the allowed ones)."""
    if isinstance(name, Preset):
        return name
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}; got {name!r}")
    return PRESETS[name]
