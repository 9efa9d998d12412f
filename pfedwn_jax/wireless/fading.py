"""Small-scale fading models behind one seam, and log-normal shadowing of the path loss.

A `Fading` is one small pytree: a static `kind` ("rayleigh", the paper's, "nakagami" or
"rician"), a dynamic shape `param` (Nakagami m, Rician K) and the mean power `gamma` (the
paper's Gamma = E[h^2]). Runs that differ only in `param` or `gamma` share one compiled program.

Everything below works on the *normalised power* u = h^2 / Gamma (mean 1):

* `draw_power(fading, key, shape, dtype)`: the one sampler of u, used by the per-round
  links, both Monte Carlo modes and the mobility path. Rayleigh is `jax.random.exponential`;
  Nakagami-m and Rician-K are built on that same exponential draw, so m = 1 and K = 0 give
  the Rayleigh draws of the same key bit for bit (and draws across m or K are paired).
* `survival(fading, u)` = P(U >= u), `pdf(fading, u)`, `tail_span(fading)`.
* `threshold_moments(fading, b)` = (E[u 1{u >= b}], E[u^2 1{u >= b}]): closed forms for
  Rayleigh and Nakagami, Gauss-Legendre quadrature for Rician.

Shadowing (`shadowing_db`) is a per-link, per-topology normal offset in dB of the path loss,
keyed by the unordered node pair, so it is symmetric and shared by the link's sub-channels.
See docs/wireless.md (fading models) for the derivations.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.scipy.special import gammainc, gammaincc, gammaln, i0e

from pfedwn_jax._checks import check_choice, check_finite, check_range, is_concrete
from pfedwn_jax.wireless.quadrature import integrate_panels

FADING_KINDS = ("rayleigh", "nakagami", "rician")
#: Default shape parameter per kind (the value at which the model is Rayleigh).
DEFAULT_PARAM = {"rayleigh": 1.0, "nakagami": 1.0, "rician": 0.0}
#: Allowed range of the shape parameter: Nakagami m >= 1/2 (its definition); Rician K up to
#: 30 (14.8 dB), where the 96-term series of its survival function is exact to < 1e-17.
PARAM_RANGE = {"nakagami": (0.5, 1e3), "rician": (0.0, 30.0)}
_RICIAN_TERMS = 96
_PANELS = (0.0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5, 56.0)  # in units of `tail_span / 40`
_NODES = 24
_LN10_OVER_10 = 0.23025850929940458


class Fading(struct.PyTreeNode):
    """A small-scale fading model: `kind` (static), shape `param` and mean power `gamma`.

    Attributes:
      kind: "rayleigh" (the paper's), "nakagami" (param = m >= 1/2; m = 1 is Rayleigh) or
        "rician" (param = K >= 0, the line-of-sight to scattered power ratio; K = 0 is
        Rayleigh). Static.
      param: the shape parameter (ignored by "rayleigh"); a number or an array (sweeps).
      gamma: Gamma = E[h^2], the mean power gain of the fading (Table I: 2).
    """

    kind: str = struct.field(pytree_node=False, default="rayleigh")
    param: Any = 1.0
    gamma: Any = 2.0

    def __post_init__(self) -> None:
        check_choice("fading", self.kind, FADING_KINDS)

    def validate(self) -> Fading:
        """`self`, after checking concrete numbers (`ValueError` naming the field and range).

        Not run on construction: JAX rebuilds the dataclass with axis specs or placeholders
        as leaves (`vmap` axes, stacking). `of` and `ChannelParams` call it.
        """
        gamma, param = _numeric(self.gamma), _numeric(self.param)
        if gamma is not None:  # tracers and tree placeholders are left alone
            check_finite("fading.gamma", gamma.astype(float))
            check_range("fading.gamma", gamma, 0.0, None, low_inclusive=False)
        if param is not None and self.kind in PARAM_RANGE:
            low, high = PARAM_RANGE[self.kind]
            what = "m" if self.kind == "nakagami" else "K"
            check_finite(f"fading.param ({self.kind} {what})", param.astype(float))
            check_range(f"fading.param ({self.kind} {what})", param, low, high)
        return self

    @classmethod
    def of(cls, kind: str = "rayleigh", param: Any = None, gamma: Any = 2.0) -> Fading:
        """The model `kind` with `param` (None: the value at which it is Rayleigh)."""
        check_choice("fading", kind, FADING_KINDS)
        return cls(kind, DEFAULT_PARAM[kind] if param is None else param, gamma).validate()

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python record of the model."""
        as_py = lambda v: np.asarray(v).item() if np.ndim(v) == 0 else np.asarray(v).tolist()
        return {"kind": self.kind, "param": as_py(self.param), "gamma": as_py(self.gamma)}


def _numeric(value: Any) -> np.ndarray | None:
    """`value` as a numpy array when it is a concrete number or array, else None."""
    if not is_concrete(value) or isinstance(value, str):
        return None
    arr = np.asarray(value)
    return arr if arr.dtype.kind in "biuf" else None


def traced_fading(fading: Fading) -> Fading:
    """`fading` with float32 array leaves: as the dynamic part of a compiled program's inputs
    (the kind stays static), so runs that differ only in `param` or `gamma` share it."""
    return fading.replace(param=jnp.float32(fading.param), gamma=jnp.float32(fading.gamma))


# --------------------------------------------------------------------------------- draws


def draw_power(fading: Fading, key: Any, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """u = h^2 / Gamma [shape], i.i.d. with mean 1, from one key.

    Rayleigh: E ~ Exp(1) (`jax.random.exponential(key)`). Nakagami-m: E + G with G ~
    Gamma(m - 1) for m > 1, E * B with B ~ Beta(m, 1 - m) for m < 1, divided by m (a
    Gamma(m, 1/m) variable; E alone at m = 1). Rician-K: |sqrt(K) + sqrt(E) e^{i theta}|^2 /
    (K + 1), theta uniform (the scattered part's modulus^2 is E). The extra draws use
    `fold_in(key, 1)`.
    """
    e = jax.random.exponential(key, shape, dtype)
    if fading.kind == "rayleigh":
        return e
    extra = jax.random.fold_in(key, 1)
    p = jnp.asarray(fading.param, dtype)
    if fading.kind == "nakagami":
        tiny = jnp.finfo(dtype).tiny
        up = e + jax.random.gamma(extra, jnp.maximum(p - 1.0, tiny), shape, dtype)
        a = jnp.minimum(p, 1.0)
        down = e * jax.random.beta(extra, a, jnp.maximum(1.0 - a, tiny), shape, dtype)
        return jnp.where(p > 1.0, up, jnp.where(p < 1.0, down, e)) / p
    theta = (2.0 * jnp.pi) * jax.random.uniform(extra, shape, dtype)
    return (p + e + 2.0 * jnp.sqrt(p * e) * jnp.cos(theta)) / (p + 1.0)


def power_moments(fading: Fading) -> tuple[Any, Any]:
    """(E[u], Var[u]) of the normalised power: (1, 1), (1, 1/m), (1, (1 + 2K)/(1 + K)^2)."""
    p = jnp.asarray(fading.param, float)
    if fading.kind == "rayleigh":
        return 1.0, 1.0
    if fading.kind == "nakagami":
        return 1.0, 1.0 / p
    return 1.0, (1.0 + 2.0 * p) / (1.0 + p) ** 2


def shadowing_db(key: Any, receivers: Any, transmitters: Any, sigma_db: Any) -> jax.Array:
    """Shadowing X [L] in dB of each link receiver <-> transmitter: sigma_db * N(0, 1).

    Keyed by the unordered pair (min, max) of node indices, so a link and its reverse share
    it and every use of a pair in one topology (as a link, as an interferer) sees the same
    value. sigma_db = 0 gives exactly 0.
    """
    lo = jnp.minimum(receivers, transmitters)
    hi = jnp.maximum(receivers, transmitters)

    def one(i: Any, j: Any) -> Any:
        return jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, i), j), ())

    z = jax.vmap(one)(jnp.ravel(lo), jnp.ravel(hi)).reshape(jnp.shape(lo))
    return jnp.asarray(sigma_db, z.dtype) * z


