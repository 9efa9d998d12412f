"""Packaging: floors pinned by `make test-floors`, `py.typed`, one version, a changelog."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import tomllib
from pathlib import Path

import pytest

import pfedwn_jax

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_dependency_has_a_floor_and_the_pins_are_the_floors():
    floors = _script("floor_pins")
    project = PYPROJECT["project"]
    core = floors.pins(floors.requirements(project, []))
    assert len(core) == len(project["dependencies"])  # every runtime dependency has a floor
    assert {"jax==0.10.2", "jaxlib==0.10.2", "flax==0.10.4", "scipy==1.14"} <= set(core)
    pins = floors.pins(floors.requirements(project, ["test", "plot", "tfds"]))
    assert "pandas==2.2.2" in pins  # test -> pfedwn-jax[analysis] is followed
    assert "importlib_resources==6; python_version < '3.12'" in pins  # markers kept
    assert not any("pfedwn" in p for p in pins)
    with pytest.raises(SystemExit, match="unknown extra 'gpu'"):
        floors.requirements(project, ["gpu"])


def test_type_hints_are_shipped_and_the_version_is_written_once():
    assert (Path(pfedwn_jax.__file__).parent / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["pfedwn_jax"]
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"] == (
        "pfedwn_jax.__version__"
    )
    assert importlib.metadata.version("pfedwn-jax") == pfedwn_jax.__version__


def test_changelog_has_an_entry_for_this_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{pfedwn_jax.__version__}]" in text or "## [Unreleased]" in text


@pytest.mark.slow
def test_api_reference_builds(tmp_path):
    pytest.importorskip("pdoc")
    assert _script("make_docs").main(tmp_path) == 0
    assert (tmp_path / "pfedwn_jax" / "data.html").is_file()
    assert "register_dataset" in (tmp_path / "pfedwn_jax.html").read_text()


@pytest.mark.slow
def test_an_editable_build_prints_no_setuptools_warning(tmp_path):
    """An editable install of the project is a plain .pth (no meta path finder and no
    setuptools warning about it). Needs setuptools >= 77 (the build requirement)."""
    import shutil
    import subprocess
    import sys

    version = importlib.metadata.version("setuptools")
    if int(version.split(".")[0]) < 77:
        pytest.skip(f"setuptools {version} < 77, the project's build requirement")
    root = Path(__file__).resolve().parents[1]
    copy = tmp_path / "src"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".*", "runs", "build", "*.egg-info"))
    code = f"from setuptools import build_meta as b; print(b.build_editable({str(tmp_path)!r}))"
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", code], cwd=copy, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    output = done.stdout + done.stderr
    assert "InformationOnly" not in output and "meta path finder" not in output, output[-2000:]
