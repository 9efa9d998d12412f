"""The writers' files as exact as the checkpoint: a job killed after a checkpoint step is on
disk but before its rounds reach the writers, or halfway through a write, and then resumed,
leaves CSV and TensorBoard files that hold every round once and equal an uninterrupted run's.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from helpers import TINY_RUN, read_events

import pfedwn_jax
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.runner import sinks
from pfedwn_jax.runner.checkpoint import Checkpoint
from pfedwn_jax.runner.ledger import Ledger
from pfedwn_jax.runner.writers import CSVWriter, TensorBoardWriter

CFG = ExperimentConfig(**{**TINY_RUN, "rounds": 3, "algorithms": ("local", "fedavg")})


class Killed(BaseException):
    """Stands for kill -9: nothing after it runs (the driver's last flush is patched out)."""


def csv_rows(path: Path) -> list[tuple[str, ...]]:
    with path.open(newline="") as f:
        return [tuple(row) for row in csv.reader(f)]


def tb_scalars(directory: Path) -> list[tuple[str, str, int, float]]:
    """`(run/method, tag, step, value)` of every scalar in the event files, sorted."""
    out = []
    for where in sorted(p for p in directory.glob("*/*") if p.is_dir()):
        for event in read_events(where):
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    name = f"{where.parent.name}/{where.name}"
                    out.append((name, value.tag, event.step, value.simple_value))
    return sorted(out)


def job(where: Path, **kw):
    csv_writer = CSVWriter(where / "m.csv", append=bool(kw.get("resume")))
    writers = [csv_writer, TensorBoardWriter(where / "tb")]
    return pfedwn_jax.run(
        CFG, progress=False, checkpoint=where / "ckpt", checkpoint_every=1, block=1,
        writers=writers, **kw,
    )  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    pytest.importorskip("tensorboardX")
    where = tmp_path_factory.mktemp("reference")
    job(where)
    return csv_rows(where / "m.csv"), tb_scalars(where / "tb")


def kill_at(monkeypatch, commits: int, *, mid_write: bool = False) -> None:
    """Kill the job once `commits` checkpoint steps are complete on disk, before the rounds
    they cover reach the writers (`mid_write`: halfway through the next CSV write instead,
    after its rows are on disk but before its ledger is)."""
    done = {"commits": 0}
    commit = Checkpoint.commit

    def counted(self, meta, state):
        commit(self, meta, state)
        self.wait()
        done["commits"] += 1
        if done["commits"] == commits and not mid_write:
            raise Killed

    def wrote(self, event, path=None):
        if done["commits"] >= commits:
            raise Killed
        wrote_once(self, event, path)

    wrote_once = Ledger.wrote
    monkeypatch.setattr(Checkpoint, "commit", counted)
    monkeypatch.setattr(sinks.Writers, "close", lambda self: None)
    if mid_write:
        monkeypatch.setattr(Ledger, "wrote", wrote)


@pytest.mark.parametrize(("commits", "mid_write"), [(4, False), (5, True)])
def test_a_kill_between_checkpoint_and_writers_loses_and_repeats_nothing(
    tmp_path, monkeypatch, reference, commits, mid_write
):
    with monkeypatch.context() as m:
        kill_at(m, commits, mid_write=mid_write)
        with pytest.raises(Killed):
            job(tmp_path)
    job(tmp_path, resume=True)
    rows, scalars = reference
    assert csv_rows(tmp_path / "m.csv") == rows
    assert tb_scalars(tmp_path / "tb") == scalars


def test_a_fresh_job_replaces_the_csv(tmp_path, reference):
    (tmp_path / "m.csv").write_text("old,rows\n1,2\n")
    job(tmp_path)
    assert csv_rows(tmp_path / "m.csv") == reference[0]
