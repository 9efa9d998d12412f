"""Model-splitting methods: FedPer, LG-FedAvg, FedRep and FedBABU.

Each slot's model is a body (representation) and a head (classifier), as the model declares
them (``pfedwn_jax.models.split``; every built-in model's head is its output layer). The
methods differ in which part is shared among neighbors and how each part is trained; "group
average" is FedAvg over slot ``s``'s neighbor list with sample-count weights (``w_j = n_j /
sum_{j in N(s)} n_j``), as in FedAvg here, over the models that arrived (with stale links a
failed link's last copy). Every round returns the locally trained models as ``sent``.

- **FedPer** (Arivazhagan et al. 2019, arXiv:1912.00818): train the whole model ``E`` local
  epochs, then ``body_s <- sum_j w_j body_j``; the head stays personal. As PFLlib
  (``clientper``/``serverper``).
- **LG-FedAvg** (Liang et al. 2020, "Think Locally, Act Globally", arXiv:2001.01523): the
  mirror image: local representation, global head; train the whole model, then
  ``head_s <- sum_j w_j head_j``, the body stays personal. As PFLlib (``clientlg``/``serverlg``).
- **FedRep** (Collins et al. 2021, ICML): first ``head_epochs`` epochs on the head with the
  body frozen, then ``E`` epochs (the context's schedule) on the body with the head frozen,
  then ``body_s <- sum_j w_j body_j``. ``head_epochs`` default 10, the paper's (10 local
  epochs for the head, 1 for the representation; PFLlib's ``plocal_epochs`` is this).
- **FedBABU** (Oh et al. 2022, ICLR): the head is frozen at its (shared) initial values
  during federated training: train the body ``E`` epochs, ``body_s <- sum_j w_j body_j``.
  Each slot is evaluated with a copy of its model fine-tuned on its own data for
  ``finetune_epochs`` epochs (body and head, a fresh optimizer state), as the paper
  evaluates personalised accuracy (default 5 epochs, the paper's; Flower's reproduction of
  its CIFAR-10 setting uses 5 too).

Departures: aggregation is within each slot's neighbor list (D2D), not a server's average
over sampled clients. FedBABU fine-tunes after every round (the learning curve of the
personalised accuracy) where the paper and PFLlib fine-tune once at the end; the fine-tuned
copy is not trained further (the next round's fine-tuning starts again from the federated
model). Freezing restores the frozen part after training, so a momentum optimizer does not
move it either (PFLlib sets ``requires_grad = False``, to the same effect for plain SGD).

Limits: with a model whose head is the whole model (``logreg``), FedPer and FedRep are Local
(FedRep with ``head_epochs = E``) and LG-FedAvg is FedAvg.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from pfedwn_jax._checks import check_int
from pfedwn_jax.algorithms.base import (
    Algorithm,
    NoHParams,
    RoundContext,
    checked,
    hparams,
    register,
)
from pfedwn_jax.algorithms.common import (
    BaselineState,
    baseline_algorithm,
    eval_own,
    init_baseline,
    local_update,
)
from pfedwn_jax.algorithms.payload import part_bits
from pfedwn_jax.algorithms.split import (
    average_part,
    split_keys,
    train_part,
    train_then_average_part,
)
from pfedwn_jax.engine import ClientState


def _init_split(name: str) -> Any:
    """``init_baseline`` after checking that the model declares a body/head split."""

    def init(key: jax.Array, ctx: RoundContext, hp: Any) -> BaselineState:
        split_keys(ctx, name)
        return init_baseline(key, ctx, hp)

    return init


def _fedper_round(state: BaselineState, key: jax.Array, ctx: RoundContext, hp: Any) -> Any:
    body, _ = split_keys(ctx, "fedper")
    return train_then_average_part(state, key, ctx, body)


def _lg_round(state: BaselineState, key: jax.Array, ctx: RoundContext, hp: Any) -> Any:
    _, head = split_keys(ctx, "lgfedavg")
    return train_then_average_part(state, key, ctx, head)


@hparams(name="fedrep")
class FedRepHParams:
    """FedRep hyperparameters.

    Attributes:
      head_epochs: local epochs on the head (body frozen) before the body's epochs; static
        (a loop length). Default 10, Collins et al. 2021's.
    """

    head_epochs: int = checked(10, check_int, 1, static=True)


def _fedrep_round(
    state: BaselineState, key: jax.Array, ctx: RoundContext, hp: FedRepHParams
) -> tuple[BaselineState, Any]:
    body, head = split_keys(ctx, "fedrep")
    clients, _ = train_part(ctx, state.clients, key, body, epochs=hp.head_epochs)
    clients, metrics = train_part(ctx, clients, jax.random.fold_in(key, 1), head)
    params = average_part(clients.params, ctx, body)
    return BaselineState(clients._replace(params=params), metrics["loss"]), clients.params


@hparams(name="fedbabu")
class FedBABUHParams:
    """FedBABU hyperparameters.

    Attributes:
      finetune_epochs: epochs of fine-tuning (whole model, own data) of the evaluated copy;
        0: evaluate the federated model itself. Static (a loop length). Default 5, Oh et
        al. 2022's (and Flower's reproduction's).
    """

    finetune_epochs: int = checked(5, check_int, 0, static=True)


class FedBABUState(NamedTuple):
    """FedBABU's state: the federated models (head at its initial values), the training loss
    ``[S]`` and the fine-tuned copies ``tuned [S, ...]`` each slot is evaluated with."""

    clients: ClientState
    train_loss: jax.Array
    tuned: Any


def _babu_init(key: jax.Array, ctx: RoundContext, hp: FedBABUHParams) -> FedBABUState:
    split_keys(ctx, "fedbabu")
    base = init_baseline(key, ctx, hp)
    return FedBABUState(base.clients, base.train_loss, base.clients.params)


def _babu_round(
    state: FedBABUState, key: jax.Array, ctx: RoundContext, hp: FedBABUHParams
) -> tuple[FedBABUState, Any]:
    body, head = split_keys(ctx, "fedbabu")
    clients, metrics = train_part(ctx, state.clients, jax.random.fold_in(key, 1), head)
    params = average_part(clients.params, ctx, body)
    tuned = params
    if hp.finetune_epochs > 0:
        fresh = ClientState(params, jax.vmap(ctx.tx.init)(params))
        tuned = local_update(ctx, fresh, key, epochs=hp.finetune_epochs)[0].params
    new = FedBABUState(clients._replace(params=params), metrics["loss"], tuned)
    return new, clients.params


def _babu_eval(state: FedBABUState, ctx: RoundContext, hp: Any) -> Any:
    return state.tuned


def shared_part(name: str, part: int) -> Any:
    """The ``payload_bits`` of method ``name`` sharing its body (``part`` 0) or head (1):
    a slot sends only that part of its model."""

    def payload_bits(state: Any, ctx: RoundContext, hp: Any, value_bits: Any) -> Any:
        return part_bits(state.clients.params, split_keys(ctx, name)[part], value_bits)

    return payload_bits


def _register(
    name: str,
    hp: Any,
    init: Any,
    round_fn: Any,
    description: str,
    eval_params: Any = eval_own,
    part: int = 0,
) -> Algorithm:
    """Register a splitting method sharing its body (``part`` 0) or head (1) (not run by
    default; its training loss recorded)."""
    algorithm = baseline_algorithm(
        name=name,
        hparams=hp,
        init=init,
        round=round_fn,
        eval_params=eval_params,
        payload_bits=shared_part(name, part),
        description=description,
        family="splitting",
        default=False,
    )
    return register(algorithm)


FEDPER = _register(
    "fedper",
    NoHParams,
    _init_split("fedper"),
    _fedper_round,
    "body averaged in each group, head personal",
)
LGFEDAVG = _register(
    "lgfedavg",
    NoHParams,
    _init_split("lgfedavg"),
    _lg_round,
    "head averaged in each group, body (representation) personal",
    part=1,
)
FEDREP = _register(
    "fedrep",
    FedRepHParams,
    _init_split("fedrep"),
    _fedrep_round,
    "head epochs then body epochs; body averaged in each group",
)
FEDBABU = _register(
    "fedbabu",
    FedBABUHParams,
    _babu_init,
    _babu_round,
    "body averaged with the head frozen at init; fine-tuned copy evaluated",
    eval_params=_babu_eval,
)
