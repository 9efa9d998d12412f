"""Records that scale: a network-mode result keeps summaries in its JSON and per-slot arrays
in an `.npz` beside it (`Result.save`, `load_arrays`, `record_every`, `record_dtype`)."""

from __future__ import annotations

import dataclasses
import json
import statistics

import numpy as np
import pytest

from pfedwn_jax import run
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.results.entries import method_entry
from pfedwn_jax.results.report import count_links, format_table
from pfedwn_jax.results.result import (
    COMPACT_SCHEMA,
    OLD_SCHEMA,
    SCHEMA,
    Result,
    arrays_path,
    load_arrays,
)
from pfedwn_jax.results.table import RunInfo, Table

NETWORK = dict(
    mode="network",
    candidates=6,
    model="logreg",
    algorithms=("pfedwn",),
    rounds=3,
    local_steps=1,
    batch_size=8,
    min_samples=5,
    max_samples_per_client=10,
)


def _run(nodes: int) -> Result:
    """pFedWN in network mode on `nodes` nodes (3 rounds, logistic regression)."""
    return run(ExperimentConfig(num_neighbors=nodes - 1, **NETWORK), progress=False)


@pytest.fixture(scope="module")
def runs() -> dict[int, Result]:
    """The 200-node run (the 50-node one only where a test asks, `slow`)."""
    return {200: _run(200)}


def _longest_list(doc) -> int:
    if isinstance(doc, dict):
        return max([0, *map(_longest_list, doc.values())])
    if isinstance(doc, list):
        return max([len(doc), *map(_longest_list, doc)])
    return 0


def _json_and_npz_sizes(results: dict[int, Result], tmp_path) -> tuple[dict, dict]:
    """Bytes of each result's JSON and `.npz`; checks that no JSON list is per slot."""
    sizes, npz = {}, {}
    for n, res in results.items():
        path = res.save(tmp_path / f"r{n}.json")
        doc = json.loads(path.read_text())
        assert doc["schema"] == COMPACT_SCHEMA
        assert _longest_list(doc) < min(results)  # no list has one entry per slot or link
        sizes[n], npz[n] = path.stat().st_size, arrays_path(path).stat().st_size
    return sizes, npz


@pytest.mark.slow
def test_json_size_does_not_grow_with_the_network(runs, tmp_path):
    sizes, npz = _json_and_npz_sizes({50: _run(50), 200: runs[200]}, tmp_path)
    assert sizes[200] < 1.05 * sizes[50], sizes  # 4x the nodes, the same JSON
    assert npz[200] > 3 * npz[50]  # the per-slot arrays went to the .npz


def test_json_size_does_not_grow_with_the_slots(tmp_path):
    # the same check on results built without a run (fast): 50 and 200 slots, 5 rounds
    fake = {n: _fake_result(slots=n)[0] for n in (50, 200)}
    sizes, npz = _json_and_npz_sizes(fake, tmp_path)
    assert sizes[200] < 1.05 * sizes[50], sizes
    assert npz[200] > 3 * npz[50]


def test_npz_arrays_equal_the_in_memory_metrics(runs, tmp_path):
    res = runs[200]
    path = res.save(tmp_path / "r.json")
    arrays = load_arrays(path)
    m = res.methods["pfedwn"]
    for key in ("client_accuracy", "client_loss"):
        got = arrays[f"methods/pfedwn/{key}"]
        assert got.dtype == np.float32 and got.shape == (3, 200)
        np.testing.assert_array_equal(got, np.asarray(m[key], np.float32))
    for key in ("pi", "pi_trace", "train_loss"):
        np.testing.assert_array_equal(
            arrays[f"methods/pfedwn/records/{key}"], np.asarray(m["records"][key], np.float32)
        )
    assert arrays["methods/pfedwn/records/pi"].shape[:2] == (3, 200)
    np.testing.assert_array_equal(arrays["methods/pfedwn/rounds"], [1, 2, 3])
    np.testing.assert_array_equal(arrays["network/slot_neighbors"], res.network["slot_neighbors"])
    np.testing.assert_array_equal(arrays["data/train_counts"], res.data["train_counts"])
    np.testing.assert_allclose(arrays["network/positions"], res.network["positions"], rtol=1e-6)
    assert "network/adjacency" not in arrays  # [S, S]: the lists hold the same links


