"""`provenance()`: package version, git commit and dirtiness, library versions, device kind."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
from pathlib import Path

import jax
import pytest

import pfedwn_jax
from pfedwn_jax.experiment.setup import environment
from pfedwn_jax.provenance import LIBRARIES, git_state, provenance

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def test_versions_and_device_kind():
    info = provenance()
    assert info["package"] == "pfedwn-jax" and info["version"] == pfedwn_jax.__version__
    assert set(info["libraries"]) == set(LIBRARIES)
    assert {"jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy"} <= set(LIBRARIES)
    assert info["libraries"]["jax"] == jax.__version__
    assert info["libraries"]["flax"] == importlib.metadata.version("flax")
    assert info["device_kind"] == jax.devices()[0].device_kind
    assert info["backend"] == jax.default_backend()
    assert "device_kind" not in provenance(devices=False)
    assert environment()["provenance"]["version"] == pfedwn_jax.__version__  # in every result


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@needs_git
def test_git_commit_and_dirty_tree(tmp_path):
    package = tmp_path / "repo" / "pkg"
    package.mkdir(parents=True)
    (package / "code.py").write_text("x = 1\n")
    repo = package.parent
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    assert git_state(package) == {"commit": _git(repo, "rev-parse", "HEAD"), "dirty": False}
    (package / "notes.txt").write_text("untracked files do not count\n")
    assert git_state(package)["dirty"] is False
    (package / "code.py").write_text("x = 2\n")
    assert git_state(package)["dirty"] is True


@needs_git
def test_no_checkout_or_no_git_gives_none(tmp_path, monkeypatch):
    assert git_state(tmp_path / "pkg") is None  # not a repository (the folder need not exist)
    nested = tmp_path / "outer" / "deep" / "pkg"  # inside a repository, not at its top
    nested.mkdir(parents=True)
    _git(tmp_path / "outer", "init", "-q")
    assert git_state(nested) is None
    monkeypatch.setenv("PATH", "")  # no git at all
    assert git_state() is None and provenance(devices=False)["git"] is None


@needs_git
def test_this_checkout_is_recorded():
    root = Path(pfedwn_jax.__file__).resolve().parents[1]
    if not (root / ".git").exists():
        pytest.skip("the package is not imported from a git checkout")
    assert provenance(devices=False)["git"]["commit"] == _git(root, "rev-parse", "HEAD")
