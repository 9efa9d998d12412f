"""Building blocks shared by the algorithms (pure; everything but the checks is jittable).

- ``init_clients``, ``local_update``, ``group_average_matrix``: the one way to create the slots'
  models, to train them locally and to average them in groups.
- ``BaselineState``, ``init_baseline``, ``eval_own``, ``train_loss_record``: the state and the
  functions of the methods that keep one model per slot and nothing else.
- ``average_in_groups``, ``train_then_average``: FedAvg's round, reused by its variants.
- ``sq_norm_diff``, ``proximal_loss``: a local objective with a pull towards an anchor model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax._checks import check_shape
from pfedwn_jax.algorithms.base import RoundContext
from pfedwn_jax.engine import ClientState, init_client_state, local_train, mix


def check_square(name: str, x: Any) -> int:
    """Raise a ``ValueError`` naming ``name`` unless ``x`` is a square ``[S, S]`` matrix; ``S``."""
    check_shape(name, x, (None, None))
    s = int(np.shape(x)[0])
    check_shape(name, x, (s, s))
    return s


def check_context(ctx: RoundContext) -> None:
    """The context's per-slot arrays agree on ``S``: ``data_client [S]``, ``adjacency [S, S]``,
    ``is_target [S]``, ``num_samples [S]``."""
    if not isinstance(ctx, RoundContext):
        raise ValueError(f"ctx must be a RoundContext; got {type(ctx).__name__}")
    check_shape("ctx.data_client", ctx.data_client, (None,))
    s = ctx.num_slots
    check_shape("ctx.adjacency", ctx.adjacency, (s, s))
    check_shape("ctx.is_target", ctx.is_target, (s,))
    check_shape("ctx.num_samples", ctx.num_samples, (s,))


def init_clients(key: jax.Array, ctx: RoundContext, *, same_init: bool = True) -> ClientState:
    """The stacked ``ClientState`` ``[S, ...]`` of every slot (one shared initial model by
    default, as FL does); checks the context's shapes first."""
    check_context(ctx)
    return init_client_state(ctx.model, ctx.tx, key, ctx.num_slots, same_init=same_init)


def local_update(
    ctx: RoundContext,
    clients: ClientState,
    key: jax.Array,
    *,
    data_client: Any = None,
    epochs: int | None = None,
    num_steps: int | None = None,
    loss_fn: Callable[..., jax.Array] | None = None,
    grad_fn: Callable[..., tuple[jax.Array, Any]] | None = None,
    aux: Any = None,
    sample_weight: Any = None,
    active: Any = None,
) -> tuple[ClientState, dict[str, jax.Array]]:
    """The engine's ``local_train`` of ``clients [P, ...]`` with the context's model and data.

    Args:
      data_client: ``[P]`` data client each model trains on (default ``ctx.data_client``, so
        ``P = S``); e.g. pFedWN trains its EM components on their target's data.
      epochs, num_steps: the schedule; by default the context's (``ctx.num_steps`` steps if
        set, else ``ctx.local_epochs`` epochs). At most one of them may be given.
      loss_fn, grad_fn, aux, sample_weight, active: the update rule (see ``local_train``).

    Returns ``(ClientState [P, ...], {"loss": [P], "steps": [P]})``.
    """
    if epochs is not None and num_steps is not None:
        raise ValueError(f"give epochs or num_steps, not both; got {epochs} and {num_steps}")
    if epochs is None:
        epochs = ctx.local_epochs
        num_steps = ctx.num_steps if num_steps is None else num_steps
    return local_train(
        ctx.model,
        ctx.tx,
        clients,
        ctx.train,
        ctx.data_client if data_client is None else data_client,
        key,
        batch_size=ctx.batch_size,
        epochs=epochs,
        num_steps=num_steps,
        loss_fn=loss_fn,
        grad_fn=grad_fn,
        aux=aux,
        sample_weight=sample_weight,
        active=active,
        shards=ctx.shards,
    )


def group_average_matrix(adjacency: jax.Array, weights: jax.Array) -> jax.Array:
    """Row-stochastic ``[S, S]`` matrix averaging each row's neighborhood with ``weights [S]``.

    ``out[i, j] = adjacency[i, j] * weights[j] / sum_k adjacency[i, k] * weights[k]``: FedAvg
    over slot ``i``'s group with sample-count weights. A row whose weights sum to 0 keeps its
    own model (identity row).
    """
    s = check_square("adjacency", adjacency)
    check_shape("weights", weights, (s,))
    w = jnp.where(adjacency, weights[None, :].astype(jnp.float32), 0.0)
    total = w.sum(axis=1, keepdims=True)
    eye = jnp.eye(s, dtype=w.dtype)
    return jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), eye)


class BaselineState(NamedTuple):
    """State of the methods that keep one model per slot (local, fedavg, fedprox, ...).

    Attributes:
      clients: stacked engine ``ClientState`` (params and optimizer state, leading axis S).
      train_loss: ``[S]`` mean local training loss of the last round (0 before round 1).
    """

    clients: ClientState
    train_loss: jax.Array


def init_baseline(key: jax.Array, ctx: RoundContext, hp: Any) -> BaselineState:
    """One shared initial model in every slot, training loss 0."""
    return BaselineState(init_clients(key, ctx), jnp.zeros((ctx.num_slots,), jnp.float32))


def eval_own(state: Any, ctx: RoundContext, hp: Any) -> Any:
    """Each slot is evaluated with the model it holds (``state.clients.params [S, ...]``)."""
    return state.clients.params


def train_loss_record(state: Any, ctx: RoundContext, hp: Any) -> dict[str, jax.Array]:
    """The per-round record ``{"train_loss": [S]}``."""
    return {"train_loss": state.train_loss}


def average_in_groups(clients: ClientState, ctx: RoundContext) -> ClientState:
    """Replace each slot's params by its group's sample-weighted mean (optimizer state kept)."""
    matrix = group_average_matrix(ctx.adjacency, ctx.num_samples)
    return clients._replace(params=mix(clients.params, matrix))


def train_then_average(
    state: BaselineState, key: jax.Array, ctx: RoundContext, **train_kwargs: Any
) -> BaselineState:
    """FedAvg's round: ``local_update(..., **train_kwargs)``, then group averaging."""
    clients, metrics = local_update(ctx, state.clients, key, **train_kwargs)
    return BaselineState(average_in_groups(clients, ctx), metrics["loss"])


def sq_norm_diff(params: Any, anchor: Any) -> jax.Array:
    """``||params - anchor||^2`` summed over every leaf of one client's pytree."""
    leaves = jax.tree_util.tree_leaves(
        jax.tree_util.tree_map(lambda p, a: jnp.sum(jnp.square(p - a)), params, anchor)
    )
    return sum(leaves, jnp.zeros((), jnp.float32))


def proximal_loss(base_loss: Callable[..., jax.Array], mu: float) -> Callable[..., jax.Array]:
    """``loss_fn(params, x, y, w, anchor) = base_loss(...) + mu/2 ||params - anchor||^2``."""

    def loss_fn(params, x, y, w, anchor):
        return base_loss(params, x, y, w, anchor) + 0.5 * mu * sq_norm_diff(params, anchor)

    return loss_fn
