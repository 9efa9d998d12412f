"""A sweep's checkpoint: resume at block granularity with identical final numbers.

`DIR/state/` holds numbered orbax steps (`pfedwn_jax.state_store`: the stacked, sharded state
of the method in progress, every process writing its part) whose JSON says where the sweep is:
which (group, method) pairs are finished, the one in progress and its rounds, and how many
table rows are committed. `DIR/rows.jsonl` is the table, appended before each step is
committed (rows beyond the committed count are ignored on resume). A fingerprint of the runs
(their configs, the mesh's run size and the block length) must match to resume.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from pfedwn_jax import state_store
from pfedwn_jax.distributed import is_writer
from pfedwn_jax.experiment.checkpoint import append_rows
from pfedwn_jax.io import check_writable_dir

ROWS = "rows.jsonl"
STATE = "state"


def fingerprint(configs: list[Any], runs_axis: int, block: int | None) -> str:
    """What a resumed sweep must share with the interrupted one."""
    text = json.dumps(
        {"runs": [c.to_dict() for c in configs], "mesh_runs": runs_axis, "block": block},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()


class SweepCheckpoint:
    """The checkpoint directory of one sweep (see the module docstring)."""

    def __init__(self, directory: str | Path, fp: str, resume: bool) -> None:
        self.dir = check_writable_dir(directory, "checkpoint")
        if is_writer():
            self.dir.mkdir(parents=True, exist_ok=True)
        self.fp = fp
        self.step = 0
        self.progress: dict[str, Any] = {"finished": [], "current": None, "rows": 0}
        self.rows: list[dict[str, Any]] = []
        if resume and state_store.latest(self.dir / STATE) is not None:
            self._read()
        elif not resume and is_writer():
            shutil.rmtree(self.dir / STATE, ignore_errors=True)
            (self.dir / ROWS).unlink(missing_ok=True)

    def _read(self) -> None:
        _, meta = state_store.restore(self.dir / STATE, None)
        if meta.get("fingerprint") != self.fp:
            raise ValueError(
                f"checkpoint {self.dir} belongs to another sweep (other runs, devices or "
                "block); resume with the same settings or use another --out"
            )
        self.step = int(state_store.latest(self.dir / STATE))
        self.progress = meta["progress"]
        with (self.dir / ROWS).open() as f:
            lines = f.read().splitlines()[: self.progress["rows"]]
        self.rows = [json.loads(line) for line in lines]

    def finished(self, group: int, name: str) -> bool:
        return [group, name] in self.progress["finished"]

    def rounds_done(self, group: int, name: str) -> int:
        """Rounds of (group, method) in the checkpoint's state (0: start afresh)."""
        cur = self.progress["current"]
        return int(cur[2]) if cur is not None and cur[:2] == [group, name] else 0

    def restore(self, template: Any) -> Any:
        """The saved state onto `template`'s shapes and shardings."""
        state, _ = state_store.restore(self.dir / STATE, template)
        return state

    def save(
        self, group: int, name: str, done: int, finished: bool, state: Any, new_rows: list
    ) -> None:
        """Append `new_rows`, then commit a step with `state` (None when finished)."""
        if is_writer():
            append_rows(self.dir / ROWS, new_rows)
        self.progress["rows"] += len(new_rows)
        if finished:
            self.progress["finished"].append([group, name])
            self.progress["current"] = None
        else:
            self.progress["current"] = [group, name, done]
        self.step += 1
        meta = {"fingerprint": self.fp, "progress": self.progress}
        state_store.save(self.dir / STATE, self.step, None if finished else state, meta)

    def remove(self) -> None:
        """Delete the checkpoint (after the results are written)."""
        if is_writer():
            shutil.rmtree(self.dir / STATE, ignore_errors=True)
            (self.dir / ROWS).unlink(missing_ok=True)
