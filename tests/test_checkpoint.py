"""Checkpoint directories: exact resume, orbax steps of a sharded state, nothing deleted without
`overwrite`, the data checked, a corrupt newest step skipped, clear errors."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sys
import types

import jax
import numpy as np
import pytest
from helpers import TINY_RUN
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pfedwn_jax import run, state_store
from pfedwn_jax.cli import main
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.runner import checkpoint as ckpt

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


def same(a, b) -> None:
    for name in a.methods:
        for key in KEYS:
            assert a.methods[name][key] == b.methods[name][key], (name, key)


@pytest.fixture(scope="module")
def uninterrupted():
    return run(ExperimentConfig(**TINY), progress=False)


def _meta(path, step: int | None = None) -> dict:
    """The meta JSON of a checkpoint's step (default: the newest)."""
    _, meta = state_store.restore(path / "state", None, step)
    return meta


def test_kill_mid_method_and_resume_is_exact(uninterrupted, tmp_path):
    cfg, path = ExperimentConfig(**TINY), tmp_path / "ckpt"
    with pytest.raises(Stop):
        run(cfg, progress=False, checkpoint=path, checkpoint_every=3, block=1,
            callback=stop_at("fedavg", 5))  # fmt: skip
    progress = _meta(path)["progress"]
    assert progress["current"] == [0, "fedavg", 3]  # the last commit: round 3
    assert [0, "local"] in progress["finished"]
    assert sorted(p.name for p in path.iterdir()) == [".lock", "blocks", "job.json", "state"]
    resumed = run(cfg, progress=False, checkpoint=path, checkpoint_every=3, resume=True)
    same(uninterrupted, resumed)
    assert len(resumed.methods["fedavg"]["timings"]["round_s"]) == TINY["rounds"]


def test_resume_does_not_depend_on_block_lengths(uninterrupted, tmp_path):
    cfg, path = ExperimentConfig(**TINY), tmp_path / "ckpt"
    with pytest.raises(Stop):
        run(cfg, progress=False, checkpoint=path, block=2, callback=stop_at("local", 4))
    resumed = run(cfg, progress=False, checkpoint=path, resume=True, block=3)
    same(uninterrupted, resumed)


def test_an_existing_checkpoint_is_never_deleted_without_overwrite(uninterrupted, tmp_path):
    cfg, path = ExperimentConfig(**TINY), tmp_path / "ckpt"
    with pytest.raises(Stop):
        run(cfg, progress=False, checkpoint=path, callback=stop_at("local", 2))
    before = sorted(p.relative_to(path) for p in path.rglob("*"))
    for other in (cfg, cfg.replace(rounds=2, algorithms=("local",))):
        with pytest.raises(ValueError, match=r"resume=True .* or overwrite=True"):
            run(other, progress=False, checkpoint=path)
    assert sorted(p.relative_to(path) for p in path.rglob("*")) == before
    with pytest.raises(ValueError, match="exclude each other"):
        run(cfg, progress=False, checkpoint=path, resume=True, overwrite=True)
    same(uninterrupted, run(cfg, progress=False, checkpoint=path, overwrite=True))


def test_resume_refuses_other_config_or_changed_data(tmp_path):
    data = tmp_path / "data.npz"
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 255, (200, 4, 4, 1), dtype=np.uint8),
        "y_train": rng.integers(0, 3, 200),
        "x_test": rng.integers(0, 255, (40, 4, 4, 1), dtype=np.uint8),
        "y_test": rng.integers(0, 3, 40),
    }
    np.savez(data, **arrays)
    cfg = ExperimentConfig(**{**TINY, "dataset": f"npz:{data}"})
    path = tmp_path / "ckpt"
    with pytest.raises(Stop):
        run(cfg, progress=False, checkpoint=path, callback=stop_at("local", 2))
    with pytest.raises(ValueError, match=r"lr 0\.05 then, 0\.1 now"):
        run(cfg.replace(lr=0.1), progress=False, checkpoint=path, resume=True)
    arrays["x_train"][0, 0, 0, 0] ^= 1  # one pixel of one image
    np.savez(data, **arrays)
    with pytest.raises(
        ValueError, match=r"the data npz:.*data.npz changed since it was written: SHA-256"
    ):
        run(cfg, progress=False, checkpoint=path, resume=True)


