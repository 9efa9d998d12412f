"""Test data builders and constants shared by several test modules.

Import them with `from helpers import ...` (pytest puts `tests/` on `sys.path`); fixtures built
on them are registered in `tests/conftest.py`. No JAX computation runs at import.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pfedwn_jax.data import ClientData, Dataset

# The engine's toy problem: 4x4 grey images, 3 classes, clients padded to M samples.
# A tiny, fast experiment: logistic regression, 4 clients (target + 3 neighbors, all selected:
# their P_err at this gamma_th are 0.077, 0.107 and ~0, below eps and below the formula's
# ceiling 0.135), 3 rounds. Tests extend it with `{**TINY_RUN, ...}`.
TINY_RUN = dict(
    model="logreg", num_neighbors=3, rounds=3, batch_size=32, lr=0.05, gamma_th=1.0, eps=0.12
)

# TINY_RUN with 5 neighbors of which topology seeds 0 and 3 select 2 and 3: runs of
# different slot counts that share one program (padded slots), 2 rounds.
VARIED_RUN = {**TINY_RUN, "num_neighbors": 5, "eps": 0.05, "gamma_th": 5.0, "rounds": 2}


def loss_rtol() -> float:
    """Relative tolerance of a loss computed two ways (batched or not, split or not): float32
    summation order alone on the CPU; an accelerator's batched kernels sum differently
    (1.2e-5 seen on an H100 between a sweep and `run()`). A function: asking for the backend
    at import would start JAX before `conftest` sets its CPU devices."""
    return 1e-5 if jax.default_backend() == "cpu" else 1e-4


SHAPE = (4, 4, 1)
CLASSES = 3
M = 16  # padded samples per client
COUNTS = np.array([11, 5, 0, 9, 3])  # one empty client; the largest < M (padded steps)
B = 4  # batch size


def shared_data_file(name: str) -> Path:
    """A file of the shared real-data folder: `$PFEDWN_DATA_DIR`, else `shared/data` beside
    the repository or beside its parent (a git worktree's folder); the test is skipped,
    saying where it looked, when none holds it."""
    repo = Path(__file__).resolve().parents[1]
    folders = [os.environ.get("PFEDWN_DATA_DIR"), repo.parent / "shared" / "data"]
    folders.append(repo.parents[1] / "shared" / "data")
    for folder in folders:
        if folder and (Path(folder) / name).is_file():
            return Path(folder) / name
    pytest.skip(f"{name} is in none of {[str(f) for f in folders if f]}")


def make_data(counts=COUNTS, seed=0, pad_seed=None, max_samples=M) -> ClientData:
    """Random uint8 images `[len(counts), max_samples, *SHAPE]`; padded entries are 0 unless
    `pad_seed` fills them with junk (which must never change a result)."""
    rng = np.random.default_rng(seed)
    n = len(counts)
    x = rng.integers(0, 256, (n, max_samples, *SHAPE), dtype=np.uint8)
    y = rng.integers(0, CLASSES, (n, max_samples)).astype(np.int32)
    mask = np.arange(max_samples)[None, :] < np.asarray(counts)[:, None]
    junk = np.random.default_rng(pad_seed)
    x = np.where(
        mask[..., None, None, None],
        x,
        junk.integers(0, 256, x.shape, dtype=np.uint8) if pad_seed else 0,
    )
    y = np.where(mask, y, junk.integers(0, CLASSES, y.shape) if pad_seed else 0).astype(np.int32)
    return ClientData(
        jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask), jnp.asarray(counts, jnp.int32)
    )


def indexed_dataset(n_train=300, n_test=100, classes=5, seed=0) -> Dataset:
    """Images that encode their pool index (+1) in two pixels, so a sample can be traced back
    through a partition (`decode`); up to 65,535 samples."""
    rng = np.random.default_rng(seed)
    n = n_train + n_test
    x = np.zeros((n, 4, 4, 1), np.uint8)
    x[:, 0, 0, 0], x[:, 0, 1, 0] = (np.arange(n) + 1) // 256, (np.arange(n) + 1) % 256
    y = rng.integers(0, classes, size=n).astype(np.int32)
    return Dataset(x[:n_train], y[:n_train], x[n_train:], y[n_train:], classes, "indexed")


def decode(cd: ClientData) -> list[np.ndarray]:
    """Pool indices of each client's real samples in an `indexed_dataset` split."""
    x, mask = np.asarray(cd.x), np.asarray(cd.mask)
    ids = x[..., 0, 0, 0].astype(int) * 256 + x[..., 0, 1, 0] - 1
    return [ids[n][mask[n]] for n in range(ids.shape[0])]


def toml_text(table: Mapping[str, Any]) -> str:
    """A TOML document of plain values (the subset `tomllib` reads back to the same values).

    None entries are left out (TOML has no null); nested mappings become `[a."b"]` tables.
    """
    lines = _toml_table(table, ())
    return "\n".join(lines) + "\n"


def _toml_table(table: Mapping[str, Any], path: tuple[str, ...]) -> list[str]:
    lines = [f"[{'.'.join(_toml_str(k) for k in path)}]"] if path else []
    subtables = []
    for key, value in table.items():
        if value is None:
            continue
        if isinstance(value, Mapping):
            subtables.append((key, value))
        else:
            lines.append(f"{_toml_str(key)} = {_toml_value(value)}")
    for key, value in subtables:
        lines.extend(_toml_table(value, (*path, key)))
    return lines


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"toml_text writes finite floats only; got {value!r}")
        return repr(value)
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"toml_text cannot write {type(value).__name__} {value!r}")


