"""Test session: two CPU devices, test tiers, hypothesis profiles and shared fixtures.

Two CPU devices, so every engine and runner test also runs the slot sharding
(`engine.sharding`) the CLI uses on a multi-core machine; `use_cpu_devices` must run before any
JAX computation (the imports above it compute nothing).

Tiers (markers in pyproject.toml): `make test` runs `-m "not slow and not gpu"`,
`make test-slow` the long statistical and end-to-end checks (`-m slow`), `make test-gpu` the
accelerator-against-CPU checks (`-m gpu`), which are skipped with a reason on a machine whose
default JAX backend is the CPU.
"""

from __future__ import annotations

import os

import jax
import pytest
from helpers import CLASSES, SHAPE
from hypothesis import HealthCheck, settings

from pfedwn_jax.algorithms import family_representatives, get_algorithm
from pfedwn_jax.devices import use_cpu_devices
from pfedwn_jax.models import get_model

use_cpu_devices(2)

# Property tests compile JAX code on their first examples, so no per-example deadline; each
# test sets its own small `max_examples`. The `ci` profile (default where CI is set, as in
# `.ci/run`) replays a fixed sequence so a CI run is repeatable; elsewhere each run explores.
settings.register_profile("dev", deadline=None, print_blob=True)
settings.register_profile(
    "ci",
    deadline=None,
    print_blob=True,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def accelerator() -> str | None:
    """The default JAX backend's platform when it is not the CPU (else None)."""
    backend = jax.default_backend()
    return None if backend == "cpu" else backend


# The per-method test files of the field's further methods: a test there runs in the quick
# tier only when it names its family's representative (the first registered method of the
# family, `algorithms.family_representatives()`); every other method's tests run in the slow
# tier (`make test-slow`), which keeps `make test` within its budget on 2 cores.
PER_METHOD_FILES = frozenset(
    f"test_algorithms_{family}.py"
    for family in (
        "regularized",
        "traditional",
        "mixture",
        "splitting",
        "paggregation",
        "moon",
        "decentralized",
        "clustered",
    )
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark slow the per-method tests of non-representative methods (`PER_METHOD_FILES`);
    skip `gpu`-marked tests, saying why, when JAX has no accelerator."""
    reps = [r for r in family_representatives() if not get_algorithm(r).default]
    for item in items:
        if item.path.name in PER_METHOD_FILES and not any(r in item.name for r in reps):
            item.add_marker(pytest.mark.slow)
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and accelerator() is None:
        skip = pytest.mark.skip(
            reason=f"needs an accelerator: JAX's default backend is "
            f"{jax.default_backend()!r} ({len(jax.devices())} device(s)); "
            "run `make test-gpu` on a machine with a GPU or TPU"
        )
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _shared_compilation_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One persistent compilation cache for the test run, shared by its pytest workers: a
    program compiled by one test is loaded, not compiled again, by a later test in another
    module or worker (the same HLO gives the same executable, so no number changes). It cut
    the quick tier's CPU time by about a sixth. Set in-process, not through the environment,
    so subprocesses keep their own settings (tests/test_compile_cache.py)."""
    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    jax.config.update("jax_compilation_cache_dir", str(shared / "xla-cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(scope="session")
def toy_model():
    """The engine tests' MLP for `helpers.SHAPE` images and `helpers.CLASSES` classes."""
    return get_model("mlp", CLASSES, SHAPE)


@pytest.fixture(autouse=True, scope="module")
def _fresh_jax_caches():
    """Drop JAX's compiled executables after each test module. Without this the full slow
    tier (one process, thousands of compiled programs) segfaulted inside XLA:CPU's compiler
    at the same test three times out of three, while that test passes in any smaller run;
    with it the tier passes. Our guess, not verified: a per-process resource that every live
    executable holds (code mappings; the kernel allows 65,530). Modules rarely share
    programs, so little is recompiled."""
    yield
    jax.clear_caches()
