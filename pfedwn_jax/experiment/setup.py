"""`setup(config) -> Experiment`: one run's data, model, federation and round context, on the host.

Everything a run needs before anything is compiled or placed on a device: the partitioned data,
the model, the federation (wireless placement and neighbor selection) and the `RoundContext`
with host (NumPy) arrays. Every check that needs the data (does the model fit the images?)
fails here with a `ValueError`. The driver (`pfedwn_jax.runner`) pads, stacks and places the
contexts of the runs that share a program.

Randomness: the initial model comes from `fold_in(key(seed), 0)` and round `r`'s key is
`fold_in(fold_in(key(seed), 1), r)`, the same for every method, so methods start from the
same model and see the same batch orders, and a resumed run repeats an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from pfedwn_jax.algorithms import RoundContext, neighbor_lists
from pfedwn_jax.data import DEFAULT_DATASET, ClientData, FederatedData, load_dataset, make_federated
from pfedwn_jax.data.batching import fit_batch_size
from pfedwn_jax.data.federate import class_options
from pfedwn_jax.data.registry import get_registered
from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.cost_setup import config_cost_setup
from pfedwn_jax.experiment.federation import Federation, build_federation
from pfedwn_jax.experiment.link_setup import build_links, mobile_federation
from pfedwn_jax.models import get_model
from pfedwn_jax.provenance import provenance


@dataclasses.dataclass(frozen=True, eq=False)
class Experiment:
    """One run set up on the host: what the rounds of every method share.

    Attributes:
      config: the run's config.
      data: the partitioned data (host arrays; `data.train.x [N, n, ...]`).
      federation: the federation (host), `S` model slots.
      ctx: the `RoundContext` (host arrays; not yet placed on a device).
      init_key: `[2]` uint32 key data of every method's initial state.
      round_root: `[2]` uint32 key data of the root of the per-round keys.
      data_fingerprint: SHA-256 of the source dataset's arrays (what a resume must match).
    """

    config: ExperimentConfig
    data: FederatedData
    federation: Federation
    ctx: RoundContext
    init_key: np.ndarray
    round_root: np.ndarray
    data_fingerprint: str = ""

    @property
    def test(self) -> ClientData:
        return self.data.test

    @property
    def val(self) -> ClientData | None:
        return self.data.val


def _stamp(name: str, data_dir: str | None) -> tuple:
    """What changes when the dataset behind `name` changes: the registry entry of a
    registered dataset (registered again under the same name: another entry), a file-backed
    dataset's path, size and mtime; `()` for the others (built-in)."""
    registered = get_registered(name)
    if registered is not None:  # the cache holds the entry, so its id is not reused meanwhile
        return ("registered", id(registered))
    path = name.split(":", 1)[1] if ":" in name else None
    if path is None or not os.path.isfile(path):
        return ()
    st = os.stat(path)
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _dataset(name: str, data_dir: str | None, stamp: tuple) -> tuple[Any, str]:
    """The loaded dataset and the SHA-256 of its arrays (cached per process: the runs of a
    sweep share one copy; a changed file or registry entry has another stamp and is read
    again)."""
    dataset = load_dataset(name, data_dir=data_dir)
    digest = hashlib.sha256()
    for value in (dataset.x_train, dataset.y_train, dataset.x_test, dataset.y_test):
        arr = np.ascontiguousarray(np.asarray(value))
        digest.update(f"{arr.dtype}{arr.shape}".encode())
        digest.update(arr.data)
    return dataset, digest.hexdigest()


def load_data(config: ExperimentConfig) -> tuple[FederatedData, str]:
    """`(partitioned data, data fingerprint)` of `config` (host arrays)."""
    name = config.dataset or DEFAULT_DATASET
    try:
        dataset, fingerprint = _dataset(name, config.data_dir, _stamp(name, config.data_dir))
    except ValueError as e:
        raise ValueError(f"dataset: {e}") from None
    seed = config.seed if config.data_seed is None else config.data_seed
    try:
        fed = make_federated(
            dataset,
            config.num_clients,
            scheme=config.partition,
            seed=seed,
            alpha=config.alpha,
            train_frac=config.train_frac,
            min_samples=config.min_samples,
            pool=config.pool,
            val_fraction=config.val_fraction,
            **class_options(config.partition, config.classes_per_client),
            max_samples_per_client=config.max_samples_per_client,
            device=False,  # host arrays: the driver places each group's stack once
        )
    except ValueError as e:
        raise ValueError(f"partition: {e}") from None
    return fed, fingerprint


def build_model(
    config: ExperimentConfig, num_classes: int, input_shape: tuple[int, ...], input_dtype="uint8"
):
    """The engine `Model`; a model that does not fit the data fails naming `model`."""
    try:
        shape = tuple(int(s) for s in input_shape)
        return get_model(config.model, num_classes, shape, input_dtype=input_dtype)
    except ValueError as e:
        raise ValueError(f"model: {config.model!r} does not fit the data: {e}") from None


