"""`pfedwn neighbors`: table, JSON, heatmap and clean errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pfedwn_jax.cli import main
from pfedwn_jax.wireless import error_probability, place_network


def test_neighbors_cli_table_json_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out_json, out_png = tmp_path / "t.json", tmp_path / "h.png"
    rc = main(
        [
            "neighbors",
            "--num-neighbors",
            "6",
            "--gamma-th",
            "10",
            "--eps",
            "0.05",
            "--seed",
            "3",
            "--json",
            str(out_json),
            "--plot",
            str(out_png),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    rows = json.loads(out_json.read_text())["neighbors"]
    assert len(rows) == 6 and out_png.stat().st_size > 10_000
    t, nb = place_network(3, 6)
    perr = np.asarray(error_probability(t, nb, 10.0))
    np.testing.assert_allclose([r["perr"] for r in rows], perr, rtol=1e-6)
    assert [r["selected"] for r in rows] == list(perr < 0.05)
    assert f"selected {int(np.sum(perr < 0.05))} of 6" in text


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--eps", "1.5"], "eps"),
        (["--gamma-th", "-1"], "gamma_th"),
        (["--num-neighbors", "0"], "num-neighbors"),
    ],
)
def test_neighbors_cli_bad_input_is_a_clean_error(argv, match, capsys):
    assert main(["neighbors", *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err