def test_json_summaries_are_the_client_accuracy_statistics(runs, tmp_path):
    res = runs[200]
    doc = json.loads(res.save(tmp_path / "r.json").read_text())
    m = doc["methods"]["pfedwn"]
    acc = res.methods["pfedwn"]["client_accuracy"]  # [R][S] lists
    stats = m["client_accuracy_stats"]
    for r, row in enumerate(acc):
        assert stats["mean"][r] == pytest.approx(sum(row) / len(row), abs=1e-12)
        assert stats["q50"][r] == pytest.approx(statistics.median(row), abs=1e-12)
        cuts = statistics.quantiles(row, n=10, method="inclusive")  # deciles, same rule
        assert stats["q10"][r] == pytest.approx(cuts[0], abs=1e-12)
        assert stats["q90"][r] == pytest.approx(cuts[-1], abs=1e-12)
        assert stats["q10"][r] <= stats["q50"][r] <= stats["q90"][r]
    assert m["target_accuracy"] == pytest.approx(res.methods["pfedwn"]["target_accuracy"])
    assert m["max_target_accuracy"] == res.methods["pfedwn"]["max_target_accuracy"]


def test_load_puts_the_arrays_back(runs, tmp_path):
    res = runs[200]
    back = Result.load(res.save(tmp_path / "r.json"))
    assert back.config == res.config
    np.testing.assert_array_equal(back.client_accuracy("pfedwn"), res.client_accuracy("pfedwn"))
    np.testing.assert_allclose(
        back.records("pfedwn", "pi"), res.records("pfedwn", "pi"), rtol=1e-6, atol=1e-7
    )
    np.testing.assert_array_equal(back.recorded_rounds("pfedwn"), [1, 2, 3])
    assert back.summary() == res.summary()
    mask = np.asarray(res.network["slot_neighbor_mask"], bool)
    assert count_links(back.network) == count_links(res.network) == mask[:, 1:].sum()
    assert format_table(back) == format_table(res)


# --------------------------------------------------------------------------- without a run
def _fake_rows(rounds: int, slots: int, k: int) -> list[dict]:
    """Random per-round host results of one network-mode run (every slot a target)."""
    rng = np.random.default_rng(0)
    rows = []
    for r in range(1, rounds + 1):
        pi = rng.dirichlet(np.ones(k), slots)[None]
        rows.append(
            {
                "accuracy": rng.uniform(size=(1, slots)),
                "loss": rng.exponential(size=(1, slots)),
                "finite": np.ones((1, slots), bool),
                "records": {"pi": pi, "rate": np.array([r / 10], np.float32)},
            }
        )
    return rows


def _entry(config: ExperimentConfig, rows: list[dict], per_block: int) -> dict:
    """The pFedWN entry of a table filled with `rows` in blocks of `per_block` rounds."""
    slots = rows[0]["accuracy"].shape[1]
    table = Table([RunInfo(np.ones(slots, bool), np.arange(slots))], [{"seed": 0}], ["pfedwn"])
    for lo in range(0, len(rows), per_block):
        part = rows[lo : lo + per_block]
        block = {
            key: np.concatenate([row[key] for row in part])
            for key in ("accuracy", "loss", "finite")
        }
        block["records"] = {
            key: np.concatenate([row["records"][key] for row in part]) for key in ("pi", "rate")
        }
        table.add_block(0, "pfedwn", lo, block, 0.1 * len(part))
    track = table.track(0, "pfedwn")
    return method_entry(track, config.hparams_for("pfedwn"), config.record_every, config.rounds)


def _fake_result(rounds: int = 5, slots: int = 6, k: int = 3, **cfg) -> tuple[Result, list[dict]]:
    """A network-mode `Result` built through the table and its entries from random rows, and
    the rows."""
    config = ExperimentConfig(mode="network", num_neighbors=slots - 1, rounds=rounds, **cfg)
    rows = _fake_rows(rounds, slots, k)
    entry = _entry(config, rows, per_block=2)
    rng = np.random.default_rng(1)
    network = {"mode": "network", "num_slots": slots, "positions": rng.uniform(size=(slots, 2))}
    res = Result(config, network, {"name": "x", "train_counts": [3] * slots}, {"pfedwn": entry})
    return res, rows