def build_context(
    config: ExperimentConfig, fed: Federation, data: FederatedData, model: Any
) -> RoundContext:
    """The `RoundContext` of a run, host arrays.

    SGD's learning rate and momentum are leaves of the context (`RoundContext.tx`), so runs
    that differ only in them share one compiled round; momentum 0 is plain SGD (no trace).
    Who receives whom goes in as neighbor lists `[S, K]` (`neighbor_lists` of the federation's
    adjacency); the dense `ctx.adjacency` is left unset (no algorithm reads it).
    """
    if fed.neighbor_lists is not None:  # a large network hands over its lists
        neighbors, neighbor_mask = fed.neighbor_lists, fed.neighbor_mask
    else:
        neighbors, neighbor_mask = neighbor_lists(fed.adjacency)
    data_client = np.asarray(fed.data_client, np.int32)
    num_samples = np.asarray(np.asarray(data.train.count)[data_client], np.float32)
    batch_size = fit_batch_size(config.batch_size, np.asarray(data.train.count)[data_client])
    links = build_links(fed, config)
    if config.cost:
        assert links is not None  # built whenever the cost is counted
        links = links.replace(cost=config_cost_setup(config, model, num_samples, batch_size))
    return RoundContext(
        model=model,
        optimizer=None,
        train=data.train,
        data_client=data_client,
        neighbors=np.asarray(neighbors, np.int32),
        neighbor_mask=np.asarray(neighbor_mask, bool),
        is_target=np.asarray(fed.is_target, bool),
        num_samples=num_samples,
        batch_size=batch_size,
        local_epochs=config.local_epochs,
        num_steps=config.local_steps,
        lr=np.float32(config.lr),
        momentum=np.float32(config.momentum) if config.momentum else None,
        links=links,
    )


#: The config fields a federation depends on (every field `experiment.federation` reads;
#: `tests/test_setup_cache.py` checks the list against it): runs that share them (a seed
#: sweep) share one federation.
FEDERATION_FIELDS = (
    "mode",
    "num_neighbors",
    "topology_seed",
    "target",
    "gamma_th",
    "eps",
    "moments",
    "channel",
    "selection",
    "node_density",
    "candidates",
    "interference_cutoff",
    "interference_tail",
    "fading",
    "fading_param",
    "shadowing_db",
    "mobility",
)


def federation_of(config: ExperimentConfig) -> Federation:
    """`build_federation(config)`, computed once per process for the fields it reads."""
    key = tuple(
        (f, tuple(sorted(v.items())) if isinstance(v, Mapping) else v)
        for f in FEDERATION_FIELDS
        for v in [getattr(config, f)]
    )
    return _federation(key)


@functools.lru_cache(maxsize=32)
def _federation(key: tuple) -> Federation:
    fields: dict[str, Any] = {f: dict(v) if f == "channel" else v for f, v in key}
    return build_federation(ExperimentConfig(**fields))


def round_keys(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(init key, root of the per-round keys) as `[2]` uint32 key data, equal for every
    method."""
    # raw key data, not typed keys: host arrays like the rest of an `Experiment`, stacked over
    # a group's runs and placed with them; the programs wrap them back (`wrap_key_data`)
    root = jax.random.key(seed)
    init, rounds = jax.random.fold_in(root, 0), jax.random.fold_in(root, 1)
    return np.asarray(jax.random.key_data(init)), np.asarray(jax.random.key_data(rounds))


def data_key(config: ExperimentConfig) -> tuple:
    """The fields `load_data` reads: configs with equal keys get the same partitioned data."""
    c = config
    seed = c.seed if c.data_seed is None else c.data_seed
    return (c.dataset or DEFAULT_DATASET, str(c.data_dir), c.num_clients, c.partition, seed,
            c.alpha, c.train_frac, c.min_samples, c.pool, c.val_fraction,
            c.classes_per_client, c.max_samples_per_client)  # fmt: skip


def setup(
    config: ExperimentConfig, loaded: dict[tuple, tuple[FederatedData, str]] | None = None
) -> Experiment:
    """Load data, build model, federation and context on the host (nothing is compiled).
    `loaded`: data already loaded, by `data_key` (filled here), so that the runs of a sweep
    over one partition share one host copy instead of holding one each."""
    if not isinstance(config, ExperimentConfig):
        raise ValueError(f"config must be an ExperimentConfig; got {type(config).__name__}")
    if loaded is None:
        data, fingerprint = load_data(config)
    else:
        key = data_key(config)
        if key not in loaded:
            loaded[key] = load_data(config)
        data, fingerprint = loaded[key]
    model = build_model(config, data.num_classes, data.train.x.shape[2:], data.train.x.dtype)
    fed = mobile_federation(federation_of(config), config)
    ctx = build_context(config, fed, data, model)
    return Experiment(config, data, fed, ctx, *round_keys(config.seed), fingerprint)


def environment() -> dict[str, Any]:
    """The `environment` entry of the results: jax version, backend, devices, `provenance`."""
    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "provenance": provenance(),
    }


def data_info(data: FederatedData) -> dict[str, Any]:
    """The `data` entry of the results: name, classes, input shape, per-client counts."""
    return {
        "name": data.name,
        "num_classes": int(data.num_classes),
        "input_shape": [int(s) for s in data.train.x.shape[2:]],
        "train_counts": np.asarray(data.train.count).tolist(),
        "test_counts": np.asarray(data.test.count).tolist(),
        **({} if data.val is None else {"val_counts": np.asarray(data.val.count).tolist()}),
    }