def test_layout_and_checkpoint_every(tmp_path):
    """Block files of every block; a committed step every `checkpoint_every` rounds and at the
    end of a method (the last without a state); the latest two steps kept."""
    cfg = ExperimentConfig(**{**TINY, "rounds": 7, "algorithms": ("local",)})
    path = tmp_path / "ckpt"
    run(cfg, progress=False, checkpoint=path, checkpoint_every=3, block=1)
    blocks = sorted((path / "blocks").iterdir())
    assert [b.name for b in blocks] == sorted(f"0.local.{r}.1.npz" for r in range(7))
    steps = sorted(int(p.name) for p in (path / "state").iterdir())
    assert steps == [2, 3]  # commits after rounds 3, 6 and 7
    assert (path / "state" / "2" / "state").is_dir()
    assert not (path / "state" / "3" / "state").exists()
    assert _meta(path)["progress"]["finished"] == [[0, "local"]]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="checkpoint_every"):
            run(cfg, progress=False, checkpoint=tmp_path / "c", checkpoint_every=bad)
    with pytest.raises(ValueError, match="on_divergence"):
        run(cfg, progress=False, on_divergence="ignore")


def test_a_corrupt_newest_step_falls_back_to_the_previous(uninterrupted, tmp_path, caplog):
    cfg, path = ExperimentConfig(**TINY), tmp_path / "ckpt"
    with pytest.raises(Stop):
        run(cfg, progress=False, checkpoint=path, block=1, callback=stop_at("fedavg", 4))
    newest = max(int(p.name) for p in (path / "state").iterdir())
    for f in (path / "state" / str(newest) / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])  # truncated
    with caplog.at_level("WARNING", logger="pfedwn_jax"):
        resumed = run(cfg, progress=False, checkpoint=path, resume=True)
    assert f"step {newest} cannot be restored" in caplog.text
    assert f"resuming from step {newest - 1}" in caplog.text
    same(uninterrupted, resumed)


