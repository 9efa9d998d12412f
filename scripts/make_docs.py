"""Build the HTML API reference from the docstrings with pdoc, offline: `make docs`.

Writes `build/api/` (not committed: it is generated from the source, so it cannot drift from
it; open `build/api/index.html`). The package root loads its API and subpackages lazily
(`pfedwn_jax.__getattr__`), which pdoc does not follow: this script resolves the root's
`__all__` first and hands pdoc every subpackage by name. A pdoc warning (a name that does not
resolve, a module that fails to import) fails the build.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import pdoc
import pdoc.render

import pfedwn_jax

OUT = Path(__file__).resolve().parents[1] / "build" / "api"


def modules() -> list[str]:
    """The root and every subpackage it loads lazily, root first."""
    return ["pfedwn_jax", *(f"pfedwn_jax.{name}" for name in pfedwn_jax._SUBMODULES)]


def main(out: Path = OUT) -> int:
    for module in map(importlib.import_module, modules()):
        for name in getattr(module, "__all__", ()):  # lazy names into the dict pdoc reads
            vars(module).setdefault(name, getattr(module, name))
    pdoc.render.configure(docformat="google", footer_text=f"pfedwn-jax {pfedwn_jax.__version__}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # pdoc cannot evaluate the postponed annotations of a NamedTuple's generated
        # constructor (it looks them up in the wrong namespace); it shows them as written
        warnings.filterwarnings("ignore", message=r"Error parsing type annotation .*\.__init__")
        pdoc.pdoc(*modules(), output_directory=out)
    print(f"API reference: {out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
