"""Config and CLI reach every partition scheme of `pfedwn_jax.data` (the naturally federated
"natural" one, by writer, included) and `max_samples_per_client`, on real MNIST images from
../shared/data with writer ids assigned in blocks of distinct sizes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pfedwn_jax import run
from pfedwn_jax.cli import main
from pfedwn_jax.data import ALL_SCHEMES
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.setup import load_data

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist_10k_2k.npz"
if not SHARED.is_file():  # a worktree beside the repository: the repository's ../shared
    SHARED = Path("/work/shared/data/mnist_10k_2k.npz")
SIZES = [20 + w for w in range(28)]  # writer w holds 20 + w samples: sizes tell writers apart


@pytest.fixture(scope="module")
def writers_npz(tmp_path_factory) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """`("npz:PATH", x [1000, 28, 28], y [1000], writer [1000])` of the pool (train + test)."""
    if not SHARED.is_file():
        pytest.skip(f"real MNIST subset not found at {SHARED}")
    with np.load(SHARED) as f:
        x, y = f["x_train"][:1000], f["y_train"][:1000]
    writer = np.full(1000, 99, np.int64)  # the rest: one writer of 62 samples
    writer[: sum(SIZES)] = np.repeat(np.arange(len(SIZES)), SIZES)
    path = tmp_path_factory.mktemp("natural") / "mnist_writers.npz"
    np.savez(
        path,
        x_train=x[:900],
        y_train=y[:900],
        x_test=x[900:],
        y_test=y[900:],
        writer_train=writer[:900],
        writer_test=writer[900:],
    )
    return f"npz:{path}", x, y, writer


def _clients(data) -> list[tuple[list[int], list[int]]]:
    """Per client: its labels and its images' pixel sums (train + test), sorted."""
    out = []
    for n in range(len(data.train.count)):
        parts = [(s.y[n][: s.count[n]], s.x[n][: s.count[n]]) for s in (data.train, data.test)]
        labels = sorted(np.concatenate([p[0] for p in parts]).tolist())
        sums = sorted(np.concatenate([p[1].reshape(len(p[1]), -1).sum(1) for p in parts]).tolist())
        out.append((labels, sums))
    return out


def test_every_scheme_of_the_data_package_is_accepted():
    for scheme in ALL_SCHEMES:
        assert ExperimentConfig(partition=scheme).partition == scheme
    with pytest.raises(ValueError, match=r"partition must be one of .*'natural'.*; got 'writer'"):
        ExperimentConfig(partition="writer")


@pytest.mark.slow
def test_natural_partition_gives_each_client_one_whole_writer(writers_npz):
    name, x, y, writer = writers_npz
    data, _ = load_data(ExperimentConfig(dataset=name, partition="natural", num_neighbors=9))
    sums = x.reshape(1000, -1).sum(1)
    seen = set()
    for labels, pix in _clients(data):
        w = SIZES.index(len(labels)) if len(labels) in SIZES else 99  # size names the writer
        assert w not in seen
        seen.add(w)
        assert labels == sorted(y[writer == w].tolist())  # all of that writer's samples
        assert pix == sorted(sums[writer == w].tolist())
    assert len(seen) == 10


def test_max_samples_per_client_keeps_a_subset_of_each_writer(writers_npz):
    name, x, y, writer = writers_npz
    cfg = ExperimentConfig(
        dataset=name, partition="natural", num_neighbors=9, max_samples_per_client=24
    )
    sums = x.reshape(1000, -1).sum(1)
    for labels, pix in _clients(load_data(cfg)[0]):
        assert 20 <= len(labels) <= 24
        # the samples all come from one writer (whose block holds every one of them)
        owners = {w for w in set(writer.tolist()) if not Counter(pix) - Counter(sums[writer == w])}
        assert len(owners) == 1
        (w,) = owners
        assert not Counter(labels) - Counter(y[writer == w].tolist())
        assert len(labels) == min(24, int((writer == w).sum()))
    with pytest.raises(ValueError, match="max_samples_per_client=10 is below min_samples=20"):
        ExperimentConfig(max_samples_per_client=10)


def test_too_few_samples_or_writers_is_a_clear_error(writers_npz):
    name = writers_npz[0]
    with pytest.raises(ValueError, match=r"partition: .*1000 samples.*60 \* 20 = 1200"):
        run(ExperimentConfig(dataset=name, num_neighbors=59, rounds=1), progress=False)
    with pytest.raises(ValueError, match=r"partition: .*num_clients=31 exceeds the 29 writers"):
        run(
            ExperimentConfig(dataset=name, partition="natural", num_neighbors=30, rounds=1),
            progress=False,
        )


def test_cli_runs_a_natural_partition(writers_npz, tmp_path):
    name = writers_npz[0]
    out = tmp_path / "out"
    argv = ["run", "--dataset", name, "--partition", "natural", "--max-samples-per-client", "30"]
    argv += ["--num-neighbors", "4", "--rounds", "1", "--model", "logreg", "--algorithms"]
    argv += ["local", "--out", str(out), "--quiet", "--no-plot"]
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["partition"] == "natural"
    assert res["config"]["max_samples_per_client"] == 30
    counts = np.add(res["data"]["train_counts"], res["data"]["test_counts"])
    assert len(counts) == 5 and ((counts >= 20) & (counts <= 30)).all()
