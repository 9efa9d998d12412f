"""The package root: the public API and lazy subpackages, without leaks or a JAX import."""

from __future__ import annotations

import json
import subprocess
import sys

import pfedwn_jax


def _fresh(code: str) -> str:
    """stdout of `code` run in a new interpreter (nothing imported yet)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_import_is_light_and_dir_lists_only_the_api():
    code = (
        "import json, sys, pfedwn_jax\n"
        "heavy = sorted(m for m in ('jax', 'flax', 'optax', 'numpy') if m in sys.modules)\n"
        "print(json.dumps({'heavy': heavy, 'dir': dir(pfedwn_jax)}))"
    )
    out = json.loads(_fresh(code))
    assert out["heavy"] == []  # `import pfedwn_jax` alone imports no JAX (nor NumPy)
    names = set(out["dir"])
    assert not {"_LAZY", "_SUBMODULES", "importlib", "_importlib"} & names
    assert set(pfedwn_jax.__all__) <= names
    assert {"wireless", "data", "models", "algorithms", "runner", "results"} <= names


def test_subpackages_load_lazily_in_a_fresh_process():
    code = (
        "import sys, pfedwn_jax\n"
        "assert 'pfedwn_jax.wireless' not in sys.modules\n"
        "print(pfedwn_jax.wireless.__name__, pfedwn_jax.em.__name__,"
        " pfedwn_jax.runner.__name__, pfedwn_jax.results.Result.__name__)"
    )
    assert _fresh(code) == "pfedwn_jax.wireless pfedwn_jax.em pfedwn_jax.runner Result"


def test_every_public_name_resolves_and_registers_are_the_registries():
    for name in pfedwn_jax.__all__:
        assert getattr(pfedwn_jax, name) is not None
    assert pfedwn_jax.register_algorithm is pfedwn_jax.algorithms.register
    assert pfedwn_jax.register_model is pfedwn_jax.models.register_model
    assert pfedwn_jax.register_dataset is pfedwn_jax.data.register_dataset
    try:
        pfedwn_jax.no_such_name
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("an unknown attribute must raise AttributeError")
