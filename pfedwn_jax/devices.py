"""How many CPU devices JAX exposes: one per core lets the engine train clients in parallel.

XLA:CPU runs a small model's batch-32 step on one core. JAX can present the host as several
CPU devices (`jax_num_cpu_devices`); the engine then splits the client slots over them
(`engine.sharding`) and the cores work at once. The setting must be made before JAX creates its
backends, i.e. before the first JAX computation of the process.
"""

from __future__ import annotations

import os
import re
import warnings

import jax

from pfedwn_jax._checks import check_int


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
