"""pFedWN (paper Eq. 5, Alg. 1 and 2): EM-weighted aggregation over the selected neighbors.

Each round, every target row ``i`` (``ctx.is_target``) mixes its model with the models it
receives along its neighbor list (``ctx.neighbors [S, K]``, column 0 = ``i`` itself),

    ``w_i <- a * w_i + (1 - a) * sum_{k >= 1} pi[i, k] * w_{neighbors[i, k]}``      (Eq. 5)

a gather and a weighted sum (``mix_sparse``), O(S K P), and then every slot trains locally
(E local epochs). Non-target slots (the selected neighbors in single-target mode) only train
locally and send, as in Alg. 2. One ``local_update`` call
serves both roles, so a round costs one training pass: the neighbors' models a target mixes in
round ``t`` are the ones they finished in round ``t - 1`` (Alg. 2 lets them train first in the
same round; with the shared initial model the two orders differ by that one-round shift).

The weights ``pi[i, :]`` come from EM (Alg. 1, App. B) on target ``i``'s training data, with
the received neighbor models as the mixture components. The components are the list entries
``(i, k)``, ``k >= 1``, with ``neighbor_mask`` True on a target row (the others are masked
and take no training step); the responsibilities are ``[S, K - 1, n]`` per target's own
``n`` samples. Each real entry is an EM pair (``em_pairs``: the real ones numbered first,
row-major), whose number keys its M-step-2 minibatch order.

Memory: the per-target work (cross-evaluation of the components, E-step, M-steps) runs over
chunks of ``chunk`` targets (``em_chunk``; ``engine.chunked_rows``), so a round holds one
copy of the network's models plus one chunk's ``chunk x (K - 1)`` components, never the
``S (K - 1)`` of every entry; the received models are read from the pool where they lie
(``cross_evaluate`` gathers its own small batches). Eq. 5 mixes in place, a block of
parameters at a time (``mix_sparse``). Results do not depend on the chunk. The EM itself
(``estimate_pi``, ``em_components``, the chunking) lives in ``pfedwn_em``.

- schedule: no aggregation during ``warmup_rounds`` rounds of local training (EM on untrained
  models would see identical losses); at round ``warmup_rounds`` pi is estimated; then frozen
  (``em_every=0``, the paper's time-slot picture) or re-estimated every ``em_every`` rounds;
  with lossy links also per row when a neighbor the estimate left out arrives (``refresh``).
- EM (``estimate_pi``): ``em_steps`` outer steps of E-step and pi update (M-step 1), then pi
  is refined with fixed models until ``max |delta pi| < em_tol``
  (``pfedwn_jax.em.estimate_weights``). ``pi_from`` says which models the E-steps evaluate:
  ``"received"`` (default) the neighbors' received models, so pi says how well each
  neighbor's model, trained on that neighbor's data, explains the target's data (the paper's
  intent: weights by data similarity); ``"components"`` App. B read literally, the components
  after M-step 2 (each outer step trains every component one responsibility-weighted epoch on
  the target's data, ``local_update(..., sample_weight=lambda)``). Fine-tuned on the
  target's own data, the components all fit it, and pi then follows which fits best after
  fine-tuning, not whose data is similar (measured on full MNIST, docs/algorithms.md).
- M-step 2 (``component_updates``) runs only where its components are used: with
  ``pi_from="components"``, or with ``mix_components=True``, where a round that estimates pi
  mixes the fine-tuned components instead of the received models (the other reading of
  Alg. 1, measured in docs/REPRODUCTION.md). Otherwise components are scratch copies and
  Eq. 5 mixes the neighbors' own models; EM only decides the weights.
- ``floor`` keeps every selected neighbor's weight at least that large.

Records per round: ``pi [S, K]`` (row i: target i's weights over its neighbor list, columns
as in ``ctx.neighbors``; column 0, the target itself, and padding are 0, as are non-target
rows) and ``pi_trace [em_steps + 2, S, K]`` (the latest estimate's path: uniform prior, pi
after each outer EM step, final refined pi: the paper's Fig. 8 curve).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from pfedwn_jax._checks import INT32_MAX, check_bool, check_choice, check_float, check_int
from pfedwn_jax.algorithms.base import RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import (
    baseline_algorithm,
    check_shape,
    check_square,
    init_clients,
    local_update,
    neighbor_models,
)
from pfedwn_jax.algorithms.pfedwn_em import (
    CHUNK_BYTES,
    chunk_size,
    em_chunk,
    em_components,
    em_pairs,
    estimate_pi,
    materialises,
    mix_tuned_components,
    weighed,
)
from pfedwn_jax.algorithms.phases import Phase, Sizes, baseline, evaluation, training
from pfedwn_jax.engine import mix_sparse
from pfedwn_jax.engine.cond import cond_any

__all__ = [
    "CHUNK_BYTES",
    "PFEDWN",
    "PI_FROM",
    "REFRESH",
    "PFedWNHParams",
    "PFedWNState",
    "aggregation_matrix",
    "aggregation_weights",
    "chunk_size",
    "em_chunk",
    "em_components",
    "em_due",
    "em_pairs",
    "estimate_pi",
    "materialises",
    "memory_phases",
    "records",
    "rows_due",
    "weighed",
]

#: Which models EM's E-step evaluates (``PFedWNHParams.pi_from``).
PI_FROM = ("received", "components")
#: When a target's pi is re-estimated beyond the schedule (``PFedWNHParams.refresh``).
REFRESH = ("arrival", "schedule")


@hparams(name="pfedwn")
class PFedWNHParams:
    """pFedWN hyperparameters.

    Attributes:
      a: the paper's alpha in Eq. 5, the weight of the target's own model in ``[0, 1]``
        (1: Local; 0: only the neighbors). The paper gives no value; 0.5 is ours.
      warmup_rounds: rounds of local training before the first EM estimate (ours: 1, so the
        neighbor models EM compares have seen their data; the paper estimates "at t = 0").
      em_every: 0 estimates pi once after warm-up and freezes it (the paper's Fig. 4
        time-slot picture, default); k > 0 re-estimates every k rounds.
      component_updates: run App. B's M-step 2 (responsibility-weighted training of the
        component models on the target's data) in each outer EM step where its components
        are used: by the E-steps (``pi_from="components"``) or by Eq. 5 (``mix_components``)
        (paper Alg. 1; default True); False keeps the received neighbor models everywhere.
      em_steps: outer EM steps (E, M-pi and, where used, M-w) per estimate (ours: 3).
      em_iters: maximum fixed-model EM iterations of the final refinement (ours: 200).
      em_tol: stop the refinement when ``max |delta pi| < em_tol`` (ours: 1e-5).
      floor: lower bound of every selected neighbor's weight, in ``[0, 1]`` (capped at ``1/k``
        for ``k`` neighbors). Default 1e-4 (ours: small, so an unrelated neighbor still gets
        near-zero weight).
      component_epochs: local epochs of each M-step-2 update (ours: 1).
      mix_components: in a round whose start estimates pi, Eq. 5 mixes the components
        M-step 2 fine-tuned on the target's data instead of the neighbors' received models
        (the other reading of Alg. 1); other rounds mix the received models. Default False
        (the paper's Eq. 5 names the neighbors' models ``w_m``).
      pi_from: the models EM's E-steps and refinement evaluate: ``"received"`` (default,
        ours on evidence, docs/algorithms.md: pi then follows whose data explains the
        target's) or ``"components"`` (App. B's loop read literally: the components after
        M-step 2, fine-tuned on the target's own data).
      refresh: ``"arrival"`` (default, on evidence: docs/robustness.md) also re-estimates a
        target's pi, after warm-up, when it may combine a neighbor its estimate did not
        include (a first arrival; without ``stale``, a return after a failure);
        ``"schedule"`` only at the ``em_every`` schedule and re-selections. Ideal links: the
        same run, bit for bit.
      uniform_guard: leave out of a target's estimate every neighbor whose predictions on
        its data are near uniform (``em.near_uniform``: mean ``|loss - log C|`` below
        ``uniform_guard * log C``), as a barely trained small neighbor's are; a target with
        every neighbor left out keeps its own model. Default 0 (off, on evidence:
        docs/algorithms.md; 0.1 separates a 15-sample neighbor from trained ones).
      chunk: targets whose EM runs at once (cross-evaluation, E-step, M-steps: each chunk
        holds its targets' ``K - 1`` components), the rest one chunk after another; 0
        (default) picks the most whose working copies fit ``CHUNK_BYTES`` (``chunk_size``;
        the memory plan counts them). Results do not depend on it (tested bit for bit on
        the CPU); it trades memory for fewer, larger steps (an accelerator likes large).
    """

    a: float = checked(0.5, check_float, 0.0, 1.0)
    warmup_rounds: int = checked(1, check_int, 0, INT32_MAX, static=True)
    em_every: int = checked(0, check_int, 0, INT32_MAX, static=True)
    component_updates: bool = checked(True, check_bool, static=True)
    em_steps: int = checked(3, check_int, 0, INT32_MAX, static=True)
    em_iters: int = checked(200, check_int, 1, INT32_MAX, static=True)
    em_tol: float = checked(1e-5, check_float, 0.0)
    floor: float = checked(1e-4, check_float, 0.0, 1.0)
    component_epochs: int = checked(1, check_int, 1, INT32_MAX, static=True)
    mix_components: bool = checked(False, check_bool, static=True)
    pi_from: str = checked("received", check_choice, PI_FROM, static=True)
    refresh: str = checked("arrival", check_choice, REFRESH, static=True)
    uniform_guard: float = checked(0.0, check_float, 0.0, 1.0)
    chunk: int = checked(0, check_int, 0, INT32_MAX, static=True)


class PFedWNState(NamedTuple):
    """pFedWN state (every leaf an array).

    Attributes:
      clients: stacked engine ``ClientState`` of the S slots.
      pi: ``[S, K]`` aggregation weights over each row's neighbor list (row i sums to 1 over
        target i's neighbors once estimated; column 0 and padding 0; 0 before the first
        estimate and on non-target rows).
      pi_trace: ``[em_steps + 2, S, K]`` the latest estimate's path: the uniform prior, pi
        after each outer EM step, and the final (refined) pi.
      rounds_done: ``[]`` int32, completed rounds.
      train_loss: ``[S]`` mean local training loss of the last round.
      included: ``[S, K]`` bool, the list entries that were components of each row's
        current estimate (``refresh="arrival"`` re-estimates a row when a usable entry is not).
    """

    clients: Any
    pi: jax.Array
    pi_trace: jax.Array
    rounds_done: jax.Array
    train_loss: jax.Array
    included: jax.Array


def aggregation_weights(pi: jax.Array, a: float | jax.Array, apply: ArrayLike) -> jax.Array:
    """Eq. 5 as ``[S, K]`` weights for ``mix_sparse``: row s = ``a e_0 + (1 - a) pi[s]``.

    ``pi [S, K]`` (column 0, the slot itself, is 0), ``apply [S]`` bool. Rows with ``apply[s]``
    False, or whose pi row is all zero (no neighbor), keep their own model (``e_0``).
    """
    check_shape("pi", pi, (None, None), "[S, K]")
    s, k = np.shape(pi)
    check_shape("apply", apply, (s,))
    own = (jnp.arange(k) == 0).astype(jnp.float32)[None, :]
    has = apply & (pi.sum(1) > 0)
    mixed = a * own + (1.0 - a) * pi.astype(jnp.float32)
    return jnp.where(has[:, None], mixed, own)


def aggregation_matrix(pi: jax.Array, a: float | jax.Array, apply: jax.Array) -> jax.Array:
    """Eq. 5 as a dense ``[S, S]`` mixing matrix from a dense ``pi [S, S]`` (small networks and
    tests): row i = ``a e_i + (1 - a) pi[i]``; identity where ``apply`` is False or pi is 0."""
    s = check_square("pi", pi)
    check_shape("apply", apply, (s,))
    eye = jnp.eye(s, dtype=jnp.float32)
    has = apply & (pi.sum(1) > 0)
    mixed = a * eye + (1.0 - a) * pi.astype(jnp.float32)
    return jnp.where(has[:, None], mixed, eye)


def init(key: jax.Array, ctx: RoundContext, hp: PFedWNHParams) -> PFedWNState:
    """The shared initial model in every slot and no weights yet (``pi [S, K]`` zeros)."""
    clients = init_clients(key, ctx)  # checks the context's shapes first
    s, k = ctx.neighbors.shape
    return PFedWNState(
        clients=clients,
        pi=jnp.zeros((s, k), jnp.float32),
        pi_trace=jnp.zeros((hp.em_steps + 2, s, k), jnp.float32),
        rounds_done=jnp.zeros((), jnp.int32),
        train_loss=jnp.zeros((s,), jnp.float32),
        included=jnp.zeros((s, k), bool),
    )


def em_due(rounds_done: jax.Array, hp: PFedWNHParams) -> jax.Array:
    """Whether pi is (re-)estimated at the start of the round after ``rounds_done`` rounds."""
    since = rounds_done - hp.warmup_rounds
    if hp.em_every == 0:
        return since == 0
    return (since >= 0) & (since % hp.em_every == 0)


def _em_now(rounds_done: jax.Array, ctx: RoundContext, hp: PFedWNHParams) -> jax.Array:
    """``em_due``, or (with mobility) a re-selection changed the lists after warm-up."""
    due = em_due(rounds_done, hp)
    reselected = getattr(ctx.links, "reselected", None)
    if reselected is None:
        return due
    return due | (reselected & (rounds_done >= hp.warmup_rounds))


def rows_due(state: PFedWNState, ctx: RoundContext, hp: PFedWNHParams) -> jax.Array:
    """``[S]`` bool: the rows whose pi is (re-)estimated at the start of this round: all at
    ``_em_now``; with ``refresh="arrival"`` and a link model, also each target row (after
    warm-up) that may combine a list entry its current estimate did not include."""
    s = ctx.neighbors.shape[0]
    rows = jnp.broadcast_to(_em_now(state.rounds_done, ctx, hp), (s,))
    if hp.refresh == "schedule" or ctx.links is None:  # ideal links: every entry, every round
        return rows
    new = (weighed(ctx) & ~state.included).any(1)
    return rows | (new & ctx.is_target & (state.rounds_done >= hp.warmup_rounds))


def _arrived(pi: jax.Array, ctx: RoundContext) -> jax.Array:
    """With a link model, pi renormalised over the models that arrived this round (a row with
    none left is all zero: the target keeps its own model, Eq. 5 with nothing to mix)."""
    if ctx.links is None or ctx.links.model == "ideal":  # pi as estimated (bit for bit)
        return pi
    kept = pi * ctx.neighbor_mask
    total = kept.sum(1, keepdims=True)
    return jnp.where(total > 0, kept / jnp.where(total > 0, total, 1.0), 0.0)


def _estimate_and_mix(
    state: PFedWNState,
    key: jax.Array,
    ctx: RoundContext,
    hp: PFedWNHParams,
    received: tuple[Any, jax.Array],
    weights: Any,
) -> tuple[jax.Array, jax.Array, Any]:
    """``(pi, trace, params)``: the round's weights, re-estimated when EM is due, and Eq. 5
    (``weights(pi) [S, K]``) over the received models, or with ``mix_components`` (and
    M-step 2) in an EM round over M-step 2's components."""
    mixed = lambda pi: mix_sparse(*received, weights(pi), shards=ctx.shards)
    if ctx.neighbors.shape[1] == 1:  # nobody has a neighbor: pFedWN is local training
        return state.pi, state.pi_trace, mixed(state.pi)
    params, rows = state.clients.params, rows_due(state, ctx, hp)
    due = rows.any()
    pi, trace = cond_any(  # EM only in the rounds (and runs of a sweep) that estimate
        due,
        lambda p, k, c, h, r, *_: estimate_pi(p, k, c, h, r),
        lambda *args: args[-2:],
        (params, key, ctx, hp, received, state.pi, state.pi_trace),
    )
    pi = jnp.where(rows[:, None], pi, state.pi)
    trace = jnp.where(rows[None, :, None], trace, state.pi_trace)
    if not (hp.mix_components and hp.component_updates):  # the components are the received
        return pi, trace, mixed(pi)

    def fine_tuned() -> Any:  # the components where re-estimated, the received elsewhere
        tuned = mix_tuned_components(params, key, ctx, hp, received, weights(pi))
        at = lambda x: rows.reshape((-1,) + (1,) * (x.ndim - 1))
        return jax.tree.map(lambda t, m: jnp.where(at(t), t, m), tuned, mixed(pi))

    return pi, trace, jax.lax.cond(due, fine_tuned, lambda: mixed(pi))


