"""`pfedwn --import MODULE`: user code registered before the flags are checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pfedwn_jax.cli import main
from pfedwn_jax.cli.plugins import early_options

TESTS = Path(__file__).resolve().parent
RUN_FLAGS = [
    "--num-neighbors", "3", "--gamma-th", "1.0", "--eps", "0.12", "--rounds", "1",
    "--batch-size", "16", "--lr", "0.1", "--quiet", "--no-plot", "--checkpoint-every", "0",
]  # fmt: skip


def _pfedwn(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m pfedwn_jax ARGS` in a fresh process run from `cwd`."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-m", "pfedwn_jax", "--cpu-devices", "1", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_run_uses_an_imported_model_algorithm_and_dataset(tmp_path):
    out = tmp_path / "out"
    args = ["--model", "user_tiny", "--algorithms", "user_fedavg,local", "--dataset", "user_csi"]
    proc = _pfedwn(
        "--import", "user_plugin", "run", *args, *RUN_FLAGS, "--out", str(out), cwd=TESTS
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["model"] == "user_tiny"
    assert results["config"]["dataset"] == "user_csi"
    assert list(results["methods"]) == ["user_fedavg", "local"]
    # without the import the same names are refused, naming what is available
    proc = _pfedwn("run", *args, *RUN_FLAGS, "--out", str(tmp_path / "no"), cwd=TESTS)
    assert proc.returncode == 2 and "user_tiny" in proc.stderr and "'mlp'" in proc.stderr


def test_import_by_path_after_the_subcommand(tmp_path):
    proc = _pfedwn("data", "list", "--import", str(TESTS / "user_plugin.py"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "user_csi" in proc.stdout


def test_early_options_find_every_import_wherever_it_stands():
    early = early_options(["--import", "a", "run", "--rounds", "2", "--import", "b.c"])
    assert early.imports == ["a", "b.c"] and early.cpu_devices is None
    assert early_options(["--cpu-devices", "3", "run"]).cpu_devices == 3
    assert early_options(["--cpu-devices", "x", "run"]).cpu_devices is None  # parser reports it
    assert early_options(["run", "--import"]).imports == []  # idem


def test_bad_imports_are_one_line_errors(tmp_path, capsys):
    assert main(["--import", "no_such_module_here", "data", "list"]) == 2
    err = capsys.readouterr().err
    assert "--import no_such_module_here: no module named 'no_such_module_here'" in err
    assert main(["--import", str(tmp_path / "absent.py"), "data", "list"]) == 2
    assert "absent.py: no such file" in capsys.readouterr().err
    broken = tmp_path / "broken_plugin.py"
    broken.write_text("raise RuntimeError('bad plugin')\n")
    assert main(["--import", str(broken), "data", "list"]) == 2
    err = capsys.readouterr().err
    assert "failed: RuntimeError: bad plugin" in err and len(err.strip().splitlines()) == 1
    assert "broken_plugin" not in sys.modules
