"""The round phases of the memory plan: what an algorithm declares as `memory_phases`.

`runner.memory` weighs a round as a list of phases run one after another, each holding
some model copies besides the state and some other temporaries (`Phase`). An algorithm
declares its own (`Algorithm.memory_phases(sizes, hp) -> [Phase]`) from the run's `Sizes`
and the helpers here (`training`, `evaluation`, `mixing`, `plus`); without one it is
planned as `baseline` (train, mix, evaluate).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pfedwn_jax.engine import resolve_strategy
from pfedwn_jax.engine.evaluate import EVAL_BLOCK, eval_chunk
from pfedwn_jax.engine.tree import BLOCK_ELEMENTS

# bytes per minibatch entry of the schedule `slot_batches` draws: int32 index + bool mask
SCHEDULE_BYTES = 5


class Sizes(NamedTuple):
    """What the phases of a round are made of (bytes unless said otherwise)."""

    slots: int  # S
    pairs: int  # pFedWN's EM (slot, list entry) pairs: S (K - 1)
    param: int  # one slot's parameters
    opt: int  # one slot's optimizer state
    batch: int  # B
    epoch_steps: int  # steps of one local epoch of the busiest slot
    steps: int  # local steps per round
    m_train: int  # padded samples per client, training split
    m_test: int  # padded samples per client, test split
    chunk: int | None  # slots trained at once (None: the engine's "auto" choice)
    train_sample: int  # one training step, per sample
    eval_sample: int  # one forward pass with losses, per sample


class Phase(NamedTuple):
    """One phase of a round: model copies it holds and its other temporaries (bytes)."""

    name: str
    copies: int
    activations: int


def chunk_of(chunk: int | None, models: int) -> int:
    """Models trained at once out of `models` (the engine's strategy for `chunk=None`)."""
    if chunk is None:
        return resolve_strategy("auto", None, models)[1]
    return min(chunk, models)


def training(sz: Sizes, models: int, steps: int, name: str, grads: int = 1) -> Phase:
    """Local training of `models` models, in place (a loop writing each model back over
    itself): per model trained at once a minibatch through `grads` forward-backward passes
    and its new parameters and optimizer state (XLA writes the update into the gradient's
    buffer); the `[models, steps, B]` schedule."""
    per_model = grads * sz.batch * sz.train_sample + sz.param + sz.opt
    schedule = models * steps * sz.batch * SCHEDULE_BYTES
    return Phase(name, 0, chunk_of(sz.chunk, models) * per_model + schedule)


def evaluation(sz: Sizes, pairs: int, samples: int, name: str, copies: int = 0) -> Phase:
    """`cross_evaluate` of `pairs` (model, client) pairs on `samples` padded samples: a chunk
    of pairs (`eval_chunk`; the last one padded) gathered, each through the forward pass
    one block of samples at a time (`EVAL_BLOCK`), `[pairs, samples]` losses and
    correctness."""
    at_once = min(pairs, eval_chunk(samples, sz.param))
    chunk = at_once * (min(samples, EVAL_BLOCK) * sz.eval_sample + sz.param)
    return Phase(name, copies, chunk + pairs * samples * 8)


def mixing(sz: Sizes, name: str = "mixing") -> Phase:
    """`mix_sparse` in place: one block of columns (`BLOCK_ELEMENTS`) gathered, accumulated
    and sliced, float32."""
    return Phase(name, 0, 3 * 4 * min(sz.slots * sz.param // 4, BLOCK_ELEMENTS))


def plus(phase: Phase, copies: int) -> Phase:
    return phase._replace(copies=phase.copies + copies)


def baseline(sz: Sizes, hp: Any) -> list[Phase]:
    """Local, FedAvg and any algorithm without an entry of its own: train, mix, evaluate."""
    return [
        training(sz, sz.slots, sz.steps, "local training"),
        mixing(sz),
        evaluation(sz, sz.slots, sz.m_test, "evaluation"),
    ]