def test_an_unreadable_meta_falls_back_and_half_written_steps_are_ignored(
    uninterrupted, tmp_path, caplog
):
    """One warning naming the skipped step and the one resumed from; no orbax lines."""
    cfg, path = ExperimentConfig(**TINY), tmp_path / "ckpt"
    with pytest.raises(Stop):
        run(cfg, progress=False, checkpoint=path, block=1, callback=stop_at("fedavg", 4))
    newest = max(int(p.name) for p in (path / "state").iterdir())
    (path / "state" / str(newest) / "meta" / "metadata").write_bytes(b"\x00torn")
    (path / "state" / str(newest) / "_CHECKPOINT_METADATA").write_bytes(b"{")
    partial = path / "state" / f"{newest + 1}.orbax-checkpoint-tmp-1234567"
    (partial / "state").mkdir(parents=True)  # what a crash mid-save leaves: not a step
    seen = []

    def callback(name, rounds_done, metrics):  # the unreadable step is gone before a save
        seen.append(sorted(p.name for p in (path / "state").iterdir() if p.name.isdigit()))

    with caplog.at_level("INFO"):
        resumed = run(cfg, progress=False, checkpoint=path, resume=True, callback=callback)
    same(uninterrupted, resumed)
    assert str(newest) not in seen[0], seen[0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"step {newest} cannot be read" in warnings[0]
    assert f"resuming from step {newest - 1}" in warnings[0]


def test_a_refused_resume_names_what_changed():
    cfg = {"lr": 0.05, "dataset": "npz:/d.npz", "rounds": 7, "seed": 0}
    runs = [{"config": cfg, "data": "a" * 64}, {"config": {**cfg, "seed": 1}, "data": "a" * 64}]
    old = ckpt.job_of(runs, {"records": (), "mesh_runs": 2})
    runs = [{**r, "data": "b" * 64} for r in runs]
    runs[1]["config"] = {**runs[1]["config"], "lr": 0.1}
    new = ckpt.job_of(runs, {"records": (), "mesh_runs": 1})
    text = ckpt.describe_change(old, new)
    assert text.startswith("was written for another job: "), text
    for part in (
        "the data npz:/d.npz changed since it was written (every run): SHA-256 of its arrays "
        "aaaaaaaaaaaa... then, bbbbbbbbbbbb... now",
        "lr 0.05 then, 0.1 now (run 1)",
        "devices on the run axis: 2 then, 1 now",
    ):
        assert part in text, (part, text)
    assert "it holds 2 run(s), this job 1" in ckpt.describe_change(old, {**new, "runs": runs[:1]})
    a, b = ({"runs": [{"config": {f"f{i}": i + k for i in range(9)}, "data": ""}]} for k in (0, 1))
    assert ckpt.describe_change(a, b).endswith("f3 3 then, 4 now (and 5 more difference(s))")
    general = "was written for a different config, data or number of devices"
    assert ckpt.describe_change(None, new) == general  # no job.json: an older checkpoint
    assert ckpt.describe_change({"runs": "torn"}, new) == general
    assert ckpt.describe_change(old, old) == general  # equal descriptions, other hashes


def test_late_reads_into_a_closed_event_loop_are_not_printed():
    """Orbax closes its event loop when one read of a damaged step fails; tensorstore's other
    reads then call into it, and Python would print each `RuntimeError: Event loop is
    closed` as a traceback. The state store's hook drops exactly these."""
    assert getattr(sys.unraisablehook, "pfedwn_closed_loop", False)
    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed") as closed:
        loop.call_soon_threadsafe(print)
    passed = []
    hook = state_store._drop_closed_loop_callbacks(passed.append)

    def unraisable(exc):
        return types.SimpleNamespace(
            exc_type=type(exc), exc_value=exc, exc_traceback=exc.__traceback__,
            err_msg=None, object=None,
        )  # fmt: skip

    hook(unraisable(closed.value))
    assert passed == []
    for other in (RuntimeError("Event loop is closed"), ValueError("x")):  # not from asyncio
        hook(unraisable(other))
    assert len(passed) == 2


def test_earlier_versions_and_files_are_refused(tmp_path):
    cfg = ExperimentConfig(**{**TINY, "rounds": 2, "algorithms": ("local",)})
    for old in ("state.npz", "metrics.jsonl", "rows.jsonl"):
        path = tmp_path / old.replace(".", "_")
        path.mkdir()
        (path / old).write_text("an earlier version's checkpoint")
        with pytest.raises(ValueError, match=f"earlier version \\({old}\\)"):
            run(cfg, progress=False, checkpoint=path, resume=True)
        run(cfg, progress=False, checkpoint=path, overwrite=True)
        assert not (path / old).exists()
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    with pytest.raises(ValueError, match=r"not a directory|is a file"):
        run(cfg, progress=False, checkpoint=a_file)
    assert a_file.read_text() == "mine"


def test_two_processes_cannot_write_one_checkpoint(tmp_path):
    cfg = ExperimentConfig(**{**TINY, "rounds": 2, "algorithms": ("local",)})
    path = tmp_path / "ckpt"
    with ckpt.Checkpoint(path, "fp", "new"):
        with pytest.raises(ValueError, match="in use by another process"):
            run(cfg, progress=False, checkpoint=path)
    run(cfg, progress=False, checkpoint=path)  # the lock is released on exit


def test_a_busy_or_interrupted_checkpoint_is_refused_before_the_set_up(tmp_path, monkeypatch):
    from pfedwn_jax.runner import job as api

    cfg = ExperimentConfig(**{**TINY, "rounds": 2, "algorithms": ("local",)})
    path = tmp_path / "ckpt"
    with pytest.raises(Stop):
        run(cfg, progress=False, checkpoint=path, block=1, callback=stop_at("local", 1))
    monkeypatch.setattr(api, "setup_runs", lambda configs: pytest.fail("set up first"))
    with pytest.raises(ValueError, match="holds an interrupted run"):
        run(cfg, progress=False, checkpoint=path)
    lock = ckpt._lock(path)  # another job writing it
    for mode in ({}, {"resume": True}, {"overwrite": True}):
        with pytest.raises(ValueError, match=r"in use by another process \(it holds .*\.lock\)"):
            run(cfg, progress=False, checkpoint=path, **mode)
    lock.close()
    assert (path / "state").is_dir()


def test_sharded_state_is_written_per_shard_and_restored_onto_the_template(tmp_path):
    """A state split over the 2 test devices (and a replicated leaf), committed asynchronously
    and donated right after (as the driver does), comes back equal and on the template's
    shardings; a template of another shape is refused."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("slots",))
    w = np.arange(24.0, dtype=np.float32).reshape(4, 6)
    b = np.arange(3, dtype=np.int32)
    state = {
        "w": jax.device_put(w, NamedSharding(mesh, P("slots"))),
        "b": jax.device_put(b, NamedSharding(mesh, P())),
    }
    donate = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)
    path = tmp_path / "c"
    with ckpt.Checkpoint(path, "fp", "new") as c:
        c.commit({"progress": {"current": [0, "local", 1]}}, state)
        later = donate(state)  # the saved buffers may be reused; the save has its host copy
        c.commit({"progress": {"current": [0, "local", 2]}}, later)
    template = jax.tree.map(jax.numpy.zeros_like, later)
    with ckpt.Checkpoint(path, "fp", "resume") as c:
        assert c.saved.step == 2
        back = c.restore(template)
    np.testing.assert_array_equal(np.asarray(back["w"]), w + 1)
    np.testing.assert_array_equal(np.asarray(back["b"]), b + 1)
    assert back["w"].sharding == NamedSharding(mesh, P("slots"))
    assert back["b"].sharding == NamedSharding(mesh, P())
    with pytest.raises(ValueError, match="different config"):
        ckpt.Checkpoint(path, "another", "resume").__enter__()


def test_a_step_keeps_the_meta_of_its_commit(tmp_path):
    """The driver appends to its block list while a step is written in the background: the
    step holds the list as it was at the commit (else a resume replays a block past its
    step and the writers miss that round)."""
    blocks = [[0, "local", 0, 1, 0.1]]
    with ckpt.Checkpoint(tmp_path / "c", "fp", "new") as c:
        c.commit({"progress": {"current": [0, "local", 1], "blocks": blocks}}, {"w": np.ones(2)})
        blocks.append([0, "local", 1, 1, 0.1])  # the next block, before the step is on disk
    with ckpt.Checkpoint(tmp_path / "c", "fp", "resume") as c:
        assert c.saved.meta["progress"]["blocks"] == [[0, "local", 0, 1, 0.1]]


def test_remove_deletes_only_checkpoint_files(tmp_path):
    cfg = ExperimentConfig(**{**TINY, "rounds": 2, "algorithms": ("local",)})
    path = tmp_path / "ckpt"
    run(cfg, progress=False, checkpoint=path)
    (path / "notes.txt").write_text("mine")
    ckpt.remove(path)
    assert sorted(p.name for p in path.iterdir()) == ["notes.txt"]
    (path / "notes.txt").unlink()
    ckpt.remove(path)
    assert not path.exists()


def test_cli_checkpoint_every_zero_writes_no_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ckpt.Checkpoint, "commit", lambda *a: pytest.fail("saved a checkpoint"))
    argv = ["run", "--model", "logreg", "--num-neighbors", "3", "--rounds", "1"]
    argv += ["--algorithms", "local", "--quiet", "--no-plot"]
    assert main([*argv, "--out", str(tmp_path / "a"), "--checkpoint-every", "0"]) == 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["results.json"]
    for bad in (["--checkpoint-every", "-1"], ["--checkpoint-every", "0", "--resume"]):
        capsys.readouterr()
        assert main([*argv, "--out", str(tmp_path / "b"), *bad]) == 2
        assert "--checkpoint-every" in capsys.readouterr().err


def test_cli_rerun_without_resume_keeps_an_interrupted_checkpoint(tmp_path, capsys):
    """A forgetful rerun into the directory of an interrupted run: exit 2 naming --resume and
    --overwrite, the checkpoint untouched."""
    out = tmp_path / "out"
    cfg = ExperimentConfig(**{**TINY, "rounds": 4, "algorithms": ("local",)})
    with pytest.raises(Stop):
        run(cfg, progress=False, checkpoint=out / "checkpoint", callback=stop_at("local", 2))
    saved = json.dumps(sorted(str(p) for p in (out / "checkpoint").rglob("*")))
    argv = ["run", "--model", "logreg", "--num-neighbors", "3", "--rounds", "2"]
    argv += ["--algorithms", "local", "--quiet", "--no-plot", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "--overwrite" in err and "Traceback" not in err
    assert json.dumps(sorted(str(p) for p in (out / "checkpoint").rglob("*"))) == saved
    assert main([*argv, "--overwrite"]) == 0
    assert not (out / "checkpoint").exists()
    shutil.rmtree(out)
