"""Print pip constraints pinning every declared floor: `name>=X` in pyproject.toml -> `name==X`.

`make test-floors` installs the package with these constraints into a separate venv and runs
the quick tier there, so the floors in `pyproject.toml` are the versions that were tested (the
pins are derived from the file, never written twice). Usage:

    python scripts/floor_pins.py [EXTRA[,EXTRA...] ...] > floors.txt

Floors of the named extras are pinned too (an extra naming another, `pfedwn-jax[test]`, is
followed). Standard library only: it runs before any venv exists.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
# `name[extras] >= version [, ...] [; marker]`
REQUIREMENT = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?P<spec>[^;]*?)\s*"
    r"(?:;\s*(?P<marker>.*))?$"
)


def requirements(project: dict, extras: list[str]) -> list[str]:
    """The dependency strings of the project and of `extras` (self-references followed)."""
    optional = project.get("optional-dependencies", {})
    out, todo, seen = list(project.get("dependencies", [])), list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"unknown extra {extra!r}; pyproject.toml has {sorted(optional)}")
        seen.add(extra)
        for req in optional[extra]:
            match = re.match(rf"^\s*{re.escape(project['name'])}\[([^\]]*)\]", req)
            if match:
                todo.extend(e.strip() for e in match.group(1).split(","))
            else:
                out.append(req)
    return out


def pins(reqs: list[str]) -> list[str]:
    """`name==floor[; marker]` for each requirement with a `>=` floor, sorted by name."""
    found = {}
    for req in reqs:
        match = REQUIREMENT.match(req)
        floor = re.search(r">=\s*([^,\s]+)", match.group("spec")) if match else None
        if floor is None:
            continue
        marker = match.group("marker")
        found[match.group("name").lower()] = f"{match.group('name')}=={floor.group(1)}" + (
            f"; {marker}" if marker else ""
        )
    return [found[name] for name in sorted(found)]


def main(argv: list[str]) -> int:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    extras = [e for arg in argv for e in arg.split(",") if e]
    print("\n".join(pins(requirements(project, extras))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
