"""Results: the per-round metric registry, the table every run and sweep fills, `Result` (one
run's methods), `SweepResult` (a sweep's tidy table), their stats, plots and reports."""

from pfedwn_jax.results.metrics import (
    Rounds,
    metric_names,
    register_metric,
    unregister_metric,
)
from pfedwn_jax.results.result import Result
from pfedwn_jax.results.sweep import SweepResult
from pfedwn_jax.results.table import Table

__all__ = [
    "Result",
    "Rounds",
    "SweepResult",
    "Table",
    "metric_names",
    "register_metric",
    "unregister_metric",
]