def test_record_every_keeps_rows_of_multiples_and_the_last_round(tmp_path):
    res, rows = _fake_result(rounds=5, record_every=2)
    m = res.methods["pfedwn"]
    assert m["recorded_rounds"] == [2, 4, 5]
    assert m["client_accuracy"] == [rows[i]["accuracy"][0].tolist() for i in (1, 3, 4)]
    assert len(m["records"]["pi"]) == 3 and len(m["records"]["rate"]) == 5  # scalars: all
    assert len(m["client_accuracy_stats"]["mean"]) == len(m["target_accuracy"]) == 5
    want = [float(np.mean(row["accuracy"])) for row in rows]
    np.testing.assert_allclose(m["client_accuracy_stats"]["mean"], want)
    arrays = load_arrays(res.save(tmp_path / "r.json"))
    np.testing.assert_array_equal(arrays["methods/pfedwn/rounds"], [2, 4, 5])
    assert arrays["methods/pfedwn/records/pi"].shape == (3, 6, 3)
    back = Result.load(tmp_path / "r.json")
    np.testing.assert_array_equal(back.recorded_rounds("pfedwn"), [2, 4, 5])
    np.testing.assert_allclose(back.records("pfedwn", "rate"), np.arange(1, 6) / 10, rtol=1e-6)


def test_the_entry_does_not_depend_on_how_rounds_are_cut_into_blocks():
    config = ExperimentConfig(mode="network", num_neighbors=5, rounds=5, record_every=2)
    rows = _fake_rows(5, 6, 3)
    one, each = _entry(config, rows, per_block=5), _entry(config, rows, per_block=1)
    one["timings"], each["timings"] = one["timings"]["round_s"], each["timings"]["round_s"]
    assert json.dumps(one) == json.dumps(each)


def test_float16_records(tmp_path):
    res, _ = _fake_result(record_dtype="float16")
    arrays = load_arrays(res.save(tmp_path / "r.json"))
    got = arrays["methods/pfedwn/client_accuracy"]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, res.methods["pfedwn"]["client_accuracy"], atol=5e-4)


def test_a_stale_or_missing_npz_is_refused(tmp_path):
    res, _ = _fake_result()
    path = res.save(tmp_path / "r.json")
    other, _ = _fake_result(rounds=4)
    other.save(tmp_path / "other.json")
    arrays_path(tmp_path / "other.json").replace(arrays_path(path))  # a different run's
    with pytest.raises(ValueError, match="not the archive written with it"):
        Result.load(path)
    arrays_path(path).unlink()
    with pytest.raises(ValueError, match="cannot read its arrays"):
        load_arrays(path)


def test_single_mode_stays_inline_and_old_files_load(tmp_path):
    res, _ = _fake_result()
    single = dataclasses.replace(res, config=res.config.replace(mode="single"))
    path = single.save(tmp_path / "s.json")
    assert json.loads(path.read_text())["schema"] == SCHEMA
    assert not arrays_path(path).exists()
    with pytest.raises(ValueError, match="inline"):
        load_arrays(path)
    # a file of an earlier version, before the summaries (no stats, no recorded rounds, the
    # validation accuracy as a record) still loads, its validation under today's names
    doc = json.loads(path.read_text())
    for key in ("client_accuracy_stats", "recorded_rounds", "record_every", "record_last"):
        del doc["methods"]["pfedwn"][key]
    doc["schema"] = OLD_SCHEMA
    entry = doc["methods"]["pfedwn"]
    entry["records"]["val_acc"] = entry["client_accuracy"]
    entry["records"]["target_val_acc"] = [0.5] * 5
    path.write_text(json.dumps(doc))
    old = Result.load(path)
    assert old.metric("pfedwn", "target_val_accuracy").tolist() == [0.5] * 5
    assert "val_acc" not in old.methods["pfedwn"]["records"]
    assert old.methods["pfedwn"]["client_val_accuracy"] == entry["client_accuracy"]
    np.testing.assert_array_equal(old.recorded_rounds("pfedwn"), np.arange(1, 6))
    np.testing.assert_allclose(
        old.client_accuracy_stats("pfedwn")["mean"], old.client_accuracy("pfedwn").mean(axis=1)
    )
    doc["schema"] = "pfedwn-results/99"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="schema must be one of"):
        Result.load(path)


def test_record_fields_are_checked():
    with pytest.raises(ValueError, match=r"record_every must be in \[1, 4\]; got 5"):
        ExperimentConfig(rounds=4, record_every=5)
    with pytest.raises(ValueError, match="record_dtype must be one of"):
        ExperimentConfig(record_dtype="float64")
