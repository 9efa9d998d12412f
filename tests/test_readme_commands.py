"""The README's commands as written: every `pfedwn ...` line parses (quick), every Python
snippet's imports resolve (quick), the "Table II cases" line gives the paper's cases (quick),
and every command runs, shrunk to one round (slow)."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pfedwn_jax.cli import bare_compile_cache, build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, re.M | re.S)


def _commands() -> list[list[str]]:
    """Every `pfedwn ...` line of the README's bash blocks, split as a shell would."""
    lines = [line for block in _blocks("bash") for line in block.splitlines()]
    return [shlex.split(line, comments=True) for line in lines if line.startswith("pfedwn ")]


COMMANDS = _commands()
IDS = [" ".join(c)[:60] for c in COMMANDS]


def test_the_readme_has_commands_and_snippets():
    assert len(COMMANDS) >= 10 and len(_blocks("python")) >= 3


@pytest.mark.parametrize("argv", COMMANDS, ids=IDS)
def test_every_readme_command_parses(argv, capsys):
    if argv[1:] == ["--version"]:
        with pytest.raises(SystemExit, match="0"):
            build_parser().parse_args(argv[1:])
        return
    args = build_parser().parse_args(bare_compile_cache(argv[1:]))
    assert callable(args.func)


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_every_readme_snippet_imports(index):
    """The import statements of each snippet run (the rest needs the snippets before it)."""
    tree = ast.parse(_blocks("python")[index])
    imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    exec(compile(ast.Module(body=imports, type_ignores=[]), "README", "exec"), {})


def test_the_readme_toml_is_a_config():
    from pfedwn_jax.experiment import ExperimentConfig

    (toml,) = _blocks("toml")
    config = ExperimentConfig.from_dict(__import__("tomllib").loads(toml))
    assert config.hparams_for("pfedwn").a == 0.5


def test_the_table_ii_line_gives_the_papers_cases():
    """The paper's Cases 1-3: 4, 3 and 2 of 10 neighbors selected at gamma_th 5, 10, 15: three
    different sets of neighbors."""
    from pfedwn_jax.wireless import error_probability, place_network, select_neighbors

    (argv,) = [c for c in COMMANDS if "runs/table2" in c]
    args = build_parser().parse_args(argv[1:])
    seed = int(args.topology_seed)
    target, nbrs = place_network(seed, 10)
    chosen = []
    for gamma in args.gamma_th.split(","):
        perr = error_probability(target, nbrs, gamma_th=float(gamma))
        chosen.append(tuple(np.flatnonzero(np.asarray(select_neighbors(perr, eps=0.05)))))
    assert [len(c) for c in chosen] == [4, 3, 2], chosen


def _shrunk(argv: list[str]) -> list[str] | None:
    """The command run in the slow test: one round for `run`/`sweep` (the last flag wins);
    None for what cannot run here (downloads, the user's own module)."""
    if "prepare" in argv or "--import" in argv:
        return None
    if "run" in argv or "sweep" in argv:
        return [*argv, "--rounds", "1"]
    return argv


@pytest.mark.slow
@pytest.mark.parametrize("argv", COMMANDS, ids=IDS)
def test_every_readme_command_runs(argv, tmp_path):
    shrunk = _shrunk(argv)
    if shrunk is None:
        pytest.skip("downloads a dataset or imports the user's own module")
    (toml,) = _blocks("toml")
    (tmp_path / "exp.toml").write_text(toml)
    if "--resume" in shrunk:  # the README's line continues an interrupted run: start one
        first = [a for a in shrunk if a != "--resume"]
        assert _pfedwn(first, tmp_path).returncode == 0
    done = _pfedwn(shrunk, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]


def _pfedwn(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    code = "import sys; from pfedwn_jax.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PFEDWN_COMPILATION_CACHE": str(cwd / "xla")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", code, *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True
    )


def test_every_extra_the_readme_names_exists_and_the_viewer_has_one():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    table = README[README.index("| command | extra |") :].split("\n\n")[0]
    named = set(re.findall(r"\| `(\w+)`", table.replace("| `pfedwn", "| x")))
    assert named and named <= set(extras), named - set(extras)
    assert any(d.startswith("tensorboard>") for d in extras["viewer"])


def test_a_missing_writer_extra_says_what_to_install_after_make_demo(monkeypatch):
    from pfedwn_jax.runner.writers import make_writers

    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # the import fails
    with pytest.raises(ValueError, match=r"\.venv/bin/pip install -e '\.\[tensorboard\]'"):
        make_writers("tensorboard", ROOT / "build" / "never")
