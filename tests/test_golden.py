"""Results recorded before a refactor are still what the code gives (every method, both modes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pfedwn_jax import run
from pfedwn_jax.experiment import ExperimentConfig

GOLDEN = json.loads((Path(__file__).parent / "data" / "golden_results.json").read_text())
KEYS = ("target_accuracy", "target_loss", "client_accuracy", "client_loss")


@pytest.mark.parametrize(
    "mode,methods",
    [  # network mode's every method in the slow tier: a method's numbers do not depend on
        # the others run with it (each run starts from the same keys)
        ("single", None),
        ("network", ("fedavg", "pfedwn")),
        pytest.param("network", None, marks=pytest.mark.slow),
    ],
)
def test_results_equal_the_recorded_ones(mode, methods):
    golden = GOLDEN[mode]
    config = {**golden["config"], "algorithms": methods or golden["config"]["algorithms"]}
    got = run(ExperimentConfig.from_dict(config), progress=False).to_dict()
    for field in ("adjacency", "selected", "perr", "slot_client", "is_target"):
        np.testing.assert_allclose(
            np.asarray(got["network"][field], float),
            np.asarray(golden["network"][field], float),
            rtol=1e-6,
            err_msg=field,
        )
    assert sorted(got["methods"]) == sorted(methods or golden["methods"])
    for name, want in golden["methods"].items():
        if name not in got["methods"]:
            continue
        have = got["methods"][name]
        for key in KEYS:
            np.testing.assert_allclose(
                np.asarray(have[key]), np.asarray(want[key]), rtol=1e-5, atol=1e-6,
                err_msg=f"{mode}/{name}/{key}",
            )  # fmt: skip
        assert sorted(have["records"]) == sorted(want["records"]), f"{mode}/{name}"
        for rec, values in want["records"].items():
            np.testing.assert_allclose(
                np.asarray(have["records"][rec], float), as_recorded_now(rec, values, got),
                rtol=1e-5, atol=1e-6, err_msg=f"{mode}/{name}/records/{rec}",
            )  # fmt: skip


def as_recorded_now(rec: str, values: list, got: dict) -> np.ndarray:
    """A golden record in today's layout: pFedWN's `pi [.., S, S]` (recorded when it was
    dense) becomes `[.., S, K]` over the neighbor lists (`network.slot_neighbors`), after
    checking that the dense record had no weight off the lists."""
    values = np.asarray(values, float)
    if rec not in ("pi", "pi_trace"):
        return values
    nbr = np.asarray(got["network"]["slot_neighbors"])
    mask = np.asarray(got["network"]["slot_neighbor_mask"], bool)
    rows = np.arange(nbr.shape[0])[:, None]
    listed = np.zeros(values.shape[-2:], bool)
    listed[rows, nbr] = mask
    assert np.all(values[..., ~listed] == 0), f"golden {rec} has weight off the neighbor lists"
    return np.where(mask, values[..., rows, nbr], 0.0)