def db_to_log(x_db: Any) -> Any:
    """A power ratio in dB as a natural log: x ln(10) / 10."""
    return x_db * _LN10_OVER_10


# ------------------------------------------------------------------------ distribution


def survival(fading: Fading, u: Any) -> Any:
    """P(U >= u) of the normalised power; 1 for u <= 0.

    Rayleigh e^{-u}; Nakagami Q(m, m u) (regularised upper incomplete gamma); Rician, with
    x = (K + 1) u and J ~ Poisson(K): sum_j P(J = j) Q(j + 1, x) = sum_i e^{-x} x^i / i!
    P(J >= i) (the noncentral chi-square as a Poisson mixture; Marcum Q_1 in closed series).
    """
    u = jnp.maximum(u, 0.0)
    if fading.kind == "rayleigh":
        return jnp.exp(-u)
    p = jnp.asarray(fading.param, u.dtype)
    if fading.kind == "nakagami":
        return gammaincc(p, p * u)
    x = (p + 1.0) * u
    log_x = jnp.log(jnp.maximum(x, jnp.finfo(u.dtype).tiny))
    tiny = jnp.finfo(u.dtype).tiny

    def term(i: Any, total: Any) -> Any:  # one term at a time: memory of one [...] array
        k = i.astype(u.dtype)
        tail = jnp.where(i > 0, gammainc(jnp.maximum(k, 1.0), p), 1.0)  # P(J >= i)
        log_t = -x + k * log_x - gammaln(k + 1.0) + jnp.log(jnp.maximum(tail, tiny))
        return total + jnp.where(tail > 0, jnp.exp(log_t), 0.0)

    total = jax.lax.fori_loop(0, _RICIAN_TERMS, term, jnp.zeros_like(x))
    return jnp.where(x > 0, total, 1.0)


