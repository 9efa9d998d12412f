"""One round of one run: `round_step(alg, hp, state, key, ctx, evals) -> (state, RoundOut)`.

The round returns what it produces; nothing leaves it any other way. Everything that lives
across rounds is in `RunState`: the algorithm's own state and, with `stale` links or
mobility, the per-link state (`runner.links.LinkTrack`: the cache of received models,
node positions, current neighbor lists). The round draws this round's links, runs the
algorithm's round (which returns the models it sent), caches what arrived of them, and
evaluates every slot's personalised model: `RoundOut.metrics` (per slot) and
`RoundOut.records` (the algorithm's and the links' records, e.g. pFedWN's `pi [S, K]`).
Pure and jittable; `jax.eval_shape` of a round works.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from pfedwn_jax.algorithms import Algorithm, RoundContext
from pfedwn_jax.algorithms.mixing import listed_mask
from pfedwn_jax.algorithms.payload import payload_of, sent_shapes
from pfedwn_jax.data import ClientData
from pfedwn_jax.engine import constrain_slots, evaluate
from pfedwn_jax.results.metrics import SlotView, slot_metrics
from pfedwn_jax.runner.links import begin_round, end_round, init_track, needs_track


class RunState(flax.struct.PyTreeNode):
    """Everything of one run and method that lives across rounds.

    Attributes:
      alg: the algorithm's state (leaves `[S, ...]` where per slot).
      links: the per-link state (`LinkTrack`: stale-link cache, positions, current lists), or
        None when the links keep none.
    """

    alg: Any
    links: Any = None


class RoundOut(flax.struct.PyTreeNode):
    """What a round produces besides the next state.

    Attributes:
      metrics: the per-slot metrics (`results.metrics.SLOT_METRICS`): `accuracy [S]`,
        `loss [S]` (test split), `finite [S]` (bool, `slot_finite`), and `val_accuracy [S]`
        with a validation split.
      records: the algorithm's records (e.g. `pi [S, K]`, `train_loss [S]`) and the links'
        (`link_received [S, K]`, `link_failure_rate []`, with mobility `positions [S, 2]`,
        `neighbors`/`neighbor_mask [S, K]`, `reselected []`, with stale links `link_age`).
    """

    metrics: dict[str, jax.Array]
    records: dict[str, jax.Array]


def init_state(alg: Algorithm, hp: Any, key: jax.Array, ctx: RoundContext) -> RunState:
    """The initial `RunState` of `alg` (jittable); `key` is the run's init key."""
    state = alg.init(key, ctx, hp)
    if not needs_track(ctx.links):
        return RunState(state)
    return RunState(state, init_track(key, ctx, sent_shapes(alg, state, ctx, hp)))


def round_step(
    alg: Algorithm,
    hp: Any,
    state: RunState,
    key: jax.Array,
    ctx: RoundContext,
    evals: tuple[ClientData, ClientData | None],
) -> tuple[RunState, RoundOut]:
    """One round of `alg` plus the evaluation of every slot; `evals` is `(test, val)`."""
    ctx = _with_payload(alg, hp, state.alg, ctx)
    round_ctx, link_records, drawn = _draw_links(ctx, state.links, key)
    algstate, sent = _checked_round(alg, alg.round(state.alg, key, round_ctx, hp))
    track = state.links
    if track is not None:
        track, more = end_round(round_ctx, track, drawn, sent, key)
        link_records = {**link_records, **more}
    state = constrain_slots(RunState(algstate, track), ctx.num_slots, ctx.shards)
    params = alg.eval_params(state.alg, round_ctx, hp)
    records = alg.records(state.alg, round_ctx, hp) if alg.records is not None else {}
    records = {**records, **link_records}
    mixing = None if alg.mixing_weights is None else alg.mixing_weights(state.alg, round_ctx, hp)
    return state, RoundOut(_metrics(round_ctx, params, evals, records, mixing), records)


def _with_payload(alg: Algorithm, hp: Any, state: Any, ctx: RoundContext) -> RoundContext:
    """The context whose cost set-up charges what `alg` sends (`algorithms.payload`); the
    context itself when the cost is not counted."""
    links = ctx.links
    if links is None or links.cost is None:
        return ctx
    bits = payload_of(alg, state, ctx, hp, links.cost.value_bits)
    return ctx.replace(links=links.replace(cost=links.cost.replace(payload_bits=bits)))


def _draw_links(ctx: RoundContext, track: Any, key: jax.Array) -> tuple[RoundContext, dict, Any]:
    """This round's link outcomes (`runner.links.begin_round`): the context whose
    `neighbor_mask` holds the models the algorithm may combine, the link records and what
    was drawn (for `end_round`); the context itself without a link model."""
    if ctx.links is None:
        return ctx, {}, None
    return begin_round(ctx, track, key)


def _checked_round(alg: Algorithm, out: Any) -> tuple[Any, Any]:
    """`(state, sent)` of an algorithm's round; a ValueError for any other return value."""
    if type(out) is not tuple or len(out) != 2:
        raise ValueError(
            f"algorithm {alg.name!r}: round must return (state, sent), sent being the models "
            f"[S, ...] the slots sent (or None); got {type(out).__name__}"
        )
    return out


def _metrics(
    ctx: RoundContext,
    params: Any,
    evals: tuple[ClientData, Any],
    records: dict[str, jax.Array],
    mixing: Any = None,
) -> dict[str, jax.Array]:
    """Every per-slot device metric (`results.metrics.SLOT_METRICS`: test accuracy and loss,
    divergence flags, with `val` the validation accuracy, consensus deviation, with `mixing`
    (the round's gossip weights) the spectral gap, ...), `[S]` each."""
    test, val = evals
    on = lambda split: evaluate(ctx.model, params, split, ctx.data_client)
    val_out = None if val is None else on(val)
    lists = (ctx.neighbors, listed_mask(ctx))
    active = jnp.asarray(ctx.train.count)[jnp.asarray(ctx.data_client)] > 0  # not padding
    view = SlotView(params, on(test), val_out, records, ctx.num_slots, *lists, mixing, active)
    return slot_metrics(view)


@functools.lru_cache(maxsize=32)
def jitted_round(alg: Algorithm) -> Any:
    """`round_step` of `alg` on its own, jitted: `(hp, state, key, ctx, evals) -> (state,
    RoundOut)` (the state donated): one round of one run outside the driver, for tests,
    memory analysis and benchmarks."""
    return jax.jit(functools.partial(round_step, alg), donate_argnums=1)


def zeros_like_out(out: RoundOut) -> RoundOut:
    """A `RoundOut` of zeros shaped like `out` (arrays or `ShapeDtypeStruct`s)."""
    return jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), out)
