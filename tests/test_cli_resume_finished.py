"""`pfedwn run --resume` on a job that finished: nothing runs again; it says so, exit 0."""

from __future__ import annotations

import pytest

from pfedwn_jax.cli import main

FLAGS = [
    "--algorithms", "local", "--num-neighbors", "3", "--gamma-th", "1.0", "--eps", "0.12",
    "--rounds", "1", "--batch-size", "16", "--lr", "0.1", "--quiet", "--no-plot",
]  # fmt: skip


def test_resume_of_a_finished_run_keeps_its_results(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main(["run", *FLAGS, "--out", str(out)]) == 0
    before = (out / "results.json").read_bytes()
    capsys.readouterr()
    import pfedwn_jax.api as api

    monkeypatch.setattr(api, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    assert main(["run", *FLAGS, "--out", str(out), "--resume"]) == 0
    said = capsys.readouterr().out
    assert "nothing to resume" in said and str(out / "results.json") in said
    assert (out / "results.json").read_bytes() == before
    # another config in the same directory is not that finished job: it runs (and resumes
    # nothing), which the patched run shows
    other = [f if f != "0.1" else "0.2" for f in FLAGS]
    try:
        code = main(["run", *other, "--out", str(out), "--resume"])
    except AssertionError as e:
        code = str(e)
    assert code != 0


def test_resume_of_a_finished_sweep_keeps_its_results(tmp_path, capsys, monkeypatch):
    out = tmp_path / "sweep"
    base = [f for f in FLAGS[:-2] if f not in ("--lr", "0.1")]
    sweep = ["sweep", *base, "--seeds", "0-1", "--no-progress", "--out", str(out)]
    assert main([*sweep, "--grid", "lr=0.1,0.2"]) == 0
    before = (out / "sweep.json").read_bytes()
    capsys.readouterr()
    import pfedwn_jax.api as api

    monkeypatch.setattr(api, "sweep", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    assert main([*sweep, "--grid", "lr=0.1,0.2", "--resume"]) == 0
    assert "nothing to resume" in capsys.readouterr().out
    assert (out / "sweep.json").read_bytes() == before
    with pytest.raises(AssertionError, match="ran"):  # another grid is another job
        main([*sweep, "--grid", "lr=0.3", "--resume"])
