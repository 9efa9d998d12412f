"""The one driver: every method of every run, program by program, block by block.

`execute(exps, labels, mesh, options, checkpoint)` groups the runs into programs
(`groups.plan_programs`), then for each program and method: builds the initial state (or
restores the checkpoint's), compiles the block program once (`program.block_program`), and
calls it block after block. After each block the host has the block's outputs; they go into
the `Table` (divergence noted there), to the checkpoint (the block's file, then every
`checkpoint_every` rounds a committed step with the state) and to the metric writers, and the
progress bar moves. Block lengths adapt so that a call lasts about `block_seconds` (a watched
run's bar moves every couple of seconds; `block=k` fixes them, `block=1` is per-round).
Results do not depend on the block lengths: round `r`'s key is `fold_in(round_root, r)`.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from pfedwn_jax.algorithms import get_algorithm, hparam_leaves, static_hparams
from pfedwn_jax.distributed import gather_to_host
from pfedwn_jax.experiment.setup import Experiment
from pfedwn_jax.results.table import RunInfo, Table, listed
from pfedwn_jax.runner.ahead import Ahead
from pfedwn_jax.runner.checkpoint import Checkpoint
from pfedwn_jax.runner.groups import (
    Group,
    axes_key,
    init_states,
    make_group,
    plan_programs,
    state_shapes,
)
from pfedwn_jax.runner.options import Options
from pfedwn_jax.runner.program import ALL, block_program, params_program
from pfedwn_jax.runner.progress import progress_bar
from pfedwn_jax.runner.saved_models import ModelSaver
from pfedwn_jax.runner.step import init_state, round_step
from pfedwn_jax.runner.writers import Logged

#: Most rounds one program call can run (the block's output buffers hold this many).
MAX_BLOCK = 64


class Blocks:
    """Block lengths: `block` rounds each, or (None) adapted so a call lasts about `seconds`:
    one round first, then as many as the measured time per round allows, at most `kmax`."""

    def __init__(self, rounds: int, block: int | None, kmax: int, seconds: float) -> None:
        self.rounds, self.block, self.kmax, self.seconds = rounds, block, kmax, seconds
        self.per_round: float | None = None

    def next(self, done: int) -> int:
        left = self.rounds - done
        if self.block is not None:
            return min(self.block, left)
        if self.per_round is None:
            return 1
        return max(1, min(self.kmax, left, int(self.seconds / max(self.per_round, 1e-6))))

    def observe(self, n: int, seconds: float) -> None:
        self.per_round = seconds / n


def capacity(rounds: int, block: int | None) -> int:
    """Rounds a program call can run: `block`, or `MAX_BLOCK` (never more than `rounds`)."""
    return max(1, min(rounds, MAX_BLOCK if block is None else block))


class PlacedGroups:
    """The programs' groups, each placed (`make_group`) when asked for; only the latest stays,
    so a job holds one program's contexts at a time (not every program's, whatever
    `max_runs` split them into)."""

    def __init__(self, programs: Sequence[Sequence[int]], exps, mesh: Mesh) -> None:
        self.programs, self.exps, self.mesh = programs, exps, mesh
        self.at: int | None = None
        self.group: Group | None = None

    def __len__(self) -> int:
        return len(self.programs)

    def __getitem__(self, gi: int) -> Group:
        if self.at != gi or self.group is None:
            self.at, self.group = None, None  # the previous program's arrays go first
            group = make_group(self.programs[gi], self.exps, self.mesh)
            self.at, self.group = gi, group
            return group
        return self.group


class Job:
    """The state of one `execute`: programs, table, checkpoint progress."""

    def __init__(self, exps, labels, mesh, options, ckpt) -> None:
        self.exps, self.mesh, self.opt, self.ckpt = exps, mesh, options, ckpt
        self.methods = exps[0].config.method_names
        runs = [
            RunInfo(np.asarray(e.federation.is_target, bool), e.federation.data_client)
            for e in exps
        ]
        self.table = Table(runs, labels, self.methods, options.on_divergence)
        saved = ckpt.saved if ckpt is not None else None
        self.programs = (
            saved.meta["programs"]
            if saved
            else plan_programs(exps, mesh, max_runs=options.max_runs)
        )
        self.groups = PlacedGroups(self.programs, exps, mesh)
        progress = saved.meta["progress"] if saved else {}
        self.finished = [tuple(x) for x in progress.get("finished", [])]
        self.current = progress.get("current")
        self.blocks = list(progress.get("blocks", []))
        self.compile_s = dict(saved.meta.get("compile_s", {})) if saved else {}
        self.timings = {"compile_s": 0.0, "run_s": 0.0}
        self.ahead = Ahead()  # the next method's program, compiling while one runs
        self.shapes: dict[tuple, dict[str, tuple]] = {}  # record shapes of unpadded runs
        self.unsent: list[tuple[int, str, int, int]] = []  # (run, method, lo, hi) not logged
        self.covered = 0  # entries of `unsent` the latest checkpoint step covers
        self.saver = (
            ModelSaver(
                options.save_models, exps, labels, self.programs, self.methods, fresh=not saved
            )
            if options.save_models is not None
            else None
        )
        if self.saver is not None and saved:
            self.saver.check_resumed(self.finished)

    # ------------------------------------------------------------------ the run
    def run(self) -> None:
        """Every (program, method) not yet finished; then the writers get the last rounds
        (also when interrupted: those of the last complete checkpoint step)."""
        try:
            self._run()
        except BaseException:
            with contextlib.suppress(Exception):
                self._flush()
            raise
        self._flush()

    def _run(self) -> None:
        restored = self._restore()
        self._replay()
        self._start_writers()
        todo = [
            (gi, name)
            for gi in range(len(self.groups))
            for name in self.methods
            if (gi, name) not in self.finished
        ]
        for i, (gi, name) in enumerate(todo):
            here = self.current is not None and tuple(self.current[:2]) == (gi, name)
            start = int(self.current[2]) if here and self.current is not None else 0
            after = todo[i + 1] if i + 1 < len(todo) and todo[i + 1][0] == gi else None
            self._method(gi, name, restored if here else None, start, after)
            restored = None

    def _restore(self) -> Any:
        """The saved state of the interrupted (program, method), falling back to older
        steps; `current`, `finished` and `blocks` follow the step it came from."""
        while self.ckpt is not None and self.ckpt.saved is not None and self.current:
            gi, name = int(self.current[0]), self.current[1]
            template, _ = init_states(self.groups[gi], name, self.mesh)
            step = self.ckpt.saved.step
            state = self.ckpt.restore(template)
            if self.ckpt.saved is not None and self.ckpt.saved.step == step:
                return state
            self._progress_from(self.ckpt.saved)
        return None

    def _progress_from(self, saved: Any) -> None:
        progress = saved.meta["progress"] if saved is not None else {}
        self.finished = [tuple(x) for x in progress.get("finished", [])]
        self.current = progress.get("current")
        self.blocks = list(progress.get("blocks", []))

    def _replay(self) -> None:
        """The committed blocks of a resumed job back into the table."""
        if self.ckpt is None:
            return
        for entry, arrays in self.ckpt.blocks():
            gi, name, start, n, seconds = entry
            kept = self._add(int(gi), name, int(start), int(n), arrays, float(seconds), save=False)
            self._queue(name, kept)

    def _start_writers(self) -> None:
        """The writers that keep a ledger start (a resumed job's put back as their ledger
        saw them), then get the replayed rounds their files lack, in the order they ran."""
        resumed = self.ckpt is not None and self.ckpt.saved is not None
        keeping = [w for w in self.opt.writers if hasattr(w, "start")]
        for writer in keeping:
            writer.start(resumed)
        replayed, self.unsent = self.unsent, []
        for run, name, lo, hi in replayed:
            lacking = [w for w in keeping if w.ledger.last(run, name) < hi]
            event = self._event(run, name, lo, hi) if lacking else None
            for writer in lacking:
                writer.log(event)

    def _method(self, gi: int, name: str, state: Any, start: int, after: Any = None) -> None:
        """Rounds `start ..` of method `name` for the runs of program `gi`; the program of
        `after` (the next `(gi, name)` of the same runs) compiles meanwhile (`ahead`)."""
        group, alg = self.groups[gi], get_algorithm(name)
        rounds = group.exps[0].config.rounds
        template, (hp, hp_axes) = init_states(group, name, self.mesh)
        state = template if state is None else state
        key = axes_key(group, state, hp_axes)
        dims, kmax = (len(group.ids), group.shapes.slots), self.kmax(rounds)
        program = block_program(alg, kmax, self._records(), key, self.mesh, *dims)
        args = (group.ctx, group.evals, hp, group.round_roots)
        compiled = self._compile(gi, name, program, state, args)
        if after is not None and jax.process_count() == 1:
            self.ahead.start(after, functools.partial(self._lower, *after))
        sizes = Blocks(rounds, self.opt.block, kmax, self.opt.block_seconds)
        if 0 < start < rounds:  # times from here on are this process's
            for run in group.real_ids:
                self.table.track(run, name).resumed_at.append(start)
        with self._bar(gi, name, rounds, start) as bar:
            done, saved_at = start, start
            while done < rounds and self.table.active(group.real_ids, name):
                n = sizes.next(done)
                t0 = time.perf_counter()
                state, out = compiled(state, *args, np.int32(done), np.int32(n))
                block = host_block(gather_to_host(out), group.real, n)
                seconds = time.perf_counter() - t0
                sizes.observe(n, seconds)
                self.timings["run_s"] += seconds
                kept = self._add(gi, name, done, n, block, seconds)
                self._queue(name, kept)
                done += n
                finished = done >= rounds or not self.table.active(group.real_ids, name)
                if finished and self.saver is not None:
                    params = params_program(alg, key, self.mesh, *dims)(state, group.ctx, hp)
                    self.saver.save(gi, name, params)  # before the commit that ends it
                if finished or done - saved_at >= self.opt.checkpoint_every:
                    self._commit(gi, name, done, None if finished else state, finished)
                    saved_at = done
                self._log(name, kept)
                bar.advance(n, self._postfix(group, name))

    def kmax(self, rounds: int) -> int:
        return capacity(rounds, self.opt.block)

    def _lower(self, gi: int, name: str) -> Any:
        """Method `name`'s block program for the runs of program `gi` (placed already),
        compiled from its state's shapes (`state_shapes`): what `ahead` runs."""
        group = self.groups.group
        assert group is not None and self.groups.at == gi  # the runs of the current program
        state, (hp, hp_axes) = state_shapes(group, name, self.mesh)
        key = axes_key(group, state, hp_axes)
        dims = (len(group.ids), group.shapes.slots)
        rounds = group.exps[0].config.rounds
        alg = get_algorithm(name)
        program = block_program(alg, self.kmax(rounds), self._records(), key, self.mesh, *dims)
        args = (group.ctx, group.evals, hp, group.round_roots)
        return program.lower(state, *args, np.int32(0), np.int32(1)).compile()

    def _compile(self, gi: int, name: str, program: Any, state: Any, args: tuple) -> Any:
        """The block program, compiled ahead (`ahead`) or here; its seconds counted."""
        t0 = time.perf_counter()
        done = self.ahead.take((gi, name))
        if done is None:
            compiled = program.lower(state, *args, np.int32(0), np.int32(1)).compile()
            seconds = time.perf_counter() - t0
        else:
            compiled, seconds = done
        self.timings["compile_s"] += seconds
        self.compile_s[f"{gi}/{name}"] = self.compile_s.get(f"{gi}/{name}", 0.0) + seconds
        return compiled

    def _records(self) -> Any:
        rec = self.opt.records
        return ALL if rec == ALL else tuple(sorted(rec))

    # ------------------------------------------------------------------ after a block
    def _add(self, gi, name, start, n, block, seconds, *, save: bool = True) -> dict[int, int]:
        """A block's host outputs into the table and (`save`) the checkpoint's block files;
        returns the rounds kept per run."""
        group, kept = self.groups[gi], {}
        for r, run in enumerate(group.real_ids):
            own = self._own(group, r, name, block)
            kept[run] = self.table.add_block(run, name, start, own, seconds, quiet=not save)
            self.table.track(run, name).compile_s = self.compile_s.get(f"{gi}/{name}", 0.0)
        if save and self.ckpt is not None:
            entry = [gi, name, start, n, seconds]
            self.ckpt.write_block(entry, block)
            self.blocks.append(entry)
        return kept

    def _own(self, group: Group, r: int, name: str, block: dict) -> dict[str, Any]:
        """Run `r`'s part of a block, trimmed to its own slots and record shapes."""
        exp = group.exps[r]
        s = exp.federation.num_slots
        own: dict[str, Any] = {"records": {}}
        for key, value in block.items():
            kind, _, field = key.partition("/")
            if kind == "metrics":
                own[field] = value[r][:, :s]
            else:
                own["records"][field] = value[r]
        k = int(exp.ctx.neighbors.shape[1])
        if s < group.shapes.slots or k < group.shapes.degree:
            key = (name, static_hparams(exp.config.hparams_for(name)), s, k)
            if key not in self.shapes:  # the runs of a program share model and data shapes
                self.shapes[key] = record_shapes(name, exp)
            own["records"] = {f: _trim(v, self.shapes[key][f]) for f, v in own["records"].items()}
        return own

    def _queue(self, name: str, kept: dict[int, int]) -> None:
        """The block's new rounds of every run (`kept`: run -> rounds), for the writers once
        a complete checkpoint step holds them (`_send`)."""
        for run, n in kept.items():
            if n:
                end = self.table.track(run, name).rounds
                self.unsent.append((run, name, end - n, end))

    def _log(self, name: str, kept: dict[int, int]) -> None:
        """The block's new rounds to the live writers now; without a checkpoint, everything
        queued to the others too."""
        for run, n in kept.items():
            end = self.table.track(run, name).rounds
            for writer in self.opt.writers:
                if n and getattr(writer, "live", False):
                    writer.log(self._event(run, name, end - n, end))
        if self.ckpt is None:
            self._send(len(self.unsent))

    def _send(self, count: int) -> None:
        """The first `count` entries of `unsent` to the (not live) writers."""
        ready, self.unsent = self.unsent[:count], self.unsent[count:]
        self.covered -= count
        writers = [w for w in self.opt.writers if not getattr(w, "live", False)]
        for run, name, lo, hi in ready if writers else ():
            event = self._event(run, name, lo, hi)
            for writer in writers:
                writer.log(event)

    def _flush(self) -> None:
        """Send what the latest checkpoint step covers, once it is complete on disk."""
        if self.ckpt is not None:
            self.ckpt.wait()
        self._send(self.covered if self.ckpt is not None else len(self.unsent))

    def _event(self, run: int, name: str, lo: int, hi: int) -> Logged:
        """Rounds `lo + 1 .. hi` of run `run` and method `name` as a writer event."""
        track, exp = self.table.track(run, name), self.exps[run]
        return Logged(
            run=run,
            labels=self.table.labels[run],
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

    def _commit(self, gi: int, name: str, done: int, state: Any, finished: bool) -> None:
        if self.ckpt is None:
            return
        if finished:
            self.finished.append((gi, name))
        current = None if finished else [gi, name, done]
        progress = {
            "finished": [list(x) for x in self.finished],
            "current": current,
            "blocks": self.blocks,
        }
        meta = {"programs": self.programs, "progress": progress, "compile_s": self.compile_s}
        self.ckpt.commit(meta, state)  # returns once the previous step is complete on disk
        self._send(self.covered)
        self.covered = len(self.unsent)

    # ------------------------------------------------------------------ progress
    def _bar(self, gi: int, name: str, rounds: int, start: int) -> Bar:
        group = self.groups[gi]
        if len(self.exps) == 1:
            return Bar(progress_bar(name, rounds, start, self.opt.progress, "round"), 1)
        desc = f"{name} {gi + 1}/{len(self.groups)}" if len(self.groups) > 1 else name
        bar = progress_bar(
            desc, rounds * group.real, start * group.real, self.opt.progress, "run-round"
        )
        return Bar(bar, group.real)

    def _postfix(self, group: Group, name: str) -> dict[str, str]:
        if len(self.exps) != 1:
            return {}
        acc = self.table.track(group.real_ids[0], name).metric("target_accuracy")
        return {} if acc is None else {"target_acc": f"{acc[-1]:.3f}"}


class Bar:
    """A progress bar advanced by rounds times the runs they cover; a context manager."""

    def __init__(self, bar: Any, runs: int) -> None:
        self.bar, self.runs = bar, runs

    def advance(self, rounds: int, postfix: dict[str, str]) -> None:
        self.bar.update(rounds * self.runs)
        self.bar.set_postfix(**postfix)

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()


def host_block(out: Any, real: int, n: int) -> dict[str, np.ndarray]:
    """A program call's `RoundOut [R, kmax, ...]` on the host as flat arrays of the real runs
    and the `n` rounds run: `metrics/<name>` and `records/<key>`, each `[real, n, ...]`."""
    flat = {f"metrics/{k}": v for k, v in out.metrics.items()}
    flat.update({f"records/{k}": v for k, v in out.records.items()})
    return {k: np.asarray(v)[:real, :n] for k, v in flat.items()}


def _trim(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`value [n, ...]` cut to `[n, *shape]` (padding sits at the end of every axis)."""
    return value[(slice(None), *(slice(0, d) for d in shape))]


def record_shapes(name: str, exp: Experiment) -> dict[str, tuple]:
    """The per-round shape of each record of method `name` in run `exp` on its own (unpadded)
    context (`jax.eval_shape`: nothing runs)."""
    alg, hp = get_algorithm(name), hparam_leaves(exp.config.hparams_for(name))
    ctx = exp.ctx.replace(shards=1)

    def probe(ctx, evals, key_data, hp):
        key = jax.random.wrap_key_data(key_data)
        state = init_state(alg, hp, key, ctx)
        return round_step(alg, hp, state, key, ctx, evals)[1].records

    out = jax.eval_shape(probe, ctx, (exp.test, exp.val), exp.init_key, hp)
    return {k: tuple(v.shape) for k, v in out.items()}


def execute(
    exps: Sequence[Experiment],
    labels: Sequence[dict[str, Any]],
    mesh: Mesh,
    options: Options,
    checkpoint: Checkpoint | None = None,
) -> tuple[Table, dict[str, Any]]:
    """Run every method of every run (all with the same methods and rounds); returns the
    filled `Table` and the job's `meta` (programs, devices, timings)."""
    job = Job(list(exps), labels, mesh, options, checkpoint)
    try:
        job.run()
    finally:
        for writer in options.writers:
            writer.close()
    meta = {
        "methods": list(job.methods),
        "runs": len(exps),
        "programs": len(job.groups),
        "devices": int(mesh.devices.size),
        "mesh": dict(mesh.shape),
        "timings": dict(job.timings),
    }
    return job.table, meta
