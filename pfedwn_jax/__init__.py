"""pfedwn-jax: a vectorized JAX simulator of personalized FL over D2D wireless networks.

The programmatic API, at the top (imported lazily, on first use):

- `pfedwn_jax.ExperimentConfig`: one experiment (data, model, methods, training, network).
- `pfedwn_jax.run(config) -> Result`: every configured method on the same network (a list of
  configs: one `Result` each, run as one job).
- `pfedwn_jax.Options`: how a job runs (checkpoint, writers, block, records, ...); each field
  is also a keyword of `run` and `sweep` (`pfedwn_jax.api`, the front door).
- `pfedwn_jax.Result`: what `run` returns; `.save(path)` / `Result.load(path)` for the JSON.
- `pfedwn_jax.sweep(config, seeds=..., grid=...) -> SweepResult`: many runs (seeds x grid)
  as few compiled programs, over every device (docs/sweeps.md).
- `pfedwn_jax.load_models(path)`: the final personalised models a run or sweep saved
  (`save_models=path`, `pfedwn run --save-models`), with the model and data to evaluate them.
- `pfedwn_jax.use_cpu_devices()`: one JAX device per CPU core, so clients train in parallel
  (call it before any JAX computation).
- `pfedwn_jax.register_model(name, builder)`, `pfedwn_jax.register_algorithm(algorithm)`
  (`pfedwn_jax.algorithms.register`), `pfedwn_jax.register_dataset(name, x_train, y_train,
  x_test, y_test)`: your own flax module, FL method and arrays in memory, usable by name in
  an `ExperimentConfig` (and from the command line with `pfedwn --import MODULE`).

Subpackages (imported lazily so `import pfedwn_jax` stays cheap):

- `pfedwn_jax.wireless`: channel model, error probabilities, neighbor selection, Monte Carlo.
- `pfedwn_jax.data`: datasets, non-IID partitions, stacked client arrays.
- `pfedwn_jax.models`, `pfedwn_jax.engine`, `pfedwn_jax.algorithms`: stacked training.
- `pfedwn_jax.em`: EM estimation of aggregation weights.
- `pfedwn_jax.experiment`: configs, the grid of a sweep, the federation, host set-up.
- `pfedwn_jax.runner`: the driver (compiled rounds, checkpoints, writers, saved models).
- `pfedwn_jax.results`: `Result`, `SweepResult`, the per-round table, stats, plots, reports.
- `pfedwn_jax.distributed`: meshes over devices and hosts; `pfedwn_jax.state_store`: orbax.
- `pfedwn_jax.io`: atomic file writes; `pfedwn_jax.plotting`: matplotlib, lazily.
- `pfedwn_jax.results.frames`: results as tidy tables (pandas optional); `pfedwn_jax.provenance`:
  package version, git commit and library versions recorded with every result.
"""

import importlib as _importlib

__version__ = "0.1.0"

# top-level name -> (module defining it, its name there); imported on first access (JAX)
_LAZY = {
    "ExperimentConfig": ("pfedwn_jax.experiment", "ExperimentConfig"),
    "Result": ("pfedwn_jax.results.result", "Result"),
    "Options": ("pfedwn_jax.api", "Options"),
    "run": ("pfedwn_jax.api", "run"),
    "sweep": ("pfedwn_jax.api", "sweep"),
    "SweepResult": ("pfedwn_jax.results.sweep", "SweepResult"),
    "use_cpu_devices": ("pfedwn_jax.devices", "use_cpu_devices"),
    "use_compilation_cache": ("pfedwn_jax.devices", "use_compilation_cache"),
    "register_model": ("pfedwn_jax.models", "register_model"),
    "register_algorithm": ("pfedwn_jax.algorithms", "register"),
    "register_dataset": ("pfedwn_jax.data", "register_dataset"),
    "load_models": ("pfedwn_jax.runner.saved_models", "load_models"),
}
# subpackages and modules, imported on first access as `pfedwn_jax.<name>`
_SUBMODULES = (
    "algorithms",
    "api",
    "cli",
    "data",
    "devices",
    "distributed",
    "em",
    "engine",
    "experiment",
    "io",
    "models",
    "plotting",
    "provenance",
    "reproduce",
    "results",
    "runner",
    "state_store",
    "wireless",
)

__all__ = sorted(["__version__", *_LAZY])  # the public API: the lazy names


def __getattr__(name: str):
    """Lazy top-level API and subpackages: importing `pfedwn_jax` alone does not import JAX."""
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(_importlib.import_module(module), attr)
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'pfedwn_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API and the subpackages (not this module's own helpers)."""
    return sorted({*__all__, *_SUBMODULES})
