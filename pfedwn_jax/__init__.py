"""pfedwn-jax: a vectorized JAX simulator of personalized FL over D2D wireless networks.

Subpackages (imported lazily so `import pfedwn_jax` stays cheap):

- `pfedwn_jax.wireless`: channel model, error probabilities, neighbor selection, Monte Carlo.
- `pfedwn_jax.data`: datasets, non-IID partitions, stacked client arrays.
- `pfedwn_jax.models`, `pfedwn_jax.engine`, `pfedwn_jax.algorithms`: stacked training.
- `pfedwn_jax.em`: EM estimation of aggregation weights.
- `pfedwn_jax.experiment`: configs, the runner and results.
"""

__version__ = "0.1.0"
