"""Input validation shared by the public API.

Every public entry point checks its arguments on the host *before* tracing, so a bad value
fails with a `ValueError` that names the argument and what is allowed, never with a
traceback from deep inside JAX.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import chex
import jax
import numpy as np


def is_concrete(x: Any) -> bool:
    """True when `x` holds host-readable values (not a tracer under jit/vmap)."""
    try:
        np.asarray(x)
    except Exception:  # jax raises TracerArrayConversionError for tracers
        return False
    return True


def check_finite(name: str, x: Any) -> None:
    """Raise `ValueError` if a concrete array contains NaN or infinity (no-op on tracers)."""
    if not is_concrete(x):
        return
    arr = np.asarray(x)
    if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
        bad = arr[~np.isfinite(arr)].ravel()[0].item()
        raise ValueError(f"{name} must be finite; found {bad!r}")


def check_range(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> None:
    """Raise `ValueError` naming `name` unless every concrete value lies in the range."""
    if not is_concrete(value):
        return
    arr = np.asarray(value, dtype=float)
    lo_s = "[" if low_inclusive and low is not None else "("
    hi_s = "]" if high_inclusive and high is not None else ")"
    allowed = f"{lo_s}{'-inf' if low is None else low}, {'inf' if high is None else high}{hi_s}"
    if np.any(np.isnan(arr)):
        raise ValueError(f"{name} must be a number in {allowed}; got NaN")
    ok = np.ones(arr.shape, dtype=bool)
    if low is not None:
        ok &= (arr >= low) if low_inclusive else (arr > low)
    if high is not None:
        ok &= (arr <= high) if high_inclusive else (arr < high)
    if not np.all(ok):
        bad = float(arr[~ok].ravel()[0])
        shown = int(bad) if math.isfinite(bad) and bad.is_integer() else bad
        raise ValueError(f"{name} must be in {allowed}; got {shown!r}")


def check_int(name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """Return `value` as int, raising `ValueError` unless it is an integer in [low, high]."""
    try:
        integral = not isinstance(value, bool | str | bytes) and float(value).is_integer()
    except (TypeError, ValueError):  # a tuple, a string, an array of several values...
        integral = False
    if not integral:
        raise ValueError(f"{name} must be an integer; got {value!r}")
    check_range(name, value, low, high)
    return int(value)


def check_choice(name: str, value: Any, allowed: Any) -> None:
    """Raise `ValueError` unless `value` is one of `allowed`."""
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}; got {value!r}")


def _with_shape(x: Any) -> Any:
    """`x` itself when it has a `.shape` (arrays, tracers), else `np.asarray(x)` (lists, scalars).

    chex reads `.shape` and treats a Python sequence as several inputs; this makes it one array.
    """
    return x if hasattr(x, "shape") else np.asarray(x)


def _chex_detail(err: AssertionError) -> str:
    """The first line of a chex failure, without its `[Chex] Assertion ... failed: ` prefix."""
    detail = str(err).split(" failed: ", 1)[-1].splitlines()[0]
    return detail.replace("Tree leaf ''", "the array")  # a bare array has the empty path


def check_shape(name: str, x: Any, shape: Sequence[int | None], what: str = "") -> None:
    """Raise `ValueError` unless `x` has `shape` (`None` matches any size; `chex.assert_shape`).

    `what` names the axes in the message, e.g. `"[S, max_samples]"`. Static shapes only: also
    valid on tracers, at trace time. Like every chex assertion, a no-op after
    `chex.disable_asserts()`.
    """
    try:
        chex.assert_shape(_with_shape(x), tuple(shape))
    except AssertionError as err:
        named = f"{what} = " if what else ""
        raise ValueError(
            f"{name} must have shape {named}{tuple(shape)}; got {np.shape(x)}"
        ) from err


def check_rank(name: str, x: Any, rank: int, what: str = "") -> None:
    """Raise `ValueError` unless `x` has `rank` axes (`chex.assert_rank`; `what`: e.g. `"[S]"`)."""
    try:
        chex.assert_rank(_with_shape(x), rank)
    except AssertionError as err:
        named = f" {what}" if what else ""
        raise ValueError(
            f"{name} must be a {rank}-D{named} array; got shape {np.shape(x)}"
        ) from err


def check_tree_leading(name: str, tree: Any, num_slots: int) -> None:
    """Raise `ValueError` unless every leaf of `tree` has leading axis `num_slots` (`[S, ...]`).

    `chex.assert_tree_shape_prefix` on static shapes (valid on tracers, at trace time); the
    message names the first bad leaf by its path.
    """
    try:
        chex.assert_tree_shape_prefix(jax.tree.map(_with_shape, tree), (num_slots,))
    except AssertionError as err:
        raise ValueError(
            f"{name} must have leading axis S={num_slots} on every leaf ([S, ...]); "
            f"{_chex_detail(err)}"
        ) from err
