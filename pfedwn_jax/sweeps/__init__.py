"""Sweeps: many runs (seeds x grid) as few compiled programs, over the devices of a host or
many. `sweep(config, seeds=..., grid=...) -> SweepResult`; see docs/sweeps.md."""

from pfedwn_jax.runner.api import run_configs, sweep
from pfedwn_jax.sweeps.grid import RunSpec, expand, grid_keys, parse_seeds, run_config
from pfedwn_jax.sweeps.result import SweepResult

__all__ = [
    "RunSpec",
    "SweepResult",
    "expand",
    "grid_keys",
    "parse_seeds",
    "run_config",
    "run_configs",
    "sweep",
]
