"""The `register` example of docs/algorithms.md runs as written, and leaves no trace."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from pfedwn_jax.algorithms import available_algorithms, get_algorithm, register, unregister

DOC = Path(__file__).resolve().parents[1] / "docs" / "algorithms.md"
MARKER = "<!-- example: register -->"


def example_code() -> str:
    """The fenced python block right after the marker in the doc."""
    after = DOC.read_text().split(MARKER, 1)[-1]
    match = re.match(r"\s*```python\n(.*?)```", after, re.DOTALL)
    assert match, f"no ```python block after {MARKER!r} in {DOC}"
    return match.group(1)


@pytest.fixture
def clean_registry():
    """Unregister whatever the test registered, so other tests see the built-ins only."""
    before = available_algorithms()
    yield
    for name in available_algorithms():
        if name not in before:
            unregister(name)
    assert available_algorithms() == before


def test_doc_example_registers_and_runs(clean_registry, capsys, monkeypatch):
    # a real module: dataclasses look their class's module up in sys.modules
    module = types.ModuleType("docs_algorithms_example")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(example_code(), str(DOC), "exec"), module.__dict__)
    namespace = module.__dict__
    assert "uniform_mix" in available_algorithms()
    result = namespace["result"]
    entry = result.methods["uniform_mix"]
    assert entry["hparams"] == {"self_weight": 0.7}
    acc = result.target_accuracy("uniform_mix")
    assert acc.shape == (2,) and np.all((acc >= 0) & (acc <= 1))
    assert np.asarray(entry["records"]["train_loss"]).shape == (
        2,
        len(result.network["slot_client"]),
    )
    # the target has a neighbor here, so mixing moves it away from Local
    assert np.asarray(result.network["adjacency"]).sum() > len(result.network["slot_client"])
    assert not np.array_equal(entry["client_loss"], result.methods["local"]["client_loss"])
    assert str(acc.tolist()[0])[:4] in capsys.readouterr().out
    # the hyperparameters validate themselves, as the built-ins' do
    with pytest.raises(ValueError, match=r"uniform_mix\.self_weight"):
        namespace["UniformMixHParams"](self_weight=1.5)


def test_register_and_unregister_guard_the_registry(clean_registry):
    fedavg = get_algorithm("fedavg")
    assert register(fedavg) is fedavg  # the same object again: a no-op
    with pytest.raises(ValueError, match="already registered"):
        register(fedavg._replace(description="another"))
    mine = register(fedavg._replace(name="fedavg_copy"))
    assert available_algorithms()[-1] == "fedavg_copy"
    assert unregister("fedavg_copy") is mine
    with pytest.raises(ValueError, match="fedavg_copy"):
        get_algorithm("fedavg_copy")
    with pytest.raises(ValueError, match="must be one of"):
        unregister("fedavg_copy")


def test_families_default_run_and_representatives():
    """Each built-in method names a known family; a config naming no algorithms runs the
    default ones; the quick tier's representatives are the first of each family."""
    from pfedwn_jax.algorithms import FAMILIES, default_algorithms, family_representatives

    for name in available_algorithms():
        assert get_algorithm(name).family in FAMILIES, name
    assert set(default_algorithms()) <= set(available_algorithms())
    reps = family_representatives()
    assert len(reps) == len({get_algorithm(n).family for n in available_algorithms()})
    assert [get_algorithm(n).family for n in reps] == list(
        dict.fromkeys(get_algorithm(n).family for n in available_algorithms())
    )
    extra = get_algorithm("fedavg")._replace(name="fedavg_extra", default=False, family="mine")
    register(extra)
    try:
        assert "fedavg_extra" not in default_algorithms()
        assert "fedavg_extra" in family_representatives()
    finally:
        unregister("fedavg_extra")
    with pytest.raises(ValueError, match="family"):
        register(get_algorithm("fedavg")._replace(name="nofamily", family=""))