def _round(
    state: PFedWNState, key: jax.Array, ctx: RoundContext, hp: PFedWNHParams
) -> tuple[PFedWNState, Any]:
    # training uses `key` itself, exactly as Local does (so a = 1 reproduces Local bit for bit)
    em_key, train_key = jax.random.fold_in(key, 0x5EED), key
    received = neighbor_models(state.clients.params, ctx)
    apply = ctx.is_target & (state.rounds_done >= hp.warmup_rounds)

    def weights(pi: jax.Array) -> jax.Array:  # Eq. 5 as [S, K] weights
        return aggregation_weights(_arrived(pi, ctx), hp.a, apply)

    pi, trace, params = _estimate_and_mix(state, em_key, ctx, hp, received, weights)
    included = state.included
    if ctx.neighbors.shape[1] > 1:
        rows = rows_due(state, ctx, hp)
        included = jnp.where(rows[:, None], weighed(ctx), state.included)
    clients = state.clients._replace(params=params)
    clients, metrics = local_update(ctx, clients, train_key)
    new = PFedWNState(
        clients=clients,
        pi=pi,
        pi_trace=trace,
        rounds_done=state.rounds_done + 1,
        train_loss=metrics["loss"],
        included=included,
    )
    return new, state.clients.params


def records(state: PFedWNState, ctx: RoundContext, hp: PFedWNHParams) -> dict[str, jax.Array]:
    return {"pi": state.pi, "pi_trace": state.pi_trace, "train_loss": state.train_loss}


