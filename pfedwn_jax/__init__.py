"""pfedwn-jax: a vectorized JAX simulator of personalized FL over D2D wireless networks.

Subpackages (imported lazily so `import pfedwn_jax` stays cheap):

- `pfedwn_jax.wireless`: channel model, error probabilities, neighbor selection, Monte Carlo.
- `pfedwn_jax.data`: datasets, non-IID partitions, stacked client arrays.
- `pfedwn_jax.models`, `pfedwn_jax.engine`, `pfedwn_jax.algorithms`: stacked training.
- `pfedwn_jax.em`: EM estimation of aggregation weights.
- `pfedwn_jax.experiment`: configs, the runner and results.
- `pfedwn_jax.use_cpu_devices()`: one JAX device per CPU core, so clients train in parallel
  (call it before any JAX computation).
"""

__version__ = "0.1.0"

__all__ = ["__version__", "use_cpu_devices"]


def __getattr__(name: str):
    """Lazy top-level helpers (importing them imports JAX)."""
    if name == "use_cpu_devices":
        from pfedwn_jax.devices import use_cpu_devices

        return use_cpu_devices
    raise AttributeError(f"module 'pfedwn_jax' has no attribute {name!r}")
