"""How many CPU devices JAX exposes: one per core lets the engine train clients in parallel.

XLA:CPU runs a small model's batch-32 step on one core. JAX can present the host as several
CPU devices (`jax_num_cpu_devices`); the engine then splits the client slots over them
(`engine.sharding`) and the cores work at once. The setting must be made before JAX creates its
backends, i.e. before the first JAX computation of the process.

The free memory of a device (`available_bytes`) and the size guard every allocating entry
point calls before JAX allocates (`check_device_bytes`) live here too: a call that cannot fit
fails with a `ValueError` naming its estimate, the budget and what to change, never with
XLA's `RESOURCE_EXHAUSTED`.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

import jax

from pfedwn_jax._checks import check_int
from pfedwn_jax.io import format_bytes


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def use_cpu_devices(count: int | None = None) -> int:
    """Expose `count` CPU devices to JAX (default: one per usable core); returns the count in
    effect.

    Call it right after import, before any JAX computation. Left alone when the user already
    chose (`JAX_NUM_CPU_DEVICES` or `--xla_force_host_platform_device_count` in `XLA_FLAGS`)
    and `count` is None. If JAX's backends already exist it changes nothing (and warns if
    `count` was given and differs from the devices in effect). Affects
    only the CPU backend: on a GPU or TPU the engine splits slots over those devices.
    """
    explicit = count is not None
    if count is not None:
        count = check_int("count", count, 1)
    elif (chosen := _user_cpu_devices()) is not None:
        return chosen  # read, not queried: JAX must not start before a multi-process join
    else:
        count = usable_cores()
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:
        current = len(jax.devices("cpu"))
        if explicit and current != count:
            warnings.warn(
                f"use_cpu_devices({count}) came after JAX started; keeping {current} CPU "
                "device(s). Call it before the first JAX computation.",
                stacklevel=2,
            )
        return current
    return count


def _user_cpu_devices() -> int | None:
    """The CPU device count the user chose through `JAX_NUM_CPU_DEVICES` or `XLA_FLAGS`
    (`--xla_force_host_platform_device_count=N`), without starting JAX; None if neither."""
    text = os.environ.get("JAX_NUM_CPU_DEVICES", "").strip()
    if text.isdigit():
        return int(text)
    match = re.search(
        r"xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", "")
    )
    return int(match.group(1)) if match else None


#: Where `use_compilation_cache()` keeps compiled programs by default.
CACHE_ENV = "PFEDWN_COMPILATION_CACHE"


def default_cache_dir() -> str:
    """`$PFEDWN_COMPILATION_CACHE`, else `$XDG_CACHE_HOME/pfedwn_jax/xla`, else
    `~/.cache/pfedwn_jax/xla`."""
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pfedwn_jax", "xla")


def use_compilation_cache(directory: str | os.PathLike | None = None) -> str:
    """Keep compiled programs on disk (JAX's persistent compilation cache), so the same study
    run again, in another process, loads its programs instead of compiling them; returns the
    directory (default `default_cache_dir()`).

    Every program taking at least 0.1 s to compile is kept (JAX's default keeps those over
    1 s; the driver's block programs of small models compile in a second or two). Entries are
    keyed by the program, the jax/jaxlib versions and the devices, so a stale entry is never
    used. Call it before the first compilation of the process.
    """
    path = os.fspath(default_cache_dir() if directory is None else directory)
    if not path:
        raise ValueError("compilation cache directory must be a non-empty path; got ''")
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


# --------------------------------------------------------------------------- memory
#: Share of a device's free memory a single call may plan to use (room for fragmentation
#: and the estimates' error).
MEMORY_FRACTION = 0.8
# estimates below this are never checked (no device query on the common, small calls)
_CHECK_FLOOR = 64 << 20


def _host_available() -> int:
    """Host memory available to new allocations (psutil, else /proc/meminfo MemAvailable)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.virtual_memory().available)
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024  # in kB
    raise ValueError("cannot tell the free host memory (no psutil, no /proc/meminfo); pass budget")


def available_bytes(device: Any = None) -> int:
    """Free bytes of one device (default: this process's first device of the default backend).

    An accelerator reports its own: `memory_stats()["bytes_limit"] - ["bytes_in_use"]`. CPU
    devices share the host's memory: the host's available memory split evenly over this
    process's CPU devices (several after `use_cpu_devices`).
    """
    device = jax.local_devices()[0] if device is None else device
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        return max(0, int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)))
    sharing = len(jax.local_devices(backend="cpu")) if device.platform == "cpu" else 1
    return _host_available() // sharing


def check_device_bytes(
    need: int,
    what: str,
    change: str,
    *,
    budget: int | None = None,
    fraction: float = MEMORY_FRACTION,
) -> None:
    """Raise `ValueError` when `need` bytes exceed `fraction` of `budget` (None: the free
    memory of the default device, `available_bytes`).

    Called on the host with an estimate from the input shapes, before anything is traced or
    allocated. The message names `what` needs the memory, the estimate, the budget and
    `change` (what to do instead, e.g. "fewer links per call"). Estimates under 64 MiB pass
    without a device query.
    """
    if need <= _CHECK_FLOOR and budget is None:
        return
    where = "device" if budget is None else "host"
    budget = available_bytes() if budget is None else int(budget)
    usable = int(fraction * budget)
    if need > usable:
        raise ValueError(
            f"{what} needs about {format_bytes(need)} ({need} bytes) of {where} memory, but "
            f"{fraction:.0%} of the {format_bytes(budget)} free on the {where} is "
            f"{format_bytes(usable)}; {change}"
        )


def check_host_bytes(need: int, what: str, change: str) -> None:
    """`check_device_bytes` against the host's available memory: for NumPy work on the host
    (a `MemoryError` from NumPy would otherwise end it, after a long wait)."""
    if need > _CHECK_FLOOR:
        check_device_bytes(need, what, change, budget=_host_available())
