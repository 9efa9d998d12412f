"""pfedwn-jax: a vectorized JAX simulator of personalized FL over D2D wireless networks.

The programmatic API, at the top (imported lazily, on first use):

- `pfedwn_jax.ExperimentConfig`: one experiment (data, model, methods, training, network).
- `pfedwn_jax.run(config) -> Result`: every configured method on the same network.
- `pfedwn_jax.Result`: what `run` returns; `.save(path)` / `Result.load(path)` for the JSON.
- `pfedwn_jax.sweep(config, seeds=..., grid=...) -> SweepResult`: many runs (seeds x grid)
  as few compiled programs, over every device (`pfedwn_jax.sweeps`, docs/sweeps.md).
- `pfedwn_jax.use_cpu_devices()`: one JAX device per CPU core, so clients train in parallel
  (call it before any JAX computation).

Subpackages (imported lazily so `import pfedwn_jax` stays cheap):

- `pfedwn_jax.wireless`: channel model, error probabilities, neighbor selection, Monte Carlo.
- `pfedwn_jax.data`: datasets, non-IID partitions, stacked client arrays.
- `pfedwn_jax.models`, `pfedwn_jax.engine`, `pfedwn_jax.algorithms`: stacked training.
- `pfedwn_jax.em`: EM estimation of aggregation weights.
- `pfedwn_jax.experiment`: configs, the runner, results and reports.
- `pfedwn_jax.sweeps`: sweeps (grid, batched programs, tidy results, checkpoints).
- `pfedwn_jax.distributed`: meshes over devices and hosts; `pfedwn_jax.state_store`: orbax.
- `pfedwn_jax.io`: atomic file writes; `pfedwn_jax.plotting`: matplotlib, lazily.
"""

import importlib

__version__ = "0.1.0"

# top-level name -> module defining it; imported on first access (they import JAX)
_LAZY = {
    "ExperimentConfig": "pfedwn_jax.experiment",
    "Result": "pfedwn_jax.experiment",
    "run": "pfedwn_jax.experiment",
    "sweep": "pfedwn_jax.sweeps",
    "SweepResult": "pfedwn_jax.sweeps",
    "use_cpu_devices": "pfedwn_jax.devices",
}

__all__ = [
    "ExperimentConfig",
    "Result",
    "SweepResult",
    "__version__",
    "run",
    "sweep",
    "use_cpu_devices",
]


def __getattr__(name: str):
    """Lazy top-level API: importing `pfedwn_jax` alone does not import JAX."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pfedwn_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
