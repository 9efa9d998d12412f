"""Input validation shared by the public API.

Every public entry point checks its arguments on the host *before* tracing, so a bad value
fails with a `ValueError` that names the argument and what is allowed, never with a
traceback from deep inside JAX.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Sequence
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


def _allowed(low: float | None, high: float | None, low_inc: bool, high_inc: bool) -> str:
    """The interval `[low, high)` etc. as text, with open ends shown as +-inf."""
    lo_s = "[" if low_inc and low is not None else "("
    hi_s = "]" if high_inc and high is not None else ")"
    return f"{lo_s}{'-inf' if low is None else low}, {'inf' if high is None else high}{hi_s}"


def _shown(value: Any, limit: int = 60) -> str:
    """`repr(value)`, cut to `limit` characters (a huge int or array stays readable)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_range(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> Any:
    """Return `value` (any shape) unchanged; `ValueError` naming `name` unless every concrete
    value is a number in the range (strings are never coerced)."""
    if not is_concrete(value):
        return value
    allowed = _allowed(low, high, low_inclusive, high_inclusive)
    raw = np.asarray(value)
    if raw.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be a number in {allowed}; got {_shown(value)}")
    arr = raw.astype(float)
    if np.any(np.isnan(arr)):
        raise ValueError(f"{name} must be a number in {allowed}; got NaN")
    ok = np.ones(arr.shape, dtype=bool)
    if low is not None:
        ok &= (arr >= low) if low_inclusive else (arr > low)
    if high is not None:
        ok &= (arr <= high) if high_inclusive else (arr < high)
    if not np.all(ok):
        bad = raw[~ok].ravel()[0].item()
        shown = int(bad) if isinstance(bad, float) and bad.is_integer() else bad
        raise ValueError(f"{name} must be in {allowed}; got {shown!r}")
    return value


def _real_scalar(value: Any) -> int | float | None:
    """`value` as a Python int/float if it is one real number (not a bool, string, list,
    array of several values or tracer), else None. 0-d numpy/JAX arrays count as numbers."""
    if isinstance(value, bool | np.bool_ | str | bytes) or value is None:
        return None
    if not isinstance(value, numbers.Real):
        if not (hasattr(value, "dtype") and np.ndim(value) == 0 and is_concrete(value)):
            return None
        value = np.asarray(value)
        if value.dtype.kind not in "iuf":
            return None
        value = value.item()
    if isinstance(value, numbers.Integral):
        return int(value)
    return float(value)


def check_int(name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """Return `value` as a Python int (2.0 -> 2); `ValueError` unless it is an integer (not
    a bool, string or fractional/non-finite float) in [low, high]."""
    x = _real_scalar(value)
    if isinstance(x, float) and math.isfinite(x) and x.is_integer():
        x = int(x)
    if not isinstance(x, int):
        raise ValueError(f"{name} must be an integer; got {_shown(value)}")
    if (low is not None and x < low) or (high is not None and x > high):
        raise ValueError(f"{name} must be in {_allowed(low, high, True, True)}; got {_shown(x)}")
    return x


def check_float(
    name: str, value: Any, low: float | None = None, high: float | None = None, **inclusive: bool
) -> float:
    """Return `value` as a finite Python float; `ValueError` naming `name` unless it is one
    real number (not a bool, string, list or array) in the range, and not NaN or infinite.

    `inclusive`: `low_inclusive` / `high_inclusive` as in `check_range` (default True).
    """
    x = _real_scalar(value)
    try:
        x = None if x is None else float(x)
    except OverflowError:  # an int beyond the float range
        x = math.inf
    if x is None or not math.isfinite(x):
        interval = _allowed(
            low, high, inclusive.get("low_inclusive", True), inclusive.get("high_inclusive", True)
        )
        what = "a number" if x is None else "a finite number"
        where = "" if low is None and high is None else f" in {interval}"
        raise ValueError(f"{name} must be {what}{where}; got {_shown(value)}")
    check_range(name, x, low, high, **inclusive)
    return x


# counts compared with or turned into int32 arrays inside JAX (x64 disabled)
INT32_MAX = 2**31 - 1

# jax.random.PRNGKey / jax.random.key keep the low 32 bits of a seed when x64 is disabled
# (2**32 gives the same key as 0) and raise OverflowError from 2**63 on.
SEED_MAX = 2**32 - 1


def check_seed(name: str, value: Any) -> int:
    """Return `value` as an int seed in [0, SEED_MAX], the seeds that give distinct JAX keys."""
    x = check_int(name, value)
    if not 0 <= x <= SEED_MAX:
        raise ValueError(
            f"{name} must be in [0, {SEED_MAX}] (2**32 - 1, the seeds jax.random.PRNGKey "
            f"takes); got {_shown(x)}"
        )
    return x


def check_bool(name: str, value: Any) -> bool:
    """Return `value` as a Python bool; `ValueError` unless it is True or False."""
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be true or false; got {_shown(value)}")
    return bool(value)


def split_list(name: str, text: str, *, unique: bool = True) -> list[str]:
    """The comma-separated items of `text`, stripped: `"a, b"` -> `["a", "b"]`. An empty item
    (`"a,,b"`, a trailing comma), no item at all or (`unique`) an item given twice is a
    `ValueError` naming `name` and `text`: such a list is a typo, not a request."""
    items = [item.strip() for item in str(text).split(",")]
    if not any(items) or not all(items):
        raise ValueError(f"{name}: an empty item in {text!r}; give A,B,... without empty items")
    if unique:
        seen: set[str] = set()
        for item in items:
            if item in seen:
                raise ValueError(f"{name}: {item!r} appears twice in {text!r}")
            seen.add(item)
    return items


def check_choice(name: str, value: Any, allowed: Any) -> Any:
    """Return the element of `allowed` equal to `value`; `ValueError` if there is none."""
    allowed = list(allowed)
    if isinstance(value, Hashable) and value in allowed:
        return allowed[allowed.index(value)]
    raise ValueError(f"{name} must be one of {allowed}; got {_shown(value)}")


def set_fields(obj: Any, **values: Any) -> None:
    """Store checked, normalised field values on a frozen dataclass instance."""
    for field, value in values.items():
        object.__setattr__(obj, field, value)


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
