"""Retransmissions (ARQ): how many attempts a link makes and whether one of them succeeds.

A link gets up to ``1 + retries`` attempts; each fails independently with the link's
per-attempt failure probability `p` (its P_err, or a fixed failure), and the sender stops at
the first success. The first attempt is the link model's own draw of the round (so with
``retries = 0`` nothing changes); later attempts are fresh draws (each attempt sees its own
channel: the fading block is one attempt long). Then the number of attempts `N` is

    P(N = n) = p^(n-1) (1 - p)   for 1 <= n <= R,     P(N = R + 1) = p^R,

(`R` retries), ``E N = (1 - p^(R+1)) / (1 - p)``, and the link fails for the round with
probability ``p^(R+1)``. All functions are elementwise over links (e.g. `[S, K]`), jittable.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def expected_attempts(p: Any, retries: Any) -> Any:
    """``E N = sum_{n=0}^{R} p^n = (1 - p^(R+1)) / (1 - p)`` (``R + 1`` at ``p = 1``)."""
    p = jnp.asarray(p, jnp.float32)
    tries = jnp.asarray(retries, jnp.float32) + 1.0
    safe = jnp.where(p < 1.0, p, 0.0)
    return jnp.where(p < 1.0, (1.0 - safe**tries) / (1.0 - safe), tries)


def first_success(key: jax.Array, p: Any) -> jax.Array:
    """The index (1, 2, ...) of the first successful attempt of links failing each attempt
    with probability `p`: a Geometric(1 - p) draw, ``floor(ln U / ln p) + 1`` by inversion
    (1 at ``p = 0``; a number beyond any retry limit, 2^30, at ``p = 1``). float32, shape of p."""
    p = jnp.asarray(p, jnp.float32)
    u = jax.random.uniform(key, p.shape, jnp.float32, minval=jnp.finfo(jnp.float32).tiny)
    inner = (p > 0.0) & (p < 1.0)
    log_p = jnp.log(jnp.where(inner, p, 0.5))
    draw = jnp.floor(jnp.log(u) / log_p) + 1.0
    return jnp.where(p <= 0.0, 1.0, jnp.where(p >= 1.0, 2.0**30, jnp.minimum(draw, 2.0**30)))


def arq_attempts(
    key: jax.Array, first_ok: jax.Array, p: Any, retries: Any
) -> tuple[jax.Array, jax.Array]:
    """`(attempts int32, delivered bool)` per link under ARQ with ``retries`` retries.

    ``first_ok`` is the link model's draw for the first attempt; a link that failed it makes
    up to ``retries`` more attempts, each failing with probability ``p``.
    """
    retries = jnp.asarray(retries, jnp.float32)
    more = first_success(key, jnp.broadcast_to(jnp.asarray(p, jnp.float32), first_ok.shape))
    attempts = jnp.where(first_ok, 1.0, 1.0 + jnp.minimum(more, retries))
    return attempts.astype(jnp.int32), first_ok | (more <= retries)
