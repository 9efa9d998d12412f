"""Device profiles and local training time: how long a node computes and what it draws.

A node's round of local training costs ``train_flops_per_sample x samples x epochs`` floating
point operations; on a device of ``flops_per_s`` sustained FLOP/s it takes
``compute_s = that / flops_per_s`` seconds and ``power_w x compute_s`` joules.

``train_flops_per_sample`` counts the FLOPs of one training step with XLA's cost analysis
of the compiled gradient (``jax.jit(jax.grad(loss)).lower(...).cost_analysis()``, before
optimisation), divided by its batch: forward and backward pass, whatever the model's layers.

Device profiles are drawn per node from a named distribution (``draw_devices``):

- ``"fixed"``: every node is ``profiles[0]``;
- ``"mix"``: each node one of ``profiles``, drawn with ``weights`` (default equal);
- ``"lognormal"``: ``profiles[0]`` with its FLOP/s scaled by ``exp(N(0, sigma^2))`` per node
  (power unchanged): a spread of speeds around one device.

``DEVICE_PROFILES`` are nominal figures for orientation (sustained fp32 FLOP/s of the CPU or
GPU a small model trains on, and the board's power under load), not measurements; pass your
own ``(flops_per_s, power_w)`` pairs for a study that rests on them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax._checks import check_choice, check_float, check_int

#: name -> (sustained FLOP/s, power under load W); nominal, see the module docstring.
DEVICE_PROFILES: dict[str, tuple[float, float]] = {
    "microcontroller": (0.2e9, 0.5),
    "raspberry-pi-4": (10e9, 6.0),
    "smartphone": (50e9, 3.0),
    "jetson-nano": (200e9, 10.0),
    "laptop": (300e9, 30.0),
}

DEVICE_DISTRIBUTIONS = ("fixed", "mix", "lognormal")

Profile = str | tuple[float, float]


class Devices(flax.struct.PyTreeNode):
    """Each node's device: ``flops_per_s`` and ``power_w``, `[S]` float32."""

    flops_per_s: jax.Array
    power_w: jax.Array


def _profile(p: Profile) -> tuple[float, float]:
    if isinstance(p, str):
        check_choice("device profile", p, DEVICE_PROFILES)
        return DEVICE_PROFILES[p]
    flops, power = p
    flops = check_float("flops_per_s", flops, 0.0, low_inclusive=False)
    return flops, check_float("power_w", power, 0.0)


def draw_devices(
    seed: int,
    num: int,
    distribution: str = "fixed",
    profiles: Sequence[Profile] = ("smartphone",),
    weights: Sequence[float] | None = None,
    sigma: float = 0.5,
) -> Devices:
    """``num`` nodes' devices drawn from ``distribution`` (``DEVICE_DISTRIBUTIONS``) over
    ``profiles`` (names in ``DEVICE_PROFILES`` or ``(flops_per_s, power_w)`` pairs), with a
    NumPy generator seeded by ``seed`` (host set-up, reproducible)."""
    check_choice("device distribution", distribution, DEVICE_DISTRIBUTIONS)
    num = check_int("num", num, 1)
    if not profiles:
        raise ValueError("profiles must name at least one device profile")
    table = np.array([_profile(p) for p in profiles], np.float64)
    rng = np.random.default_rng(seed)
    if distribution == "mix":
        w = np.ones(len(table)) if weights is None else np.asarray(weights, np.float64)
        if w.shape != (len(table),) or np.any(w < 0) or not w.sum() > 0:
            raise ValueError(
                f"weights must be {len(table)} non-negative numbers, not all 0; got {weights}"
            )
        chosen = table[rng.choice(len(table), size=num, p=w / w.sum())]
    else:
        chosen = np.repeat(table[:1], num, axis=0)
        if distribution == "lognormal":
            sigma = check_float("sigma", sigma, 0.0)
            chosen[:, 0] *= np.exp(rng.normal(0.0, sigma, num))
    return Devices(jnp.asarray(chosen[:, 0], jnp.float32), jnp.asarray(chosen[:, 1], jnp.float32))


def train_flops_per_sample(
    apply: Callable[[Any, jax.Array], jax.Array], params: Any, x: Any, y: Any
) -> float:
    """FLOPs of one sample's training step: XLA's count for the gradient of the mean
    cross-entropy of ``apply(params, x)`` (one client's params, a batch ``x [B, ...]``,
    labels ``y [B]``), over `B`. Arrays or ``jax.ShapeDtypeStruct``s: nothing is run."""

    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        logits = apply(p, x)
        return -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1).mean()

    analysis = jax.jit(jax.grad(loss)).lower(params, x, y).cost_analysis()
    if isinstance(analysis, list | tuple):
        analysis = analysis[0] if analysis else None
    flops = None if analysis is None else analysis.get("flops")
    if flops is None or not flops > 0:
        raise ValueError(
            "this backend gives no FLOP count for the model; pass train_flops_per_sample "
            "yourself (about 6 x parameters for a dense model)"
        )
    return float(flops) / int(x.shape[0])


def compute_seconds(
    flops_per_sample: Any, samples: Any, epochs: Any, flops_per_s: Any
) -> jax.Array:
    """`[S]` local training time: ``flops_per_sample x samples x epochs / flops_per_s``."""
    work = jnp.asarray(flops_per_sample, jnp.float32) * jnp.asarray(samples, jnp.float32)
    return (work * jnp.asarray(epochs, jnp.float32) / flops_per_s).astype(jnp.float32)
