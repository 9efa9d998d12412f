"""The one driver: every method of every run, program by program, block by block.

`execute(exps, labels, mesh, options, checkpoint)` groups the runs into programs
(`groups.plan_programs`), then for each program and method: builds the initial state (or
restores the checkpoint's), compiles the block program once (`program.block_program`), and
calls it block after block. After each block the host has the block's outputs (`RoundOut`);
they go into the `Table` (divergence noted there), then to the sinks (`runner.sinks`): the
metric writers, the model saver, the checkpoint (the block's file, then every
`checkpoint_every` rounds a committed step with the state), the live callback, the progress
bar. Block lengths adapt so that a call lasts about `block_seconds` (a watched
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
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from pfedwn_jax.algorithms import get_algorithm, hparam_leaves, static_hparams
from pfedwn_jax.distributed import gather_to_host
from pfedwn_jax.experiment.setup import Experiment
from pfedwn_jax.results.table import RunInfo, Table
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
from pfedwn_jax.runner.saved_models import ModelSaver
from pfedwn_jax.runner.sinks import Block, Checkpointed, Live, Progress, Sink, Writers
from pfedwn_jax.runner.step import RoundOut, init_state, round_step

#: Most rounds one program call can run (the block's output buffers hold this many).
MAX_BLOCK = 64


class Blocks:
    """Block lengths: `block` rounds each, or (None) adapted so a call lasts about `seconds`:
    one round first, then as many as the measured time per round allows, at most `kmax`.
    Over several processes an adapted length is the shortest any process asks for: every
    process must call the program with the same one."""

    def __init__(self, rounds: int, block: int | None, kmax: int, seconds: float) -> None:
        self.rounds, self.block, self.kmax, self.seconds = rounds, block, kmax, seconds
        self.per_round: float | None = None

    def next(self, done: int) -> int:
        left = self.rounds - done
        if self.block is not None:
            return min(self.block, left)
        if self.per_round is None:
            return 1
        n = max(1, min(self.kmax, left, int(self.seconds / max(self.per_round, 1e-6))))
        if jax.process_count() > 1:
            n = int(np.min(multihost_utils.process_allgather(np.int32(n))))
        return n

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
    """One `execute`: the schedule of (program, method) pairs, each run block by block; each
    block's outputs go into the table, then to the sinks (`runner.sinks`)."""

    def __init__(self, exps, labels, mesh, options, ckpt) -> None:
        self.exps, self.mesh, self.opt = exps, mesh, options
        self.methods = tuple(dict.fromkeys(m for e in exps for m in e.config.method_names))
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
        self.compile_s = dict(saved.meta.get("compile_s", {})) if saved else {}
        self.timings = {"compile_s": 0.0, "run_s": 0.0}
        self.ahead = Ahead()  # the next method's program, compiling while one runs
        self.shapes: dict[tuple, dict[str, tuple]] = {}  # record shapes of unpadded runs
        self.writers = Writers(self.table, exps, options.writers, ckpt)
        meta = {"programs": self.programs, "compile_s": self.compile_s}
        self.ckpt = (
            None
            if ckpt is None
            else Checkpointed(ckpt, options.checkpoint_every, meta, self.writers)
        )
        self.progress = Progress(self.table, self.groups, len(exps), options.progress)
        saver = None
        if options.save_models is not None:
            saver = ModelSaver(
                options.save_models, exps, labels, self.programs, self.methods, fresh=not saved
            )
            if saved:
                saver.check_resumed(self.ckpt.finished if self.ckpt else [])
        live = Live(self.table, exps, options.writers)
        self.sinks: list[Sink] = [
            self.writers,
            *([saver] if saver else []),
            *([self.ckpt] if self.ckpt else []),
        ]
        self.sinks += [live, self.progress]

    def run(self) -> None:
        """Every (program, method) not yet finished; then every sink closes (also when
        interrupted: the writers get the rounds of the last complete checkpoint step)."""
        try:
            self._run()
        except BaseException:
            for sink in self.sinks:
                with contextlib.suppress(Exception):
                    sink.close()
            raise
        for sink in self.sinks:
            sink.close()

    def _run(self) -> None:
        restored = self.ckpt.restore(self.groups, self.mesh) if self.ckpt else None
        for block, out in self.ckpt.replay() if self.ckpt else ():
            self.writers.queue(block.name, self._add(block, out, quiet=True))
        self.writers.start(self.ckpt is not None and self.ckpt.ckpt.saved is not None)
        finished = self.ckpt.finished if self.ckpt else []
        current = self.ckpt.current if self.ckpt else None
        todo = [
            (gi, name)
            for gi in range(len(self.groups))
            for name in self.exps[self.programs[gi][0]].config.method_names
            if (gi, name) not in finished
        ]
        for i, (gi, name) in enumerate(todo):
            here = current is not None and tuple(current[:2]) == (gi, name)
            start = int(current[2]) if here and current is not None else 0
            after = todo[i + 1] if i + 1 < len(todo) and todo[i + 1][0] == gi else None
            self._method(gi, name, restored if here else None, start, after)
            restored = None

    def _method(self, gi: int, name: str, state: Any, start: int, after: Any = None) -> None:
        """Rounds `start ..` of method `name` for the runs of program `gi`; the program of
        `after` (the next `(gi, name)` of the same runs) compiles meanwhile (`ahead`)."""
        group, alg = self.groups[gi], get_algorithm(name)
        rounds = group.exps[0].config.rounds
        template, (hp, hp_axes) = init_states(group, name, self.mesh)
        state = template if state is None else state
        program, args, key, dims = self._program(group, name, state, hp, hp_axes)
        compiled = self._compile(gi, name, program, state, args)
        if after is not None and jax.process_count() == 1:
            self.ahead.start(after, functools.partial(self._lower, *after))
        sizes = Blocks(rounds, self.opt.block, self.kmax(rounds), self.opt.block_seconds)
        if 0 < start < rounds:  # times from here on are this process's
            for run in group.real_ids:
                self.table.track(run, name).resumed_at.append(start)
        self.progress.open(gi, name, rounds, start)
        done = start
        while done < rounds and self.table.active(group.real_ids, name):
            n = sizes.next(done)
            t0 = time.perf_counter()
            state, out = compiled(state, *args, np.int32(done), np.int32(n))
            out = host_block(gather_to_host(out), group.real, n)
            seconds = time.perf_counter() - t0
            sizes.observe(n, seconds)
            self.timings["run_s"] += seconds
            block = Block(gi, name, done, n, seconds, {}, False, state)
            kept = self._add(block, out)
            done += n
            finished = done >= rounds or not self.table.active(group.real_ids, name)
            params = functools.partial(self._params, alg, key, dims, state, group.ctx, hp)
            block = block._replace(kept=kept, finished=finished, params=params)
            for sink in self.sinks:
                sink.add(block, out)
        self.progress.close()

    def _params(self, alg: Any, key: Any, dims: tuple, *args: Any) -> Any:
        return params_program(alg, key, self.mesh, *dims)(*args)

    def kmax(self, rounds: int) -> int:
        return capacity(rounds, self.opt.block)

    def _lower(self, gi: int, name: str) -> Any:
        """Method `name`'s block program for the runs of program `gi` (placed already),
        compiled from its state's shapes (`state_shapes`): what `ahead` runs."""
        group = self.groups.group
        assert group is not None and self.groups.at == gi  # the runs of the current program
        state, (hp, hp_axes) = state_shapes(group, name, self.mesh)
        program, args, _, _ = self._program(group, name, state, hp, hp_axes)
        return program.lower(state, *args, np.int32(0), np.int32(1)).compile()

    def _program(self, group: Group, name: str, state: Any, hp: Any, hp_axes: Any) -> tuple:
        """Method `name`'s block program for `group`'s runs from `state` (or its shapes):
        `(program, args after the state, axes key, dims)`."""
        key = axes_key(group, state, hp_axes)
        dims = (len(group.ids), group.shapes.slots)
        kmax = self.kmax(group.exps[0].config.rounds)
        program = block_program(get_algorithm(name), kmax, self._records(), key, self.mesh, *dims)
        return program, (group.ctx, group.evals, hp, group.round_roots), key, dims

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

    def _add(self, block: Block, out: RoundOut, *, quiet: bool = False) -> dict[int, int]:
        """A block's outputs into the table; the rounds kept per run."""
        group, kept = self.groups[block.gi], {}
        for r, run in enumerate(group.real_ids):
            own = self._own(group, r, block.name, out)
            kept[run] = self.table.add_block(
                run, block.name, block.start, own, block.seconds, quiet=quiet
            )
            track = self.table.track(run, block.name)
            track.compile_s = self.compile_s.get(f"{block.gi}/{block.name}", 0.0)
        return kept

    def _own(self, group: Group, r: int, name: str, out: RoundOut) -> dict[str, Any]:
        """Run `r`'s part of a block, trimmed to its own slots and record shapes."""
        exp = group.exps[r]
        s = exp.federation.num_slots
        own: dict[str, Any] = {k: v[r][:, :s] for k, v in out.metrics.items()}
        own["records"] = {k: v[r] for k, v in out.records.items()}
        k = int(exp.ctx.neighbors.shape[1])
        if s < group.shapes.slots or k < group.shapes.degree:
            key = (name, static_hparams(exp.config.hparams_for(name)), s, k)
            if key not in self.shapes:  # the runs of a program share model and data shapes
                self.shapes[key] = record_shapes(name, exp)
            own["records"] = {f: _trim(v, self.shapes[key][f]) for f, v in own["records"].items()}
        return own


def host_block(out: RoundOut, real: int, n: int) -> RoundOut:
    """A program call's `RoundOut [R, kmax, ...]` on the host: the real runs and the `n`
    rounds run, `[real, n, ...]`."""
    return jax.tree.map(lambda v: np.asarray(v)[:real, :n], out)


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
    """Run every method of every run (all with the same rounds; a program's runs share their
    methods, `groups.run_key`); returns the filled `Table` and the job's `meta` (programs,
    devices, timings)."""
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
