"""Datasets, non-IID partitions and stacked per-client arrays (see docs/data.md).

fed = make_federated(DEFAULT_DATASET, num_clients=11, scheme="paper", seed=0)
fed.train.x  # [11, max_train, 28, 28, 1] uint8
"""

from pfedwn_jax.data.arrays import Dataset
from pfedwn_jax.data.batching import epoch_indices, steps_per_epoch
from pfedwn_jax.data.client_data import ClientData, FederatedData
from pfedwn_jax.data.datasets import DEFAULT_DATASET, available_datasets, load_dataset, load_npz
from pfedwn_jax.data.federate import (
    POOLS,
    client_label_counts,
    make_federated,
    pool_arrays,
    split_train_test,
)
from pfedwn_jax.data.partition import (
    DEFAULT_MIN_SAMPLES,
    SCHEMES,
    label_counts,
    label_skew,
    partition,
)
from pfedwn_jax.data.stacking import (
    bucket_groups,
    bucketize,
    format_bytes,
    memory_bytes,
    memory_report,
    padding_ratio,
    stack_clients,
    to_device,
)
from pfedwn_jax.data.tfds_source import (
    TFDS_NAMES,
    DatasetUnavailableError,
    load_tfds,
    prepare_tfds,
)

__all__ = [
    "DEFAULT_DATASET",
    "DEFAULT_MIN_SAMPLES",
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
    "client_label_counts",
    "epoch_indices",
    "format_bytes",
    "label_counts",
    "label_skew",
    "load_dataset",
    "load_npz",
    "load_tfds",
    "make_federated",
    "memory_bytes",
    "memory_report",
    "padding_ratio",
    "partition",
    "pool_arrays",
    "prepare_tfds",
    "split_train_test",
    "stack_clients",
    "steps_per_epoch",
    "to_device",
]
