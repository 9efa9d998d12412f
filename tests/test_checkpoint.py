"""Checkpoint directories: exact resume, constant cost per save, clear errors when corrupt."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from helpers import TINY_RUN

from pfedwn_jax.cli import main
from pfedwn_jax.experiment import ExperimentConfig, run
from pfedwn_jax.experiment import checkpoint as ckpt
from pfedwn_jax.experiment.checkpoint import read_resume, run_progress
from pfedwn_jax.experiment.results import new_entry

# tiny and fast: logistic regression, 4 clients, two methods
TINY = {**TINY_RUN, "rounds": 7, "algorithms": ("local", "fedavg")}
KEYS = ("target_accuracy", "target_loss", "client_accuracy", "client_loss", "records", "diverged")


class Stop(Exception):
    pass


def stop_at(method: str, round_: int):
    def callback(name, rounds_done, metrics):
        if name == method and rounds_done == round_:
            raise Stop

    return callback


@pytest.fixture(scope="module")
def uninterrupted():
    return run(ExperimentConfig(**TINY), progress=False, checkpoint=None)


def test_kill_mid_method_and_resume_is_exact(uninterrupted, tmp_path):
    cfg, path = ExperimentConfig(**TINY), tmp_path / "ckpt"
    with pytest.raises(Stop):
        run(cfg, progress=False, checkpoint=path, checkpoint_every=3, callback=stop_at("fedavg", 5))
    saved = ckpt.load(path)
    assert saved.progress["rounds"] == {"local": 7, "fedavg": 3}  # the last save: round 3
    assert saved.progress["current"] == "fedavg" and saved.leaves
    resumed = run(cfg, progress=False, checkpoint=path, checkpoint_every=3, resume=True)
    for name in TINY["algorithms"]:
        a, b = uninterrupted.methods[name], resumed.methods[name]
        for key in KEYS:
            assert a[key] == b[key], (name, key)
        assert len(b["timings"]["round_s"]) == TINY["rounds"]


def test_bytes_per_save_do_not_grow_with_the_rounds(tmp_path, monkeypatch):
    written = []
    save = ckpt.save

    def counting_save(*args, **kwargs):
        written.append(save(*args, **kwargs))
        return written[-1]

    monkeypatch.setattr(ckpt, "save", counting_save)
    cfg = ExperimentConfig(**{**TINY, "rounds": 12, "algorithms": ("fedavg",)})
    run(cfg, progress=False, checkpoint=tmp_path / "ckpt")
    assert len(written) == 12
    middle = written[:-1]  # the last save has no state
    assert max(middle) - min(middle) < 0.02 * min(middle), middle
    assert (tmp_path / "ckpt" / "state.npz").exists()


def test_checkpoint_every_and_validation(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(ckpt, "save", lambda d, p, s, rows: calls.append(len(rows)) or 0)
    cfg = ExperimentConfig(**{**TINY, "algorithms": ("local",)})
    run(cfg, progress=False, checkpoint=tmp_path / "c", checkpoint_every=3)
    assert calls == [3, 3, 1]  # rounds 3 and 6, then the end of the method
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="checkpoint_every"):
            run(cfg, progress=False, checkpoint=tmp_path / "c", checkpoint_every=bad)
    with pytest.raises(ValueError, match="on_divergence"):
        run(cfg, progress=False, on_divergence="ignore")


# --------------------------------------------------------------------------- the files
def _saved(tmp_path, rounds=2):
    """A checkpoint of TINY with `local` at `rounds` rounds (synthetic rows, a small state)."""
    cfg = ExperimentConfig(**TINY)
    entry = new_entry(cfg.hparams_for("local"))
    entry["target_accuracy"] = [0.5] * rounds  # only its length counts in the progress
    rows = [_row(r) for r in range(1, rounds + 1)]
    state = {"w": np.arange(6.0, dtype=np.float32).reshape(2, 3)}
    ckpt.save(tmp_path / "c", run_progress(cfg, {}, "local", entry), state, rows)
    return cfg, tmp_path / "c"


def _row(r):
    return {
        "method": "local",
        "round": r,
        "target_accuracy": 0.5,
        "target_loss": float("nan"),
        "client_accuracy": [0.5],
        "client_loss": [1.0],
        "records": {"train_loss": [2.0]},
        "round_s": 0.1,
    }


def test_torn_line_and_lines_past_the_state_are_ignored(tmp_path):
    cfg, path = _saved(tmp_path)
    with (path / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(_row(3)) + "\n" + json.dumps(_row(4))[:20])  # crash mid-append
    back = read_resume(path, cfg)
    assert back.current == "local" and len(back.entry["target_accuracy"]) == 2
    assert np.isnan(back.entry["target_loss"][1])  # NaN survives the JSON lines
    np.testing.assert_array_equal(back.leaves[0], np.arange(6.0).reshape(2, 3))
    # the next save closes the torn line first: every line stays readable
    ckpt.save(path, {"rounds": {"local": 4}}, None, [_row(4)])
    assert [r["round"] for r in ckpt.load(path).rows["local"]] == [1, 2, 3, 4]


def _empty(p):
    p.write_bytes(b"")


def _truncated(p):
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])


def _random(p):
    p.write_bytes(np.random.default_rng(0).bytes(500))


def _foreign(p):
    with p.open("wb") as f:
        np.savez(f, weights=np.zeros(3))


def _pickled(p):
    with p.open("wb") as f:
        np.savez(f, progress=np.array([{"rounds": {}}, None], dtype=object))


def _npy(p):
    with p.open("wb") as f:
        np.save(f, np.zeros(3))


def _no_rows(p):
    (p.parent / "metrics.jsonl").write_text("")


@pytest.mark.parametrize(
    ("damage", "what"),
    [
        (_empty, "cannot be read"),
        (_truncated, "cannot be read"),
        (_random, "cannot be read"),
        (_foreign, "no 'progress' entry"),
        (_pickled, "cannot be read"),
        (_npy, "single array"),
        (_no_rows, "lacks 'local' round"),
    ],
)
def test_corrupt_checkpoint_is_a_clear_error(tmp_path, damage, what):
    cfg, path = _saved(tmp_path)
    damage(path / "state.npz")
    with pytest.raises(ValueError, match=what) as err:
        read_resume(path, cfg)
    message = str(err.value)
    assert str(path) in message and f"delete {path} or run without resume" in message


def test_checkpoint_of_another_config_or_a_file_is_refused(tmp_path):
    cfg, path = _saved(tmp_path)
    with pytest.raises(ValueError, match=f"checkpoint {path}: was written for a different"):
        read_resume(path, cfg.replace(lr=0.1))
    old = tmp_path / "old.npz"
    old.write_bytes(pickle.dumps({"not": "ours"}))
    with pytest.raises(ValueError, match="is a file, not a checkpoint directory"):
        read_resume(old, cfg)
    with pytest.raises(ValueError, match="is a file"):
        run(cfg, progress=False, checkpoint=old)  # a fresh run does not delete a user's file
    assert old.exists()
    assert read_resume(tmp_path / "missing", cfg).current is None


def test_remove_deletes_only_checkpoint_files(tmp_path):
    _, path = _saved(tmp_path)
    (path / "notes.txt").write_text("mine")
    ckpt.remove(path)
    assert sorted(p.name for p in path.iterdir()) == ["notes.txt"]
    (path / "notes.txt").unlink()
    ckpt.remove(path)
    assert not path.exists()


def test_cli_checkpoint_every_zero_writes_no_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ckpt, "save", lambda *a: pytest.fail("saved a checkpoint"))
    argv = ["run", "--model", "logreg", "--num-neighbors", "3", "--rounds", "1"]
    argv += ["--algorithms", "local", "--quiet", "--no-plot"]
    assert main([*argv, "--out", str(tmp_path / "a"), "--checkpoint-every", "0"]) == 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["results.json"]
    for bad in (["--checkpoint-every", "-1"], ["--checkpoint-every", "0", "--resume"]):
        capsys.readouterr()
        assert main([*argv, "--out", str(tmp_path / "b"), *bad]) == 2
        assert "--checkpoint-every" in capsys.readouterr().err