def _toml_str(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def json_roundtrip(obj: Any) -> Any:
    """`obj` written as JSON and read back (what a results file holds)."""
    return json.loads(json.dumps(obj))


@contextlib.contextmanager
def mock_tfds(num_examples: int) -> Iterator[None]:
    """`tfds.testing.mock_data(num_examples)` with its batched read working: random examples
    from `tfds.data_source`, no files, no network.

    In tensorflow-datasets 4.9.10 the mock sets `__getitems__` on a MagicMock as a plain
    attribute, so it is called without the source as first argument and fails; the batch read
    of `pfedwn_jax.data.tfds_source` uses it. The replacement takes the keys alone.
    """
    import tensorflow_datasets as tfds
    from tensorflow_datasets.testing import mocking

    def getitems(record_keys, generator, serialized=False):
        assert not serialized
        return [generator[k] for k in record_keys]

    real = mocking._getitems
    mocking._getitems = getitems
    try:
        with tfds.testing.mock_data(num_examples=num_examples):
            yield
    finally:
        mocking._getitems = real


def table_entry(
    hp: Any,
    accuracy: np.ndarray,
    loss: np.ndarray,
    is_target: np.ndarray,
    records: Mapping[str, np.ndarray] | None = None,
    seconds: float = 0.1,
) -> dict:
    """A single run's method entry built as the driver builds it (one table block):
    `accuracy`, `loss` `[R, S]`, `is_target` `[S]`, `records` `key -> [R, ...]`."""
    from pfedwn_jax.results.entries import method_entry
    from pfedwn_jax.results.table import RunInfo, Table

    accuracy, loss = np.asarray(accuracy, np.float32), np.asarray(loss, np.float32)
    slots = accuracy.shape[1]
    table = Table([RunInfo(np.asarray(is_target, bool), np.arange(slots))], [{}], ["m"])
    block = {"accuracy": accuracy, "loss": loss, "finite": np.isfinite(loss)}
    block["records"] = dict(records or {})
    table.add_block(0, "m", 0, block, seconds * accuracy.shape[0])
    rounds = accuracy.shape[0]
    return method_entry(table.track(0, "m"), hp, 1, rounds)


def read_events(directory: Path) -> list:
    """Every `Event` of the event files under `directory`: the TFRecord framing (length,
    its CRC, the record, its CRC) around tensorboardX's `Event` protobuf."""
    event_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2")
    events = []
    for path in sorted(directory.rglob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            record = data[pos + 12 : pos + 12 + length]
            pos += 12 + length + 4
            events.append(event_pb2.Event.FromString(record))
    return events


def scalar_series(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """`tag -> [(step, value)]` of the scalars under `directory`, in file order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for event in read_events(directory):
        for value in event.summary.value:
            if value.HasField("simple_value"):
                out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def registry_params(always: tuple[str, ...] = ("pfedwn",)) -> list:
    """Every registered algorithm as a pytest parameter: one representative per family (and
    `always`) in the quick tier, the rest marked slow (registry-wide checks)."""
    import pytest

    from pfedwn_jax.algorithms import available_algorithms, family_representatives

    quick = set(family_representatives()) | set(always)
    return [
        n if n in quick else pytest.param(n, marks=pytest.mark.slow) for n in available_algorithms()
    ]


def link_round_context(links: Any, num_samples: Any = None) -> Any:
    """A `RoundContext` of `S = links.active.size` fully connected slots for the link model
    alone (no model, optimizer or data; slot 0 the target): the tests of a round's links and
    cost. `num_samples` `[S]` (default ones)."""
    from pfedwn_jax.algorithms import RoundContext, neighbor_lists

    s = links.active.shape[0]
    nbr, mask = neighbor_lists(np.ones((s, s), bool))
    samples = np.ones(s) if num_samples is None else num_samples
    return RoundContext(
        model=None,
        optimizer=None,
        train=None,
        data_client=jnp.arange(s, dtype=jnp.int32),
        neighbors=jnp.asarray(nbr),
        neighbor_mask=jnp.asarray(mask),
        is_target=jnp.arange(s) == 0,
        num_samples=jnp.asarray(samples, jnp.float32),
        batch_size=1,
        links=links,
    )


def sweep_equals_runs(
    config: Any, grid: Mapping[str, list], record: str, method: str = "local", skip: int = 0
) -> Any:
    """Sweep `config` over `grid` (seed 0) in one program and check that each run's `record`
    equals its own `run()` bit for bit (the first `skip` grid points not re-run). Returns the
    sweep."""
    import pfedwn_jax
    from pfedwn_jax.experiment.grid import expand, run_config

    result = pfedwn_jax.sweep(config, seeds="0", grid=grid, records=(record,), progress=False)
    assert result.meta["programs"] == 1, result.meta["programs"]
    for spec in expand(config, "0", grid)[skip:]:
        own = pfedwn_jax.run(run_config(config, spec), progress=False)
        np.testing.assert_array_equal(
            result.record(record, spec.index, method), own.records(method, record)
        )
    return result
