"""Every results number of README.md and the docs' results blocks comes from a committed file:
each block (`reproduce.readme`) is rendered again from docs/results/ and found verbatim."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pfedwn_jax.reproduce.readme import BLOCKS

ROOT = Path(__file__).resolve().parents[1]
#: The blocks each document holds.
WHERE = {
    "README.md": ("table2", "crossover"),
    "docs/REPRODUCTION.md": ("table2", "crossover", "decentralized", "comm", "fading"),
    "docs/robustness.md": ("lossy", "robustness"),
    "docs/algorithms.md": ("small",),
}


def _blocks(text: str) -> dict[str, str]:
    found = re.findall(r"<!-- block: (\w+) -->\n(.*?)\n<!-- end block -->", text, re.S)
    return dict(found)


@pytest.mark.parametrize("doc", sorted(WHERE))
def test_each_results_block_is_recomputed_from_the_committed_files(doc):
    held = _blocks((ROOT / doc).read_text())
    assert set(held) == set(WHERE[doc]), (doc, sorted(held))
    for name in WHERE[doc]:
        assert held[name] == BLOCKS[name](ROOT), (doc, name)


def test_the_blocks_say_what_the_files_say():
    """Spot checks by hand against the committed files: pFedWN's differences (Case 1 first,
    Case 3 last) and Case 3's test set, and the crossover's count."""
    table2 = BLOCKS["table2"](ROOT)
    assert "(n_test 266)" in table2 and "| pfedwn | -0.08 [" in table2
    assert "+0.62 [-1.75, +2.98] p_Holm 1 |\n| pfedwn a<1 |" in table2
    assert "210 comparisons" in BLOCKS["crossover"](ROOT)
