"""EM estimation of pFedWN's aggregation weights (paper Sec. IV-B, Alg. 1, App. B).

A target's data is modelled as a mixture of its selected neighbors' distributions with weights
`pi` on the simplex. With the neighbors' models fixed, one EM iteration is

- E-step: `lambda[m, i] = pi_m exp(-loss[m, i]) / sum_m' pi_m' exp(-loss[m', i])`
  (the posterior that sample `i` came from neighbor `m`), computed in log space so losses of
  1e4 stay finite;
- M-step: `pi_m = mean_i lambda[m, i]` over the target's valid samples.

`estimate_weights` iterates the two until `max |delta pi| < tol` or `num_iters`, inside one
`lax.while_loop`. Everything is batched over any leading dimensions (targets, experiments), so
all targets of a network are estimated in one op. The full EM with responsibility-weighted
component updates (App. B, M-step 2) lives in `pfedwn_jax.algorithms.pfedwn_em` and calls
`responsibilities` / `estimate_weights` between training steps.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax._checks import check_finite, check_int, check_range, is_concrete

__all__ = ["estimate_weights", "m_step", "near_uniform", "responsibilities"]

#: Default maximum number of EM iterations with fixed models (ours; converges in a few tens).
DEFAULT_NUM_ITERS = 200
#: Default stopping tolerance on `max |delta pi|` (ours).
DEFAULT_TOL = 1e-6


def _masks(
    losses: jax.Array, sample_mask: Any | None, neighbor_mask: Any | None
) -> tuple[jax.Array, jax.Array]:
    """Broadcast the masks to `[..., samples]` and `[..., neighbors]` booleans (None: all)."""
    lead, (m, n) = losses.shape[:-2], losses.shape[-2:]

    def full(mask: Any | None, size: int) -> jax.Array:
        return jnp.broadcast_to(jnp.asarray(True if mask is None else mask, bool), (*lead, size))

    return full(sample_mask, n), full(neighbor_mask, m)


def _validate(losses: Any, sample_mask: Any, neighbor_mask: Any, prior: Any) -> jax.Array:
    """Host-side checks of shapes and values; returns `losses` as a float array."""
    losses = jnp.asarray(losses)
    if losses.ndim < 2:
        raise ValueError(
            f"losses must have shape [..., neighbors, samples] (ndim >= 2); got {losses.shape}"
        )
    if not jnp.issubdtype(losses.dtype, jnp.floating):
        losses = losses.astype(jnp.float32)
    check_finite("losses", losses)
    lead, (m, n) = losses.shape[:-2], losses.shape[-2:]
    for name, value, shape in (
        ("sample_mask", sample_mask, (*lead, n)),
        ("neighbor_mask", neighbor_mask, (*lead, m)),
        ("prior", prior, (*lead, m)),
    ):
        if value is None:
            continue
        vshape = np.shape(value)
        try:
            ok = np.broadcast_shapes(vshape, shape) == shape
        except ValueError:  # not broadcastable at all
            ok = False
        if not ok:
            raise ValueError(f"{name} must broadcast to shape {shape}; got {vshape}")
    if prior is not None:
        check_finite("prior", prior)
        check_range("prior", prior, 0.0, None)
    return losses


def _log_prior(prior: Any | None, nmask: jax.Array, dtype: Any) -> jax.Array:
    """`log pi` of the normalised prior over the valid neighbors (uniform by default)."""
    if prior is None:
        p = nmask.astype(dtype)
    else:
        p = jnp.broadcast_to(jnp.asarray(prior, dtype), nmask.shape) * nmask
    total = p.sum(-1, keepdims=True)
    p = jnp.where(total > 0, p / jnp.where(total > 0, total, 1), 0)
    return jnp.log(p)


def _responsibilities_log(
    losses: jax.Array, log_pi: jax.Array, smask: jax.Array, nmask: jax.Array
) -> jax.Array:
    """E-step from `log pi [..., M]`: `lambda [..., M, N]`, zero on masked entries."""
    valid = nmask[..., :, None] & smask[..., None, :]
    logits = jnp.where(valid, log_pi[..., :, None] - losses, -jnp.inf)
    top = jnp.max(logits, axis=-2, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    unnorm = jnp.exp(logits - top)  # exp(-inf) = 0 for masked entries
    total = unnorm.sum(-2, keepdims=True)
    return unnorm / jnp.where(total > 0, total, 1.0)


def responsibilities(
    losses: Any,
    pi: Any | None = None,
    sample_mask: Any | None = None,
    neighbor_mask: Any | None = None,
) -> jax.Array:
    """E-step: posterior `lambda [..., neighbors, samples]` of each neighbor for each sample.

    Args:
      losses: `[..., M, N]` per-sample negative log-likelihoods `-log p_m(y_i | x_i)` of each
        neighbor's model on the target's samples (e.g. `cross_evaluate(...)["loss"]`).
      pi: `[..., M]` current mixture weights (need not be normalised); uniform if None.
      sample_mask: `[..., N]` bool, True for the target's real samples.
      neighbor_mask: `[..., M]` bool, True for selected neighbors.

    Returns:
      `[..., M, N]` responsibilities: for every valid sample they sum to 1 over the valid
      neighbors; entries of padded samples or unselected neighbors are exactly 0 (a sample
      row with no valid neighbor is all 0). Computed with a log-sum-exp, so finite for any
      finite losses.
    """
    losses = _validate(losses, sample_mask, neighbor_mask, pi)
    smask, nmask = _masks(losses, sample_mask, neighbor_mask)
    return _responsibilities_log(losses, _log_prior(pi, nmask, losses.dtype), smask, nmask)


def m_step(
    lam: Any,
    sample_mask: Any | None = None,
    neighbor_mask: Any | None = None,
    floor: float = 0.0,
) -> jax.Array:
    """M-step for pi (App. B, Eq. M-step-1): `pi_m = mean_i lambda[m, i]` over valid samples.

    `lam [..., M, N]` are responsibilities; `floor` then maps `pi <- floor + (1 - k floor) pi`
    over the `k` valid neighbors, so the result stays on the simplex with `pi >= floor` exactly
    (the floor is capped at `1/k`). Returns `pi [..., M]`, 0 for unselected neighbors.
    """
    lam = jnp.asarray(lam)
    check_range("floor", floor, 0.0, 1.0)
    smask, nmask = _masks(lam, sample_mask, neighbor_mask)
    return _pi_update(lam, smask, nmask, floor)


def _pi_update(
    lam: jax.Array, smask: jax.Array, nmask: jax.Array, floor: float | jax.Array
) -> jax.Array:
    """`pi = mean_i lam` over valid samples, then the floor over valid neighbors."""
    count = smask.sum(-1, keepdims=True).astype(lam.dtype)  # [..., 1]
    pi = lam.sum(-1) / jnp.maximum(count, 1.0)
    # exact renormalisation removes float32 summation drift over many samples
    mass = pi.sum(-1, keepdims=True)
    pi = pi / jnp.where(mass > 0, mass, 1.0)
    k = nmask.sum(-1, keepdims=True).astype(lam.dtype)
    fl = jnp.minimum(jnp.asarray(floor, lam.dtype), 1.0 / jnp.maximum(k, 1.0))
    pi = jnp.where(nmask, fl + (1.0 - k * fl) * pi, 0.0)
    # A target without samples keeps the (floored) uniform weights rather than all zeros.
    uniform = nmask / jnp.maximum(k, 1.0)
    return jnp.where(count > 0, pi, uniform)


@overload
def estimate_weights(
    losses: Any,
    sample_mask: Any | None = None,
    neighbor_mask: Any | None = None,
    prior: Any | None = None,
    num_iters: int = DEFAULT_NUM_ITERS,
    tol: float = DEFAULT_TOL,
    floor: float = 0.0,
    *,
    return_info: Literal[False] = False,
) -> jax.Array: ...


@overload
def estimate_weights(
    losses: Any,
    sample_mask: Any | None = None,
    neighbor_mask: Any | None = None,
    prior: Any | None = None,
    num_iters: int = DEFAULT_NUM_ITERS,
    tol: float = DEFAULT_TOL,
    floor: float = 0.0,
    *,
    return_info: Literal[True],
) -> tuple[jax.Array, dict[str, jax.Array]]: ...


def estimate_weights(
    losses: Any,
    sample_mask: Any | None = None,
    neighbor_mask: Any | None = None,
    prior: Any | None = None,
    num_iters: int = DEFAULT_NUM_ITERS,
    tol: float = DEFAULT_TOL,
    floor: float = 0.0,
    *,
    return_info: bool = False,
) -> jax.Array | tuple[jax.Array, dict[str, jax.Array]]:
    """Mixture weights `pi [..., neighbors]` by EM with fixed neighbor models.

    Iterates E-step (`responsibilities`) and the pi update (`pi_m = mean_i lambda[m, i]`, then
    the floor) from `prior` until `max |delta pi| < tol` over the whole batch or `num_iters`
    iterations, in one `lax.while_loop`. Pure and jittable; batched over leading dimensions.

    Args:
      losses: `[..., M, N]` per-sample negative log-likelihoods of neighbor `m`'s model on the
        target's sample `i`; finite.
      sample_mask: `[..., N]` bool, True for the target's real samples (default: all).
      neighbor_mask: `[..., M]` bool, True for selected neighbors (default: all). Unselected
        neighbors get exactly 0.
      prior: `[..., M]` nonnegative initial weights, normalised over the valid neighbors
        (default: uniform, the paper's uninformative prior). A valid neighbor with prior 0
        stays at 0 unless `floor > 0` (EM cannot revive a zero weight).
      num_iters: maximum number of EM iterations (>= 1).
      tol: stop when `max |pi_new - pi| < tol`.
      floor: lower bound for every valid neighbor's weight, in `[0, 1]` (capped at `1/k` for
        `k` valid neighbors); 0 gives the plain maximum-likelihood EM.
      return_info: also return `{"iterations": int, "delta": float}`.

    Returns:
      `pi [..., M]`: nonnegative, summing to 1 over the valid neighbors (all zero for a row
      without valid neighbors); and the info dict when `return_info`.
    """
    losses = _validate(losses, sample_mask, neighbor_mask, prior)
    if is_concrete(num_iters):
        num_iters = check_int("num_iters", num_iters, 1, None)
    check_range("tol", tol, 0.0, None)
    check_range("floor", floor, 0.0, 1.0)
    smask, nmask = _masks(losses, sample_mask, neighbor_mask)
    pi0 = jnp.exp(_log_prior(prior, nmask, losses.dtype))
    pi, it, delta = _em_loop(losses, pi0, smask, nmask, num_iters, tol, floor)
    if return_info:
        return pi, {"iterations": it, "delta": delta}
    return pi


@jax.jit
def _em_loop(
    losses: jax.Array,
    pi0: jax.Array,
    smask: jax.Array,
    nmask: jax.Array,
    num_iters: int | jax.Array,
    tol: float | jax.Array,
    floor: float | jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The fixed-model EM iteration; `(pi, iterations, last max |delta pi|)`."""

    def step(pi: jax.Array) -> jax.Array:
        lam = _responsibilities_log(losses, jnp.log(pi), smask, nmask)
        return _pi_update(lam, smask, nmask, floor)

    def cond(carry: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
        _, it, delta = carry
        return (it < num_iters) & (delta >= tol)

    def body(carry: tuple[jax.Array, jax.Array, jax.Array]):
        pi, it, _ = carry
        new = step(pi)
        return new, it + 1, jnp.max(jnp.abs(new - pi), initial=0.0)

    init = (pi0, jnp.asarray(0, jnp.int32), jnp.asarray(jnp.inf, losses.dtype))
    return jax.lax.while_loop(cond, body, init)


def near_uniform(
    losses: jax.Array, sample_mask: jax.Array, num_classes: int, guard: float
) -> jax.Array:
    """``[..., M]`` bool: neighbor ``m``'s model predicts nearly uniformly on the target's
    samples: its per-sample losses stay within ``guard * log C`` of ``log C`` on average
    (``C = num_classes``), ``mean_i |loss[m, i] - log C| < guard log C`` over the valid
    samples. A barely trained model (a few steps from the shared initial model) does; a
    trained one, right (loss near 0) or confidently wrong (loss far above ``log C``), does
    not. ``losses [..., M, N]``, ``sample_mask [..., N]``; ``guard = 0`` marks none."""
    log_c = float(np.log(num_classes))
    w = jnp.asarray(sample_mask, losses.dtype)[..., None, :]
    dev = (jnp.abs(losses - log_c) * w).sum(-1) / jnp.maximum(w.sum(-1), 1.0)
    return dev < guard * log_c
