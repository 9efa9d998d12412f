"""MOON (Li, He and Song 2021, "Model-Contrastive Federated Learning", CVPR): FedAvg with a
contrastive term that pulls each slot's representation towards the group model's and away
from its own previous model's.

Local objective of slot ``s`` on a minibatch, with ``z = features(w, x)`` (the body's output),
``z_g`` the representation by the model the slot holds at the round's start (its group
average) and ``z_p`` by its own locally trained model of the previous round (both fixed):

    CE(w) + mu * mean_x -log( exp(cos(z, z_g) / tau) / (exp(cos(z, z_g) / tau)
                                                        + exp(cos(z, z_p) / tau)) )

then the trained models are averaged in each group (sample-count weights, FedAvg's round).
Defaults: ``tau = 0.5`` (the paper's), ``mu = 1`` (the paper's for CIFAR-100 and
Tiny-ImageNet, PFLlib's default; the paper takes 5 on CIFAR-10).

Departures: the paper's projection head (two extra layers on the body's output) is not added:
the contrast is on the model's own representation, the model's declared body output, as
PFLlib's ``clientmoon`` does (``model.base``). The previous model starts as the shared
initial model, so round 1 is FedAvg (the two representations coincide: a constant loss).
Averaging is within the neighbor lists (D2D), over what arrived (stale links: last copies).

Limit: ``mu = 0`` is FedAvg.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_float
from pfedwn_jax.algorithms.base import RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import (
    average_in_groups,
    baseline_algorithm,
    init_clients,
    local_update,
)
from pfedwn_jax.engine import ClientState, weighted_ce
from pfedwn_jax.models.split import require_split


@hparams(name="moon")
class MoonHParams:
    """MOON hyperparameters.

    Attributes:
      mu: weight of the model-contrastive term (>= 0; 0 gives FedAvg). Default 1 (Li et al.
        2021 on CIFAR-100 / Tiny-ImageNet; PFLlib's default).
      tau: temperature of the contrast (> 0). Default 0.5, Li et al. 2021's.
    """

    mu: float = checked(1.0, check_float, 0.0)
    tau: float = checked(0.5, check_float, 0.0, low_inclusive=False)


class MoonState(NamedTuple):
    """MOON's state: the slots' (group) models, their previous locally trained models
    ``prev [S, ...]`` and ``train_loss [S]``."""

    clients: ClientState
    prev: Any
    train_loss: jax.Array


def cosine(a: jax.Array, b: jax.Array, eps: float = 1e-8) -> jax.Array:
    """``[B]`` cosine similarity of the rows of ``a, b [B, D]`` (norms floored at ``eps``,
    as ``torch.nn.functional.cosine_similarity``)."""
    norm = lambda v: jnp.sqrt(jnp.maximum(jnp.sum(v * v, axis=-1), eps * eps))  # grad 0 at 0
    return jnp.sum(a * b, axis=-1) / (norm(a) * norm(b))


def moon_loss(model: Any, mu: Any, tau: Any) -> Any:
    """``loss_fn(params, x, y, w, {"glob", "prev"})``: cross-entropy plus ``mu`` times the
    model-contrastive loss (see the module docstring), a weighted mean over real samples."""

    def loss_fn(params, x, y, w, anchors):
        z = model.features(params, x)
        z_g = jax.lax.stop_gradient(model.features(anchors["glob"], x))
        z_p = jax.lax.stop_gradient(model.features(anchors["prev"], x))
        logits = jnp.stack([cosine(z, z_g), cosine(z, z_p)], axis=-1) / tau
        con = -jax.nn.log_softmax(logits, axis=-1)[:, 0]
        con = jnp.sum(w * con) / jnp.maximum(jnp.sum(w > 0), 1)
        return weighted_ce(model.classify(params, z), y, w) + mu * con

    return loss_fn


def _init(key: jax.Array, ctx: RoundContext, hp: MoonHParams) -> MoonState:
    require_split(ctx.model, "moon")
    clients = init_clients(key, ctx)
    return MoonState(clients, clients.params, jnp.zeros((ctx.num_slots,), jnp.float32))


def _round(
    state: MoonState, key: jax.Array, ctx: RoundContext, hp: MoonHParams
) -> tuple[MoonState, Any]:
    model = require_split(ctx.model, "moon")
    anchors = {"glob": state.clients.params, "prev": state.prev}
    loss_fn = moon_loss(model, hp.mu, hp.tau)
    clients, metrics = local_update(ctx, state.clients, key, loss_fn=loss_fn, aux=anchors)
    averaged = average_in_groups(clients, ctx)
    return MoonState(averaged, clients.params, metrics["loss"]), clients.params


MOON = register(
    baseline_algorithm(
        name="moon",
        tune=("mu", (0.1, 1.0)),
        hparams=MoonHParams,
        init=_init,
        round=_round,
        description="FedAvg with a model-contrastive term on the representation",
        family="traditional",
        default=False,
    )
)
