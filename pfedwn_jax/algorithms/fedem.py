"""FedEM (Marfoq, Neglia, Bellet, Kameni and Vidal, "Federated Multi-Task Learning under a
Mixture of Distributions", NeurIPS 2021): each slot's data a mixture of ``M`` shared
component distributions, fitted by federated EM.

Slot ``s`` holds ``M`` component models ``theta_{s,m}`` and mixture weights ``pi_s [M]``
(uniform at the start; component ``m`` starts from the same model in every slot, component
0 from the shared initial model, the others from their own draws, so the components differ).
A round:

- E-step: ``q_s(m | i) = pi_{s,m} exp(-l(theta_{s,m}; x_i, y_i)) / sum_m' ...`` over the
  slot's training samples (``pfedwn_jax.em.responsibilities``);
- M-step: ``pi_{s,m} = mean_i q_s(m | i)`` (``em.m_step``);
- each component trains locally on ``sum_i q_s(m | i) l(theta; x_i, y_i) / B`` (the
  minibatch loss weighted by the responsibilities, as the authors' ``fit_batch``);
- ``theta_{s,m} <- sum_j p_sj theta_{j,m}`` over the neighbor list, component by component
  (``p_sj`` FedAvg's sample-count weights, the paper's ``n_t / n``).

With one component ``q = 1`` and a round is FedAvg's.

Departures: the paper has one server (every slot here averages its neighbor list). FedEM
predicts with the mixture ``sum_m pi_{s,m} p_m(y | x)``; the runner evaluates one model per
slot, so a slot is evaluated with its dominant component (largest ``pi_{s,m}``) -- the
mixture's prediction needs an evaluation seam the package does not have yet. A slot sends
its ``M`` components (``sent_params``: what the stale-link cache holds).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pfedwn_jax import em
from pfedwn_jax._checks import check_int
from pfedwn_jax.algorithms.base import Algorithm, RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import eval_own, init_clients, local_update, state_records
from pfedwn_jax.algorithms.mixing import group_average
from pfedwn_jax.algorithms.phases import Phase, Sizes, evaluation, mixing, plus, training
from pfedwn_jax.engine import ClientState, cross_evaluate


@hparams(name="fedem")
class FedEMHParams:
    """FedEM hyperparameters.

    Attributes:
      components: ``M``, the number of component models (>= 1). Default 3, the paper's
        (Marfoq et al. 2021, Sec. 5; the authors' ``n_learners``). Static.
    """

    components: int = checked(3, check_int, 1, static=True)


class FedEMState(NamedTuple):
    """``clients``: the components, leaves ``[S, M, ...]``, with their optimizer state;
    ``pi [S, M]`` the mixture weights; ``train_loss [S]`` the mean over components of the
    last round's weighted local loss."""

    clients: ClientState
    pi: jax.Array
    train_loss: jax.Array


def _flat(tree: Any) -> Any:
    return jax.tree.map(lambda a: a.reshape((-1, *a.shape[2:])), tree)


def _split(tree: Any, s: int) -> Any:
    return jax.tree.map(lambda a: a.reshape((s, -1, *a.shape[1:])), tree)


def _init(key: jax.Array, ctx: RoundContext, hp: FedEMHParams) -> FedEMState:
    s, m = ctx.num_slots, hp.components
    first = jax.tree.map(lambda a: a[0], init_clients(key, ctx).params)
    others = [ctx.model.init(jax.random.fold_in(key, c)) for c in range(1, m)]
    comps = jax.tree.map(lambda *c: jnp.stack(c), first, *others)  # [M, ...]
    params = jax.tree.map(lambda a: jnp.broadcast_to(a[None], (s, *a.shape)).copy(), comps)
    opt = jax.vmap(jax.vmap(ctx.tx.init))(params)
    pi = jnp.full((s, m), 1.0 / m, jnp.float32)
    return FedEMState(ClientState(params, opt), pi, jnp.zeros((s,), jnp.float32))


def _round(
    state: FedEMState, key: jax.Array, ctx: RoundContext, hp: FedEMHParams
) -> tuple[FedEMState, Any]:
    s, m = ctx.num_slots, hp.components
    dc = jnp.repeat(jnp.asarray(ctx.data_client), m)  # [S M]: component (s, c) at s * M + c
    flat = _flat(state.clients)
    losses = cross_evaluate(ctx.model, flat.params, ctx.train, jnp.arange(s * m), dc)["loss"]
    mask = ctx.train.mask[jnp.asarray(ctx.data_client)]  # [S, N]
    q = em.responsibilities(losses.reshape(s, m, -1), state.pi, sample_mask=mask)
    pi = em.m_step(q, sample_mask=mask)
    weight = q.reshape(s * m, -1)
    trained, metrics = local_update(ctx, flat, key, data_client=dc, sample_weight=weight)
    comps = _split(trained, s)
    params = group_average(comps.params, ctx)  # each component over the list
    loss = metrics["loss"].reshape(s, m).mean(axis=1)
    return FedEMState(comps._replace(params=params), pi, loss), comps.params


def _eval(state: FedEMState, ctx: RoundContext, hp: FedEMHParams) -> Any:
    top = jnp.argmax(state.pi, axis=1)
    return jax.tree.map(lambda a: jax.vmap(lambda x, i: x[i])(a, top), state.clients.params)


def memory_phases(sz: Sizes, hp: Any) -> list[Phase]:
    """FedEM: the `S M` components are trained (a second copy of them and their optimizer
    state beside the state's), cross-evaluated on their slot's training data first (the
    E-step: `[S M, n]` losses, responsibilities and sample weights) and mixed."""
    models = sz.slots * getattr(hp, "components", 1)
    held = models * (sz.param + sz.opt)
    train = plus(training(sz, models, sz.steps, "local training (components)"), held)
    estep = evaluation(sz, models, sz.m_train, "FedEM E-step")
    estep = estep._replace(activations=estep.activations + 3 * 4 * models * sz.m_train)
    mixed = plus(mixing(sz._replace(param=sz.param * models // sz.slots)), held)
    return [train, estep, mixed, evaluation(sz, sz.slots, sz.m_test, "evaluation")]


FEDEM = register(
    Algorithm(
        name="fedem",
        hparams=FedEMHParams,
        init=_init,
        round=_round,
        eval_params=_eval,
        records=state_records(pi="pi"),
        description="M shared component models mixed per slot by federated EM",
        family="mixture",
        default=False,
        sent_params=eval_own,
        memory_phases=memory_phases,
    )
)
