"""Where a job's blocks go. The driver hands each block's `RoundOut` (host arrays
`[real runs, n rounds, ...]`), unflattened, to every sink in turn (`add(block, out)`) and
closes each once at the end (`close()`), also when the job is interrupted:

- `Writers`: the table's new rounds to the metric writers (`runner.writers`) once a complete
  checkpoint step holds them (`durable`), or at once without a checkpoint;
- `ModelSaver` (`runner.saved_models`): a method's final parameters, at its last block;
- `Checkpointed`: each block's outputs to a file (the only place they are flattened) and every
  `checkpoint_every` rounds a committed step with the state; on resume it restores the state
  and replays the committed blocks;
- `Live`: the live writers (the `callback` of `run`), every block at once;
- `Progress`: a bar per (program, method).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from pfedwn_jax.results.table import Table, listed
from pfedwn_jax.runner.checkpoint import Checkpoint
from pfedwn_jax.runner.groups import init_states
from pfedwn_jax.runner.progress import progress_bar
from pfedwn_jax.runner.step import RoundOut
from pfedwn_jax.runner.writers import Logged


class Block(NamedTuple):
    """One program call: program `gi`, method `name`, rounds `start + 1 .. start + n` in
    `seconds`; `kept` the rounds the table kept per run; `finished` whether it is the
    method's last for these runs; `state` the state after it; `params()` its models."""

    gi: int
    name: str
    start: int
    n: int
    seconds: float
    kept: dict[int, int]
    finished: bool
    state: Any = None
    params: Callable[[], Any] = lambda: None


class Sink(Protocol):
    def add(self, block: Block, out: RoundOut) -> None: ...

    def close(self) -> None: ...


def flat(out: RoundOut) -> dict[str, np.ndarray]:
    """`out` as the checkpoint's block file holds it: `metrics/<name>`, `records/<key>`."""
    return {
        f"{kind}/{k}": v for kind in ("metrics", "records") for k, v in getattr(out, kind).items()
    }


def unflat(arrays: dict[str, np.ndarray]) -> RoundOut:
    parts: dict[str, Any] = {"metrics": {}, "records": {}}
    for key, value in arrays.items():
        kind, _, name = key.partition("/")
        parts[kind][name] = value
    return RoundOut(**parts)


class Writers:
    """The metric writers that are not live: each block's new rounds are queued and sent once
    the checkpoint step covering them is complete on disk (every one at once without a
    checkpoint); a resumed job first sends the replayed rounds to the writers that keep a
    ledger (they write those their files lack)."""

    def __init__(self, table: Table, exps: Sequence[Any], writers: Sequence[Any], ckpt) -> None:
        self.table, self.exps, self.ckpt = table, exps, ckpt
        self.writers = [w for w in writers if not getattr(w, "live", False)]
        self.unsent: list[tuple[int, str, int, int]] = []  # (run, method, lo, hi)
        self.covered = 0  # entries of `unsent` the latest checkpoint step covers

    def queue(self, name: str, kept: dict[int, int]) -> None:
        for run, n in kept.items():
            if n:
                end = self.table.track(run, name).rounds
                self.unsent.append((run, name, end - n, end))

    def start(self, resumed: bool) -> None:
        """The writers with a ledger start; the replayed rounds (queued) go to them."""
        keeping = [w for w in self.writers if hasattr(w, "start")]
        for writer in keeping:
            writer.start(resumed)
        replayed, self.unsent = self.unsent, []
        for run, name, lo, hi in replayed:
            lacking = [w for w in keeping if w.ledger.last(run, name) < hi]
            event = event_of(self.table, self.exps, run, name, lo, hi) if lacking else None
            for writer in lacking:
                writer.log(event)

    def add(self, block: Block, out: RoundOut) -> None:
        self.queue(block.name, block.kept)
        if self.ckpt is None:
            self._send(len(self.unsent))

    def durable(self) -> None:
        """The previous checkpoint step is complete on disk: its rounds go out."""
        self._send(self.covered)
        self.covered = len(self.unsent)

    def _send(self, count: int) -> None:
        ready, self.unsent = self.unsent[:count], self.unsent[count:]
        self.covered -= count
        for run, name, lo, hi in ready if self.writers else ():
            event = event_of(self.table, self.exps, run, name, lo, hi)
            for writer in self.writers:
                writer.log(event)

    def close(self) -> None:
        """What the latest checkpoint step covers, once it is complete on disk."""
        if self.ckpt is not None:
            self.ckpt.wait()
        self._send(self.covered if self.ckpt is not None else len(self.unsent))


class Live:
    """The live writers: every block's rounds at once, committed or not."""

    def __init__(self, table: Table, exps: Sequence[Any], writers: Sequence[Any]) -> None:
        self.table, self.exps = table, exps
        self.writers = [w for w in writers if getattr(w, "live", False)]

    def add(self, block: Block, out: RoundOut) -> None:
        for run, n in block.kept.items():
            end = self.table.track(run, block.name).rounds
            for writer in self.writers if n else ():
                writer.log(event_of(self.table, self.exps, run, block.name, end - n, end))

    def close(self) -> None:
        pass


