"""Host-side checks and broadcasting of the wireless API inputs (before any tracing)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from pfedwn_jax._checks import check_choice, check_finite, check_range, is_concrete
from pfedwn_jax.devices import check_device_bytes
from pfedwn_jax.wireless.channel import MOMENT_MODES
from pfedwn_jax.wireless.params import ChannelParams


def float_dtype() -> Any:
    """float64 when `jax_enable_x64` is on, else float32."""
    return jnp.result_type(float)


class Links(struct.PyTreeNode):
    """Validated link inputs with a common batch shape `[...]` (default float dtype).

    target [..., 2], neighbor [..., n, 2] positions (m), gamma_th [...] SINR threshold,
    valid [..., n] bool (padded slots neither receive nor interfere), shadow [..., n] the
    shadowing (dB) of each neighbor -> target link or None (no shadowing).
    """

    target: Any
    neighbor: Any
    gamma_th: Any
    valid: Any
    shadow: Any = None


def _shape(name: str, x: Any) -> tuple[int, ...]:
    try:
        return tuple(np.shape(x))
    except Exception as e:
        raise ValueError(f"{name} must be an array of numbers; got {type(x).__name__}") from e


def link_inputs(
    target_xy: Any,
    neighbor_xy: Any,
    gamma_th: Any,
    valid: Any,
    params: Any,
    moments: str | None = None,
    *,
    footprint: Callable[[int, int, int], int] | None = None,
    caller: str = "error_probability",
    change: str | None = None,
    shadow_db: Any = None,
) -> tuple[Links, ChannelParams]:
    """Validate and broadcast the link-level inputs: `(Links, params)`.

    `footprint(targets, n, itemsize)`: the caller's device bytes for `targets` (the batch
    size) x `n` links, checked (`check_link_bytes`, with `change` as the advice) before any
    array is placed on a device.
    """
    if not isinstance(params, ChannelParams):
        raise ValueError(f"params must be a ChannelParams; got {type(params).__name__}")
    if moments is not None:
        check_choice("moments", moments, MOMENT_MODES)
    batch, n = _batch_shape(target_xy, neighbor_xy, gamma_th, valid)
    if footprint is not None:
        targets = math.prod(batch)
        need = footprint(targets, n, jnp.dtype(float_dtype()).itemsize)
        check_link_bytes(caller, need, targets, n, change)
    for name, x in (("target_xy", target_xy), ("neighbor_xy", neighbor_xy), ("gamma_th", gamma_th)):
        check_finite(name, x)
    check_range("gamma_th", gamma_th, 0.0, None, low_inclusive=False)
    valid_arr = _valid_mask(valid, (*batch, n))
    dtype = float_dtype()
    target = _as(target_xy, dtype, (*batch, 2))
    neighbor = _as(neighbor_xy, dtype, (*batch, n, 2))
    gamma = _as(gamma_th, dtype, batch)
    shadow = None if shadow_db is None else _shadow(shadow_db, dtype, (*batch, n))
    # params go to the jitted cores as they are: Python-number fields are weakly typed, so
    # they follow the positions' dtype and new values never trigger recompilation.
    return Links(target, neighbor, gamma, valid_arr, shadow), params


def _batch_shape(
    target_xy: Any, neighbor_xy: Any, gamma_th: Any, valid: Any
) -> tuple[tuple[int, ...], int]:
    """`(batch, n)`: the broadcast batch shape of the link inputs and the links per target;
    `ValueError` naming the shapes where one is wrong or they do not broadcast."""
    t_shape, n_shape, g_shape = (
        _shape("target_xy", target_xy),
        _shape("neighbor_xy", neighbor_xy),
        _shape("gamma_th", gamma_th),
    )
    if len(t_shape) < 1 or t_shape[-1] != 2:
        raise ValueError(f"target_xy must have shape [..., 2]; got {list(t_shape)}")
    if len(n_shape) < 2 or n_shape[-1] != 2 or n_shape[-2] < 1:
        raise ValueError(
            f"neighbor_xy must have shape [..., n, 2] with n >= 1; got {list(n_shape)}"
        )
    v_shape = None if valid is None else _shape("valid", valid)
    if v_shape is not None and (len(v_shape) < 1 or v_shape[-1] not in (1, n_shape[-2])):
        raise ValueError(
            f"valid must have shape [..., n] with n = {n_shape[-2]}; got {list(v_shape)}"
        )
    shapes = [t_shape[:-1], n_shape[:-2], g_shape] + ([] if v_shape is None else [v_shape[:-1]])
    try:
        batch = jnp.broadcast_shapes(*shapes)
    except ValueError as e:
        raise ValueError(
            f"batch shapes do not broadcast: target_xy {list(t_shape)} ([..., 2]), "
            f"neighbor_xy {list(n_shape)} ([..., n, 2]), gamma_th {list(g_shape)} ([...])"
            + ("" if v_shape is None else f", valid {list(v_shape)} ([..., n])")
        ) from e
    return batch, n_shape[-2]


def _valid_mask(valid: Any, shape: tuple[int, ...]) -> Any:
    """`valid` (None: every link) as a bool array of `shape` `[..., n]`."""
    if valid is None:
        return jnp.ones(shape, bool)
    if is_concrete(valid) and np.asarray(valid).dtype != bool:
        raise ValueError(f"valid must be a boolean mask; got dtype {np.asarray(valid).dtype}")
    return _as(valid, bool, shape)


def _shadow(shadow_db: Any, dtype: Any, shape: tuple[int, ...]) -> Any:
    """The per-link shadowing `shadow_db` (dB) checked and broadcast to `shape` `[..., n]`."""
    s_shape = _shape("shadow_db", shadow_db)
    try:
        jnp.broadcast_shapes(s_shape, shape)
    except ValueError as e:
        raise ValueError(
            f"shadow_db must broadcast to [..., n] = {list(shape)}; got {list(s_shape)}"
        ) from e
    check_finite("shadow_db", shadow_db)
    return _as(shadow_db, dtype, shape)


def _as(x: Any, dtype: Any, shape: tuple[int, ...]) -> Any:
    """`x` as a `dtype` array of `shape` (broadcasting only when needed)."""
    if not isinstance(x, (jax.Array, jax.core.Tracer)):
        x = np.asarray(x, dtype)  # host data: one conversion, one transfer
    x = jnp.asarray(x, dtype)
    return x if x.shape == shape else jnp.broadcast_to(x, shape)


def check_link_bytes(
    caller: str, need: int, targets: int, n: int, change: str | None = None
) -> None:
    """The size guard of a link-level call: `ValueError` (estimate, budget, what to change)
    when `need` bytes for `targets` x `n` links do not fit the device. `change` (None: the
    advice for `error_probability`) says what to do instead."""
    what = f"{caller} of {targets} target(s) x {n} neighbor(s)"
    check_device_bytes(need, what, change or _perr_advice(targets, n))


def _perr_advice(targets: int, n: int) -> str:
    """What to change when a dense P_err call is too big: its `[n, n]` part or its links."""
    if n > 24 * targets:  # the [n, n] interference terms dominate
        return (
            "the neighbors of one target all interfere with each other ([n, n] terms): for "
            "very many neighbors use candidate lists (sparse_error_probability with "
            "interference='radius' or 'nearest')"
        )
    return (
        "give fewer links per call: split the targets (the leading axes) into chunks, "
        "as experiment.federation.network_perr does"
    )
