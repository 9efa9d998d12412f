"""FedRoD (Chen and Chao 2022, "On Bridging Generic and Personalized Federated Learning for
Image Classification", ICLR): a generic model trained with the balanced softmax and averaged,
plus a personal head on its representation.

Each slot holds a model ``(body, head_g)`` (the generic head) and a personal head ``head_p``
of the same shape. Per minibatch, with ``z = features(body, x)``,
``g = classify(head_g, z)``, ``p = classify(head_p, stop_grad(z))``:

- ``(body, head_g) -= lr * grad BSM(g, y)``, the balanced-softmax loss
  ``CE(g + log n_s, y)`` with ``n_s [C]`` the slot's training samples per class (Ren et al.
  2020), which makes the generic model fit the balanced (global) label distribution;
- ``head_p -= lr * grad CE(stop_grad(g) + p, y)``: the personal head learns the correction of
  the generic logits for the slot's own distribution.

Both gradients are taken at the same (pre-step) parameters, as PFLlib's ``clientrod`` does
(``rep`` and ``out_g`` detached from the step before), so one optimizer step on the pair
``(model, head_p)`` with the summed loss is exactly its two steps. After local training,
``(body, head_g)`` is averaged over the slot's group (sample-count weights, FedAvg); ``head_p``
stays personal. Evaluation: ``g + p``, i.e. the model with head ``head_g + head_p`` (exact for
a head linear in its parameters, as every built-in model's output layer is; a user's model
with a nonlinear head is evaluated with the summed parameters instead of the summed logits).
``head_p`` starts as a copy of the initial head (PFLlib's ``deepcopy(model.predictor)``).

Departures: the paper's optional hypernetwork that generates the personal head is not
implemented (its main variant, and PFLlib's, are the linear personal head above). Absent
classes get ``log n`` with ``n`` floored at 1e-8 (PFLlib takes ``log 0 = -inf``; the same
softmax up to float rounding, without infinities in the gradient). Aggregation is within the
neighbor lists (D2D).

Limit: on a slot whose classes are all equally frequent ``log n_s`` is a constant shift, so
the generic model of a federation of such slots is FedAvg's.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pfedwn_jax.algorithms.base import NoHParams, RoundContext, register
from pfedwn_jax.algorithms.common import baseline_algorithm, init_clients, local_update
from pfedwn_jax.algorithms.split import average_part, split_keys
from pfedwn_jax.engine import ClientState, weighted_ce
from pfedwn_jax.models.split import head_of, with_head


class FedRoDState(NamedTuple):
    """FedRoD's state: ``clients`` with params ``{"model": [S, ...], "head": [S, ...]}`` (the
    generic model and the personal head, trained together) and ``train_loss [S]``."""

    clients: ClientState
    train_loss: jax.Array


def class_counts(ctx: RoundContext) -> jax.Array:
    """``[S, C]`` float32 training samples of each class in each slot's data client."""
    y = jnp.asarray(ctx.train.y)[ctx.data_client]
    real = jnp.asarray(ctx.train.mask)[ctx.data_client]
    onehot = jax.nn.one_hot(y, ctx.model.num_classes, dtype=jnp.float32)
    return jnp.sum(onehot * real[..., None], axis=1)


def rod_loss(model: Any) -> Any:
    """``loss_fn(pair, x, y, w, counts)``: balanced softmax of the generic logits plus the
    cross-entropy of the personal head's correction (see the module docstring)."""

    def loss_fn(pair, x, y, w, counts):
        params, head_p = pair["model"], pair["head"]
        z = model.features(params, x)
        g = model.classify(params, z)
        p = model.classify(with_head(model, params, head_p), jax.lax.stop_gradient(z))
        bsm = weighted_ce(g + jnp.log(jnp.maximum(counts, 1e-8)), y, w)
        return bsm + weighted_ce(jax.lax.stop_gradient(g) + p, y, w)

    return loss_fn


def _init(key: jax.Array, ctx: RoundContext, hp: Any) -> FedRoDState:
    split_keys(ctx, "fedrod")
    params = init_clients(key, ctx).params
    pair = {"model": params, "head": head_of(ctx.model, params)}
    clients = ClientState(pair, jax.vmap(ctx.tx.init)(pair))
    return FedRoDState(clients, jnp.zeros((ctx.num_slots,), jnp.float32))


def _round(
    state: FedRoDState, key: jax.Array, ctx: RoundContext, hp: Any
) -> tuple[FedRoDState, Any]:
    body, head = split_keys(ctx, "fedrod")
    loss_fn = rod_loss(ctx.model)
    clients, metrics = local_update(ctx, state.clients, key, loss_fn=loss_fn, aux=class_counts(ctx))
    sent = clients.params["model"]
    pair = {"model": average_part(sent, ctx, body + head), "head": clients.params["head"]}
    return FedRoDState(clients._replace(params=pair), metrics["loss"]), sent


def _eval(state: FedRoDState, ctx: RoundContext, hp: Any) -> Any:
    params, head_p = state.clients.params["model"], state.clients.params["head"]
    summed = jax.tree.map(jnp.add, head_of(ctx.model, params), head_p)
    return with_head(ctx.model, params, summed)


FEDROD = register(
    baseline_algorithm(
        name="fedrod",
        hparams=NoHParams,
        init=_init,
        round=_round,
        eval_params=_eval,
        description="generic model (balanced softmax) averaged, plus a personal head",
        family="splitting",
        default=False,
    )
)