def event_of(table: Table, exps: Sequence[Any], run: int, name: str, lo: int, hi: int) -> Logged:
    """Rounds `lo + 1 .. hi` of run `run` and method `name` as a writer event."""
    track, exp = table.track(run, name), exps[run]
    return Logged(
        run=run,
        labels=table.labels[run],
        method=name,
        rounds=np.arange(lo + 1, hi + 1),
        metrics={k: listed(track.metric(k))[lo:hi] for k in track.metrics},
        arrays={k: listed(track.array(k))[lo:hi] for k in track.arrays if k != "finite"},
        records={k: listed(track.record(k))[lo:hi] for k in track.records},
        config=exp.config.to_dict(),
        slots={
            "is_target": np.asarray(exp.federation.is_target, bool),
            "slot_client": np.asarray(exp.federation.data_client),
            "neighbors": np.asarray(exp.ctx.neighbors),
            "neighbor_mask": np.asarray(exp.ctx.neighbor_mask, bool),
        },
    )


class Checkpointed:
    """The job's checkpoint: block files, committed steps every `every` rounds (and at each
    method's end), the job's progress (`finished` pairs, the `current` one) in their meta;
    `durable()` of `writers` after each commit (it returns once the previous step is on
    disk)."""

    def __init__(self, ckpt: Checkpoint, every: int, meta: dict[str, Any], writers: Writers):
        self.ckpt, self.every, self.meta, self.writers = ckpt, every, meta, writers
        self._progress_from(ckpt.saved)
        self.at: tuple[int, str] | None = None  # the (program, method) of `saved_at`
        self.saved_at = 0

    def _progress_from(self, saved: Any) -> None:
        progress = saved.meta["progress"] if saved is not None else {}
        self.finished = [tuple(x) for x in progress.get("finished", [])]
        self.current = progress.get("current")
        self.blocks = list(progress.get("blocks", []))

    def restore(self, groups: Any, mesh: Any) -> Any:
        """The saved state of the interrupted (program, method), falling back to older
        steps; `current`, `finished` and `blocks` follow the step it came from."""
        while self.ckpt.saved is not None and self.current:
            gi, name = int(self.current[0]), self.current[1]
            template, _ = init_states(groups[gi], name, mesh)
            step = self.ckpt.saved.step
            state = self.ckpt.restore(template)
            if self.ckpt.saved is not None and self.ckpt.saved.step == step:
                return state
            self._progress_from(self.ckpt.saved)
        return None

    def replay(self) -> Iterator[tuple[Block, RoundOut]]:
        """The committed blocks, in the order they ran."""
        for (gi, name, start, n, seconds), arrays in self.ckpt.blocks():
            yield (
                Block(int(gi), name, int(start), int(n), float(seconds), {}, False),
                unflat(arrays),
            )

    def add(self, block: Block, out: RoundOut) -> None:
        entry = [block.gi, block.name, block.start, block.n, block.seconds]
        self.ckpt.write_block(entry, flat(out))
        self.blocks.append(entry)
        if self.at != (block.gi, block.name):
            self.at, self.saved_at = (block.gi, block.name), block.start
        done = block.start + block.n
        if block.finished or done - self.saved_at >= self.every:
            self._commit(block, done)
            self.saved_at = done

    def _commit(self, block: Block, done: int) -> None:
        if block.finished:
            self.finished.append((block.gi, block.name))
        progress = {
            "finished": [list(x) for x in self.finished],
            "current": None if block.finished else [block.gi, block.name, done],
            "blocks": self.blocks,
        }
        self.ckpt.commit(
            {**self.meta, "progress": progress}, None if block.finished else block.state
        )
        self.writers.durable()

    def close(self) -> None:
        pass


class Progress:
    """A bar per (program, method): its rounds for one run, run-rounds for several."""

    def __init__(self, table: Table, groups: Any, runs: int, enabled: bool) -> None:
        self.table, self.groups, self.runs, self.enabled = table, groups, runs, enabled
        self.bar: Any = None

    def open(self, gi: int, name: str, rounds: int, start: int) -> None:
        self.close()
        self.real = self.groups[gi].real
        if self.runs == 1:
            self.bar = progress_bar(name, rounds, start, self.enabled, "round")
            return
        desc = f"{name} {gi + 1}/{len(self.groups)}" if len(self.groups) > 1 else name
        self.bar = progress_bar(
            desc, rounds * self.real, start * self.real, self.enabled, "run-round"
        )

    def add(self, block: Block, out: RoundOut) -> None:
        self.bar.update(block.n * (1 if self.runs == 1 else self.real))
        acc = self.table.track(0, block.name).metric("target_accuracy") if self.runs == 1 else None
        self.bar.set_postfix(**({} if acc is None else {"target_acc": f"{acc[-1]:.3f}"}))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
