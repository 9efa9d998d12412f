"""Experiments set up on the host: `ExperimentConfig`, the grid of a sweep, the federation.

See `docs/experiments.md` for the config fields and the results file schema.
"""

from pfedwn_jax.experiment.config import ExperimentConfig
from pfedwn_jax.experiment.federation import Federation, build_federation
from pfedwn_jax.experiment.grid import RunSpec, expand, grid_keys, run_config

__all__ = [
    "ExperimentConfig",
    "Federation",
    "RunSpec",
    "build_federation",
    "expand",
    "grid_keys",
    "run_config",
]
