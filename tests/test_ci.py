"""CI runs what the README promises: `make lint` (ruff, ruff format --check, mypy), then the
quick tier (`make test`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _recipe(target: str) -> list[str]:
    """The command lines of a Makefile target."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{target}:[^\n]*\n((?:\t[^\n]*\n)+)", text, re.M)
    assert match, f"no target {target} in the Makefile"
    return [line.strip() for line in match.group(1).splitlines()]


def test_ci_runs_lint_then_the_quick_tier():
    commands = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert "make lint" in commands and "make test" in commands
    assert commands.index("make lint") < commands.index("make test")
    lint = " ".join(_recipe("lint"))
    for tool in ("ruff check", "ruff format --check", "mypy"):
        assert tool in lint, tool
    assert "pytest" in " ".join(_recipe("test"))
