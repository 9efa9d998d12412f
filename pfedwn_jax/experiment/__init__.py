"""Experiments: `ExperimentConfig`, `run(config) -> Result`, results JSON and reports.

See `docs/experiments.md` for the results file schema and the config fields.
"""

from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.federation import Federation, build_federation
from pfedwn_jax.experiment.report import (
    format_table,
    format_table_cases,
    plot_learning_curves,
    plot_pi_history,
)
from pfedwn_jax.experiment.results import SCHEMA, Result

__all__ = [
    "SCHEMA",
    "ExperimentConfig",
    "Federation",
    "Result",
    "build_federation",
    "format_table",
    "format_table_cases",
    "plot_learning_curves",
    "plot_pi_history",
    "run",
]


def __getattr__(name: str):
    """`run` from the engine (`runner.api`), imported on first use: the engine imports this
    package's modules, so importing it here would be circular."""
    if name == "run":
        from pfedwn_jax.runner.api import run

        return run
    raise AttributeError(f"module 'pfedwn_jax.experiment' has no attribute {name!r}")
