"""What produced a result: package version, git commit, library versions, device kind.

`provenance()` is recorded with every result so a number can be traced back to the code and
the libraries that computed it. It never fails: what cannot be found (no git, no checkout, a
library not installed) is None.
"""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any

from pfedwn_jax import __version__

PACKAGE = "pfedwn-jax"
# distributions whose versions change numbers or file formats
LIBRARIES = ("jax", "jaxlib", "flax", "optax", "chex", "orbax-checkpoint", "numpy", "scipy")
_PACKAGE_DIR = Path(__file__).resolve().parent
_GIT_TIMEOUT_S = 5.0


def provenance(devices: bool = True) -> dict[str, Any]:
    """`{"package", "version", "git", "python", "libraries", "backend", "device_kind"}`.

    `git` is `{"commit": sha, "dirty": bool}` when the package is imported from a git
    checkout of this repository (dirty: tracked files differ from the commit, as `git describe
    --dirty` counts), else None. `libraries` maps each of `LIBRARIES` to its installed version
    (None: not installed). `devices=False` leaves out `backend` and `device_kind`, which start
    JAX's backends (call it with True only where JAX may start).
    """
    out: dict[str, Any] = {
        "package": PACKAGE,
        "version": __version__,
        "git": git_state(),
        "python": platform.python_version(),
        "libraries": {name: _version(name) for name in LIBRARIES},
    }
    if devices:
        out |= device_info()
    return out


def device_info() -> dict[str, Any]:
    """`{"backend": "cpu" | "gpu" | ..., "device_kind": e.g. "NVIDIA H100 80GB HBM3"}`."""
    try:
        import jax  # deferred: this module must not import JAX for the git and versions

        device = jax.devices()[0]
        return {"backend": jax.default_backend(), "device_kind": device.device_kind}
    except Exception:  # no usable backend: provenance never fails
        return {"backend": None, "device_kind": None}


def git_state(package_dir: Path = _PACKAGE_DIR) -> dict[str, Any] | None:
    """`{"commit", "dirty"}` of the checkout holding `package_dir` at its top level, or None:
    not run from a git checkout of this repository (an installed wheel, a package inside some
    other repository), or git missing or failing."""
    top = _git(package_dir, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != package_dir.resolve().parent:
        return None
    commit = _git(package_dir, "rev-parse", "HEAD")
    status = _git(package_dir, "status", "--porcelain", "--untracked-files=no")
    if commit is None or status is None:
        return None
    return {"commit": commit, "dirty": bool(status)}


def _git(where: Path, *args: str) -> str | None:
    """stdout of `git -C where ARGS` stripped, or None when git is missing or fails."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(where), *args],
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
