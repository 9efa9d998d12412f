"""One JAX style in the library: typed PRNG keys and the `jax.tree` API (docs/engine.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pfedwn_jax"

# legacy spellings that have a current equivalent: `jax.random.key`, `jax.tree.map`
LEGACY = {
    "jax.random.PRNGKey(": re.compile(r"\bjax\.random\.PRNGKey\("),
    "jax.tree_util.tree_map(": re.compile(r"\bjax\.tree_util\.tree_map\("),
}


@pytest.mark.parametrize("spelling", sorted(LEGACY))
def test_the_library_uses_no_legacy_spelling(spelling):
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if LEGACY[spelling].search(line)
    ]
    assert not found, f"{spelling} in {found}; use the current API (docs/engine.md, Pytrees)"


def test_the_check_sees_a_legacy_call():
    assert LEGACY["jax.random.PRNGKey("].search("k = jax.random.PRNGKey(0)")
    assert LEGACY["jax.tree_util.tree_map("].search("jax.tree_util.tree_map(f, t)")
    assert not LEGACY["jax.random.PRNGKey("].search("k = jax.random.key(0)")
