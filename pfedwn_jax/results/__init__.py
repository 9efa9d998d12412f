"""Results: the per-round metric registry and the table every run and sweep fills."""

from pfedwn_jax.results.metrics import (
    Rounds,
    metric_names,
    register_metric,
    unregister_metric,
)
from pfedwn_jax.results.table import RunInfo, Table, Track

__all__ = [
    "Rounds",
    "RunInfo",
    "Table",
    "Track",
    "metric_names",
    "register_metric",
    "unregister_metric",
]