def pdf(fading: Fading, u: Any) -> Any:
    """Density of the normalised power at u > 0."""
    u = jnp.maximum(u, jnp.finfo(jnp.result_type(u)).tiny)
    if fading.kind == "rayleigh":
        return jnp.exp(-u)
    p = jnp.asarray(fading.param, u.dtype)
    if fading.kind == "nakagami":
        return jnp.exp(p * jnp.log(p) + (p - 1.0) * jnp.log(u) - p * u - gammaln(p))
    arg = 2.0 * jnp.sqrt(p * (p + 1.0) * u)
    return (p + 1.0) * jnp.exp(arg - p - (p + 1.0) * u) * i0e(arg)


def tail_span(fading: Fading) -> Any:
    """T with P(U >= u0 + T) < e^{-40} P(U >= u0)-ish for any u0 >= 0: beyond it the fading's
    tail is dropped (40 for Rayleigh; (2m + 45)/m and (3K + 45)/(K + 1) for the others)."""
    if fading.kind == "rayleigh":
        return 40.0
    p = jnp.asarray(fading.param)
    if fading.kind == "nakagami":
        return (2.0 * p + 45.0) / p
    return (3.0 * p + 45.0) / (p + 1.0)


def _panels(fading: Fading, b: Any, dtype: Any) -> Any:
    """Composite-rule panel edges [..., 8] from b over the fading's tail."""
    span = jnp.asarray(tail_span(fading), dtype) / 40.0
    return b[..., None] + span[..., None] * jnp.asarray(_PANELS, dtype)


def tail_integral(fading: Fading, fn: Any, b: Any, dtype: Any) -> Any:
    """int_b^inf fn(u) pdf(u) du by the composite Gauss-Legendre rule (b [...] -> [...])."""
    b = jnp.asarray(b, dtype)
    edges = _panels(fading, b, dtype)
    return integrate_panels(lambda u: fn(u) * pdf(fading, u), edges, _NODES, dtype)


def threshold_moments(fading: Fading, beta: Any) -> tuple[Any, Any]:
    """(E[h^2 1{h >= beta}], E[h^4 1{h >= beta}]) of one fading amplitude h.

    With b = beta^2 / Gamma: Rayleigh Gamma (b + 1) e^{-b}, Gamma^2 (b^2 + 2b + 2) e^{-b} (the
    App. A integrals); Nakagami Gamma Q(m + 1, m b), Gamma^2 (m + 1)/m Q(m + 2, m b); Rician
    by quadrature of the density.
    """
    g = fading.gamma
    b = beta**2 / g
    if fading.kind == "rayleigh":
        e = jnp.exp(-b)
        return g * (b + 1.0) * e, g * g * (b * b + 2.0 * b + 2.0) * e
    if fading.kind == "nakagami":
        p = jnp.asarray(fading.param)
        return g * gammaincc(p + 1.0, p * b), g * g * (p + 1.0) / p * gammaincc(p + 2.0, p * b)
    dtype = jnp.result_type(b, float)
    t1 = tail_integral(fading, lambda u: u, b, dtype)
    return g * t1, g * g * tail_integral(fading, lambda u: u * u, b, dtype)