def memory_phases(sz: Sizes, hp: Any) -> list[Phase]:
    """pFedWN: besides training, mixing and evaluation, the EM over chunks of `C` targets
    (`pfedwn.chunk_size`): the chunk's `C (K - 1)` components with optimizer state (scan
    carry in and out) where it holds them (`pfedwn.materialises`), their evaluation on the
    targets' data and their responsibility-weighted training; the `[S, K - 1, n]` losses,
    responsibilities and the refinement's temporaries of every target, plus the round's
    evaluation temporaries: XLA's analysis lets the two share buffers, but the measured
    resident memory of the CNN's EM round held both (5.04 GiB against XLA's 3.44 at 10
    nodes). With `mix_components`, the mixed models are a new array (the components come
    from the old)."""
    phases = baseline(sz, hp)
    if sz.pairs == 0:
        return phases
    width = sz.pairs // sz.slots + 1
    model = sz.param + sz.opt
    entries = chunk_size(hp, sz.slots, width, model, sz.m_train) * (width - 1)
    comps = 2 * entries * model if materialises(hp) else 0
    activations = evaluation(sz, entries, sz.m_train, "pFedWN EM").activations
    activations += phases[-1].activations  # the evaluation
    if hp.component_updates and materialises(hp):
        steps = sz.epoch_steps * hp.component_epochs
        activations += training(sz, entries, steps, "pFedWN EM").activations
    em = Phase("pFedWN EM", 4 * 4 * sz.pairs * sz.m_train + comps, activations)
    if hp.mix_components and hp.component_updates:
        return [*phases, em, Phase("pFedWN EM mixing", sz.slots * sz.param + comps, 0)]
    return [*phases, em]


PFEDWN = register(
    baseline_algorithm(
        name="pfedwn",
        tune=("a", (0.5, 0.9)),
        hparams=PFedWNHParams,
        init=init,
        round=_round,
        records=records,
        description="EM-weighted aggregation over the selected neighbors (the paper's method)",
        memory_phases=memory_phases,
        family="personalized-aggregation",
    )
)
