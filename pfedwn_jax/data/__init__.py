"""Datasets, non-IID partitions and stacked per-client arrays (see docs/data.md).

fed = make_federated(DEFAULT_DATASET, num_clients=11, scheme="paper", seed=0)
fed.train.x  # [11, max_train, 28, 28, 1] uint8

Arrays in memory (float features of any shape, or uint8 images) become a named dataset with
`register_dataset(name, x_train, y_train, x_test, y_test)`.
"""

from pfedwn_jax.data.arrays import Dataset
from pfedwn_jax.data.batching import epoch_indices, steps_per_epoch
from pfedwn_jax.data.client_data import ClientData, FederatedData
from pfedwn_jax.data.datasets import (
    DATA_DIR_ENV,
    DEFAULT_DATASET,
    FILE_DATASETS,
    available_datasets,
    dataset_fingerprint,
    load_dataset,
    load_npz,
    save_npz,
)
from pfedwn_jax.data.federate import (
    POOLS,
    client_label_counts,
    make_federated,
)
from pfedwn_jax.data.leaf import load_leaf
from pfedwn_jax.data.partition import (
    ALL_SCHEMES,
    DEFAULT_MIN_SAMPLES,
    SCHEMES,
    cap_parts,
    label_counts,
    label_skew,
    partition,
    partition_natural,
)
from pfedwn_jax.data.registry import register_dataset, registered_datasets, unregister_dataset
from pfedwn_jax.data.stacking import (
    bucket_groups,
    bucketize,
    format_bytes,
    memory_bytes,
    memory_report,
    padding_ratio,
    stack_clients,
)
from pfedwn_jax.data.tfds_source import (
    TFDS_NAMES,
    DatasetUnavailableError,
    load_tfds,
    prepare_tfds,
)

__all__ = [
    "ALL_SCHEMES",
    "DATA_DIR_ENV",
    "DEFAULT_DATASET",
    "DEFAULT_MIN_SAMPLES",
    "FILE_DATASETS",
    "POOLS",
    "SCHEMES",
    "TFDS_NAMES",
    "ClientData",
    "Dataset",
    "DatasetUnavailableError",
    "FederatedData",
    "available_datasets",
    "bucket_groups",
    "bucketize",
    "cap_parts",
    "client_label_counts",
    "dataset_fingerprint",
    "epoch_indices",
    "format_bytes",
    "label_counts",
    "label_skew",
    "load_dataset",
    "load_leaf",
    "load_npz",
    "load_tfds",
    "make_federated",
    "memory_bytes",
    "memory_report",
    "padding_ratio",
    "partition",
    "partition_natural",
    "prepare_tfds",
    "register_dataset",
    "registered_datasets",
    "save_npz",
    "stack_clients",
    "steps_per_epoch",
    "unregister_dataset",
]
