"""`pfedwn data` on a fresh machine: the embedded default, no download."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from pfedwn_jax.cli import main
from pfedwn_jax.data import client_label_counts, load_dataset, make_federated
from pfedwn_jax.plotting import MISSING, pyplot


def test_show_prints_the_table_memory_and_plot(tmp_path, capsys):
    plot = tmp_path / "dist.png"
    args = ["data", "show", "--clients", "11", "--scheme", "paper", "--seed", "0", "--buckets", "3"]
    pytest.importorskip("matplotlib")
    assert main([*args, "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.split()[:3] == ["client", "train", "test"])
    table = np.array([ln.split()[1:] for ln in lines[header + 1 : header + 12]], int)
    # Rows: train + test = sum of the class counts; the class totals are the whole pool.
    np.testing.assert_array_equal(table[:, 0] + table[:, 1], table[:, 2:].sum(1))
    ds = load_dataset()
    pool = np.bincount(np.concatenate([ds.y_train, ds.y_test]), minlength=10)
    np.testing.assert_array_equal(table[:, 2:].sum(0), pool)
    assert lines[header + 12].split()[3:] == [str(c) for c in pool]
    fed = make_federated(ds, 11, "paper", seed=0, device=False)
    np.testing.assert_array_equal(table[:, 2:], client_label_counts(fed))
    assert "memory train:" in out and "padding" in out and "with 3 buckets" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_list_and_clean_errors(tmp_path, capsys):
    assert main(["data", "list"]) == 0
    assert "mnist_embedded" in capsys.readouterr().out
    assert main(["data", "show", "--alpha", "0"]) == 2
    assert "alpha" in capsys.readouterr().err
    assert main(["data", "show", "--dataset", "mnist", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "pfedwn data prepare mnist" in err and str(tmp_path) in err


def test_plot_without_matplotlib_is_skipped_with_a_note(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    assert pyplot() is None
    plot = tmp_path / "dist.png"
    assert main(["data", "show", "--clients", "4", "--plot", str(plot)]) == 0
    assert MISSING in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
