"""Checkpoint directories: exact resume, orbax steps of a sharded state, clear errors when
corrupt or of an earlier format."""

from __future__ import annotations

import json
import pickle

import jax
import numpy as np
import pytest
from helpers import TINY_RUN
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pfedwn_jax import state_store
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
    assert saved.progress["current"] == "fedavg" and saved.step == 7 + 3
    assert state_store.latest(path / "state") == 10  # the step is complete on disk
    resumed = run(cfg, progress=False, checkpoint=path, checkpoint_every=3, resume=True)
    for name in TINY["algorithms"]:
        a, b = uninterrupted.methods[name], resumed.methods[name]
        for key in KEYS:
            assert a[key] == b[key], (name, key)
        assert len(b["timings"]["round_s"]) == TINY["rounds"]


def test_layout_orbax_steps_and_metrics_lines(tmp_path):
    """Every round a step numbered by the rounds done (the latest two kept), the last without a
    state; one metrics line per round."""
    cfg = ExperimentConfig(**{**TINY, "rounds": 5, "algorithms": ("fedavg",)})
    path = tmp_path / "ckpt"
    run(cfg, progress=False, checkpoint=path)
    assert sorted(p.name for p in path.iterdir()) == ["metrics.jsonl", "state"]
    assert sorted(int(p.name) for p in (path / "state").iterdir()) == [4, 5]
    assert (path / "state" / "4" / "state").is_dir() and not (
        path / "state" / "5" / "state"
    ).exists()
    lines = (path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [1, 2, 3, 4, 5]
    assert read_resume(path, cfg).current is None


def test_checkpoint_every_and_validation(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(ckpt, "save", lambda d, p, s, rows, w: calls.append(len(rows)) or 0)
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
    state = back.restore({"w": np.zeros((2, 3), np.float32)})
    np.testing.assert_array_equal(state["w"], np.arange(6.0).reshape(2, 3))
    # the next save closes the torn line first: every line stays readable
    ckpt.save(path, {"rounds": {"local": 4}}, None, [_row(4)])
    assert [r["round"] for r in ckpt.load(path).rows["local"]] == [1, 2, 3, 4]


def test_sharded_state_is_written_per_shard_and_restored_onto_the_template(tmp_path):
    """A state split over the 2 test devices (and a replicated leaf), saved asynchronously and
    donated right after (as the runner does), comes back equal and on the template's
    shardings; a template of another shape is refused naming the step."""
    devices = jax.devices()[:2]
    mesh = jax.sharding.Mesh(np.array(devices), ("slots",))
    w = np.arange(24.0, dtype=np.float32).reshape(4, 6)
    b = np.arange(3, dtype=np.int32)
    state = {
        "w": jax.device_put(w, NamedSharding(mesh, P("slots"))),
        "b": jax.device_put(b, NamedSharding(mesh, P())),
    }
    assert len(state["w"].addressable_shards) == 2
    path, progress = tmp_path / "c", {"rounds": {"local": 1}}
    donate = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)
    with ckpt.writer(path) as writer:
        ckpt.save(path, progress, state, [], writer)
        later = donate(state)  # the saved buffers may be reused; the save has its host copy
        ckpt.save(path, {"rounds": {"local": 2}}, later, [], writer)
    assert state_store.latest(path / "state") == 2
    template = jax.tree.map(jax.numpy.zeros_like, later)
    back = ckpt.restore_state(path, template, 1)
    np.testing.assert_array_equal(np.asarray(back["w"]), w)
    np.testing.assert_array_equal(np.asarray(back["b"]), b)
    assert back["w"].sharding == NamedSharding(mesh, P("slots"))
    assert back["b"].sharding == NamedSharding(mesh, P())
    np.testing.assert_array_equal(np.asarray(ckpt.restore_state(path, template, 2)["w"]), w + 1)
    with pytest.raises(ValueError, match=r"state/1: holds no state for this run"):
        ckpt.restore_state(path, {"w": np.zeros((4, 5), np.float32), "b": b}, 1)


def test_an_interrupted_save_leaves_the_previous_step(tmp_path):
    """What a crash mid-save leaves (orbax's temporary directory, partly written) is not a
    step: the checkpoint resumes from the previous one, and the next save goes on from it."""
    cfg, path = _saved(tmp_path)
    partial = path / "state" / "3.orbax-checkpoint-tmp-1234567"
    (partial / "state").mkdir(parents=True)
    (partial / "state" / "manifest.ocdbt").write_bytes(b"torn")
    back = read_resume(path, cfg)
    assert len(back.entry["target_accuracy"]) == 2 and ckpt.load(path).step == 2
    with ckpt.writer(path) as writer:  # the same step again replaces it, the next follows
        ckpt.save(path, {"rounds": {"local": 2}}, {"w": np.ones((2, 3), np.float32)}, [], writer)
        w2 = ckpt.restore_state(path, {"w": np.zeros((2, 3), np.float32)}, 2)["w"]
        np.testing.assert_array_equal(w2, np.ones((2, 3)))
        ckpt.save(path, {"rounds": {"local": 3}}, None, [_row(3)], writer)
    assert ckpt.load(path).step == 3


def _meta(path):
    return path / "state" / "2" / "meta" / "metadata"


def _empty(path):
    _meta(path).write_bytes(b"")


def _truncated(path):
    _meta(path).write_bytes(_meta(path).read_bytes()[:40])


def _random(path):
    _meta(path).write_bytes(np.random.default_rng(0).bytes(500))


def _foreign(path):
    _meta(path).write_text(json.dumps({"weights": [0, 1]}))


def _no_rows(path):
    (path / "metrics.jsonl").write_text("")


@pytest.mark.parametrize(
    ("damage", "what", "where"),
    [
        (_empty, "cannot be read", "state/2"),
        (_truncated, "cannot be read", "state/2"),
        (_random, "cannot be read", "state/2"),
        (_foreign, "no 'rounds' record", "state/2"),
        (_no_rows, "lacks 'local' round", "metrics.jsonl"),
    ],
)
def test_corrupt_checkpoint_is_a_clear_error(tmp_path, damage, what, where):
    cfg, path = _saved(tmp_path)
    damage(path)
    with pytest.raises(ValueError, match=what) as err:
        read_resume(path, cfg)
    message = str(err.value)
    assert f"checkpoint {path / where}:" in message
    assert f"delete {path} or run without resume" in message


def test_missing_state_arrays_are_a_clear_error(tmp_path):
    cfg, path = _saved(tmp_path)
    for f in (path / "state" / "2" / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.unlink()  # the array data of the step, lost
    back = read_resume(path, cfg)  # the progress is intact
    with pytest.raises(ValueError, match=r"state/2: holds no state") as err:
        back.restore({"w": np.zeros((2, 3), np.float32)})
    assert f"delete {path} or run without resume" in str(err.value)


def test_old_single_file_state_is_refused_and_a_fresh_run_replaces_it(tmp_path):
    """An earlier version's `state.npz` directory: resume names the file and how to start
    fresh (no traceback from orbax); a run without resume deletes it and starts over."""
    cfg = ExperimentConfig(**{**TINY, "rounds": 2, "algorithms": ("local",)})
    path = tmp_path / "old"
    path.mkdir()
    with (path / "state.npz").open("wb") as f:
        np.savez(f, progress=np.array(json.dumps({"rounds": {"local": 1}})), leaf_00000=np.zeros(3))
    (path / "metrics.jsonl").write_text(json.dumps(_row(1)) + "\n")
    with pytest.raises(ValueError) as err:
        run(cfg, progress=False, checkpoint=path, resume=True)
    message = str(err.value)
    assert f"checkpoint {path / 'state.npz'}: is the single-file state of an earlier" in message
    assert f"delete {path} or run without resume (no --resume)" in message
    run(cfg, progress=False, checkpoint=path)
    assert not (path / "state.npz").exists() and ckpt.load(path).progress["rounds"] == {"local": 2}


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
    (path / "state.npz").write_bytes(b"an earlier version's state")
    assert sorted(p.name for p in path.iterdir()) == [
        "metrics.jsonl",
        "notes.txt",
        "state",
        "state.npz",
    ]
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
