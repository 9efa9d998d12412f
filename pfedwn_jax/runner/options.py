"""`Options`: how a job runs, one frozen object for `pfedwn_jax.run` and `pfedwn_jax.sweep`.

Every keyword of the two entry points is a field here; `options_from(options, keywords)`
builds one from either (or both: the keywords replace the object's fields) and
`checked(options)` validates it before anything is set up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pfedwn_jax._checks import check_bool, check_int
from pfedwn_jax.io import check_writable_dir
from pfedwn_jax.results.divergence import check_policy
from pfedwn_jax.runner.checkpoint import check_available
from pfedwn_jax.runner.program import ALL
from pfedwn_jax.runner.writers import CallbackWriter


@dataclasses.dataclass(frozen=True)
class Options:
    """How a job runs; the same for one run and for a sweep.

    Attributes:
      progress: a bar per method (rounds, current target accuracy); where stderr is not a
        terminal (a log file), a plain line every tenth of the rounds instead.
      checkpoint: a checkpoint directory (`runner.checkpoint`), saved every
        `checkpoint_every` rounds and when a method ends; None: no checkpoints. A directory
        that already holds a checkpoint is refused unless `resume` or `overwrite`.
      resume: continue from `checkpoint` (same configs and data) where it stopped.
      overwrite: discard a checkpoint already in `checkpoint` and start over.
      checkpoint_every: rounds between saves (>= 1).
      on_divergence: `"stop"` a method at its first diverged round (`divergence`; the entry
        keeps the rounds so far and says `diverged`); `"continue"` records it and runs on.
      block: rounds per compiled call (None: adapted so the progress moves about every
        `block_seconds`; 1: the host sees every round). Results do not depend on it.
      block_seconds: the time one adapted block aims at.
      records: the per-round records kept (`"all"`, or names such as `("pi",)`); None: the
        entry point's default (`run`: all, `sweep`: none).
      writers: metric writers (`runner.writers`: `TensorBoardWriter`, `WandbWriter`,
        `CSVWriter`, or any object with `log(event)` and `close()`); each round reaches them
        once, after the checkpoint step that holds it is complete on disk.
      callback: `callback(method, rounds_done, metrics)` after each round (a writer).
      shards: devices one run's slots are split over (None: every device of the default
        backend that gets at least `engine.sharding.MIN_SLOTS_PER_SHARD` slots). Results do
        not depend on it. Ignored with `mesh`.
      mesh: a `Mesh(("runs", "slots"))` (default: one run's slots over `shards` devices;
        several runs over every device on the run axis).
      max_runs: most runs one compiled program holds (None: as many as the memory plan fits).
      save_models: a directory for every slot's final personalised parameters of every
        method (`runner.saved_models`; read them back with `pfedwn_jax.load_models`).
    """

    progress: bool = True
    checkpoint: str | Path | None = None
    resume: bool = False
    overwrite: bool = False
    checkpoint_every: int = 1
    on_divergence: str = "stop"
    block: int | None = None
    block_seconds: float = 2.0
    records: Any = None
    writers: tuple = ()
    callback: Any = None
    shards: int | None = None
    mesh: Any = None
    max_runs: int | None = None
    save_models: str | Path | None = None


FIELDS = tuple(f.name for f in dataclasses.fields(Options))


def options_from(options: Options | None, keywords: Mapping[str, Any], records: Any) -> Options:
    """`options` (default `Options()`) with `keywords` replacing its fields, and `records`
    where neither gives them; a ValueError names an unknown keyword and the options."""
    if options is not None and not isinstance(options, Options):
        raise ValueError(f"options must be a pfedwn_jax.Options; got {type(options).__name__}")
    unknown = sorted(set(keywords) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}; the options are {list(FIELDS)}")
    opt = dataclasses.replace(options or Options(), **keywords)
    return opt if opt.records is not None else dataclasses.replace(opt, records=records)


def checked(opt: Options) -> Options:
    """`opt` validated (a ValueError naming the field), the callback among the writers."""
    writers = tuple(opt.writers)
    for w in writers:
        if not (callable(getattr(w, "log", None)) and callable(getattr(w, "close", None))):
            raise ValueError(
                f"writers must have log(event) and close() (runner.writers); got {w!r}"
            )
    if opt.callback is not None and not callable(opt.callback):  # before any set-up or compile
        raise ValueError(
            f"callback must be a function callback(method, rounds_done, metrics); "
            f"got {opt.callback!r}"
        )
    if opt.callback is not None:
        writers = (*writers, CallbackWriter(opt.callback))
    check_bool("resume", opt.resume), check_bool("overwrite", opt.overwrite)
    if opt.resume and opt.overwrite:
        raise ValueError("resume and overwrite exclude each other; give one of them")
    if opt.checkpoint is not None:
        check_writable_dir(opt.checkpoint, "checkpoint")
        check_available(opt.checkpoint, mode(opt))
    return dataclasses.replace(
        opt,
        block=None if opt.block is None else check_int("block", opt.block, 1),
        records=check_records(opt.records),
        progress=check_bool("progress", opt.progress),
        on_divergence=check_policy(opt.on_divergence),
        checkpoint_every=check_int("checkpoint_every", opt.checkpoint_every, 1),
        max_runs=None if opt.max_runs is None else check_int("max_runs", opt.max_runs, 1),
        writers=writers,
        callback=None,
        save_models=None
        if opt.save_models is None
        else check_writable_dir(opt.save_models, "save_models"),
    )


def mode(opt: Options) -> str:
    """The checkpoint's mode: `"resume"`, `"overwrite"` or `"new"`."""
    return "resume" if opt.resume else "overwrite" if opt.overwrite else "new"


def check_records(records: Any) -> Any:
    """`"all"` or a tuple of record names; a ValueError otherwise."""
    if records == ALL:
        return ALL
    if (
        isinstance(records, str)
        or not isinstance(records, Sequence)
        or not all(isinstance(k, str) and k.strip() for k in records)
    ):
        raise ValueError(f"records must be 'all' or a list of record names; got {records!r}")
    if len(set(records)) < len(records):
        raise ValueError(f"records must not repeat a name; got {list(records)!r}")
    return tuple(records)
