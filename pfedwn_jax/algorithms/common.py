"""Building blocks shared by the algorithms (pure; everything but the checks is jittable).

- ``init_clients``, ``local_update``, ``group_average_weights``: the one way to create the
  slots' models, to train them locally and to average them over their neighbor lists
  (``group_average_matrix`` is the dense ``[S, S]`` form, kept for small networks and tests).
- ``BaselineState``, ``init_baseline``, ``eval_own``, ``train_loss_record``: the state and the
  functions of the methods that keep one model per slot and nothing else (``state_records``:
  their records with further state fields; ``baseline_algorithm``: their ``Algorithm``).
- ``average_in_groups``, ``train_then_average``: FedAvg's round, reused by its variants.
- ``sq_norm_diff``, ``proximal_loss``: a local objective with a pull towards an anchor model.
- ``neighbor_models``, ``neighbor_distances``: the one way an algorithm reads the models on
  its neighbor lists (with ``stale`` links a failed link's last received copy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax._checks import check_shape, is_concrete
from pfedwn_jax.algorithms.base import Algorithm, RoundContext
from pfedwn_jax.engine import (
    ClientState,
    broadcast_slots,
    check_neighbors,
    init_client_state,
    local_train,
    mix_sparse,
    neighbor_sq_dist,
)


def check_square(name: str, x: Any) -> int:
    """Raise a ``ValueError`` naming ``name`` unless ``x`` is a square ``[S, S]`` matrix; ``S``."""
    check_shape(name, x, (None, None))
    s = int(np.shape(x)[0])
    check_shape(name, x, (s, s))
    return s


def check_lists(neighbors: Any, neighbor_mask: Any, num_slots: int | None = None) -> int:
    """Raise a ``ValueError`` unless ``neighbors [S, K]`` int and ``neighbor_mask [S, K]`` bool
    are neighbor lists (column 0 = the row's own slot, mask True; on the host only); ``K``."""
    check_shape("neighbors", neighbors, (num_slots, None), "[S, K]")
    s, k = np.shape(neighbors)
    check_shape("neighbor_mask", neighbor_mask, (s, k), "[S, K]")
    check_neighbors(neighbors, s)
    if is_concrete(neighbors) and is_concrete(neighbor_mask):
        nbr, mask = np.asarray(neighbors), np.asarray(neighbor_mask)
        if mask.dtype != bool:
            raise ValueError(f"neighbor_mask must be bool; got dtype {mask.dtype}")
        bad = np.nonzero((nbr[:, 0] != np.arange(s)) | ~mask[:, 0])[0]
        if bad.size:
            raise ValueError(
                f"neighbors[s, 0] must be s itself with neighbor_mask True; row {int(bad[0])} "
                f"has {int(nbr[bad[0], 0])} (mask {bool(mask[bad[0], 0])})"
            )
    return int(k)


def check_context(ctx: RoundContext) -> None:
    """The context's per-slot arrays agree on ``S``: ``data_client [S]``, neighbor lists
    ``[S, K]``, ``is_target [S]``, ``num_samples [S]`` (and ``adjacency [S, S]`` if set)."""
    if not isinstance(ctx, RoundContext):
        raise ValueError(f"ctx must be a RoundContext; got {type(ctx).__name__}")
    check_shape("ctx.data_client", ctx.data_client, (None,))
    s = ctx.num_slots
    check_lists(ctx.neighbors, ctx.neighbor_mask, s)
    if ctx.adjacency is not None:
        check_shape("ctx.adjacency", ctx.adjacency, (s, s))
    check_shape("ctx.is_target", ctx.is_target, (s,))
    check_shape("ctx.num_samples", ctx.num_samples, (s,))


def init_clients(key: jax.Array, ctx: RoundContext, *, same_init: bool = True) -> ClientState:
    """The stacked ``ClientState`` ``[S, ...]`` of every slot (one shared initial model by
    default, as FL does, ``ctx.model.init(key)``, or ``ctx.init_params`` where the runner has
    computed it already); checks the context's shapes first."""
    check_context(ctx)
    if same_init and ctx.init_params is not None:
        params = broadcast_slots(ctx.init_params, ctx.num_slots)
        return ClientState(params, jax.vmap(ctx.tx.init)(params))
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
    slot_ids: Any = None,
) -> tuple[ClientState, dict[str, jax.Array]]:
    """The engine's ``local_train`` of ``clients [P, ...]`` with the context's model and data.

    Args:
      data_client: ``[P]`` data client each model trains on (default ``ctx.data_client``, so
        ``P = S``); e.g. pFedWN trains its EM components on their target's data.
      epochs, num_steps: the schedule; by default the context's (``ctx.num_steps`` steps if
        set, else ``ctx.local_epochs`` epochs). At most one of them may be given.
      loss_fn, grad_fn, aux, sample_weight, active: the update rule (see ``local_train``).
      slot_ids: ``[P]`` the numbers the models' randomness is keyed with (``local_train``;
        default ``0 .. P - 1``): a chunk of a larger set gives its models' ids in the set.

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
        slot_ids=slot_ids,
        shards=ctx.shards,
    )


def group_average_weights(neighbors: Any, neighbor_mask: Any, weights: Any) -> jax.Array:
    """Row-stochastic ``[S, K]`` weights averaging each row's neighbor list with ``weights [S]``.

    ``out[s, k] = mask[s, k] weights[nbr[s, k]] / sum_k' mask[s, k'] weights[nbr[s, k']]``:
    FedAvg over slot ``s``'s group with sample-count weights, for ``mix_sparse``. A row whose
    weights sum to 0 keeps its own model (weight 1 on column 0). The sparse form of
    ``group_average_matrix``: ``out[s, k] = matrix[s, nbr[s, k]]`` on real entries.
    """
    check_shape("neighbors", neighbors, (None, None), "[S, K]")
    s, k = np.shape(neighbors)
    check_shape("neighbor_mask", neighbor_mask, (s, k), "[S, K]")
    check_shape("weights", weights, (None,), "[S]")
    w = jnp.asarray(weights, jnp.float32)[jnp.asarray(neighbors)]
    w = jnp.where(jnp.asarray(neighbor_mask, bool), w, 0.0)
    total = w.sum(axis=1, keepdims=True)
    own = (jnp.arange(k) == 0).astype(jnp.float32)[None, :]
    return jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), own)


def group_average_matrix(adjacency: jax.Array, weights: jax.Array) -> jax.Array:
    """Row-stochastic ``[S, S]`` matrix averaging each row's neighborhood with ``weights [S]``.

    ``out[i, j] = adjacency[i, j] * weights[j] / sum_k adjacency[i, k] * weights[k]``: FedAvg
    over slot ``i``'s group with sample-count weights. A row whose weights sum to 0 keeps its
    own model (identity row). Dense (O(S^2)): for small networks and tests; the algorithms
    use ``group_average_weights``.
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


def state_records(**fields: str) -> Callable[..., dict[str, jax.Array]]:
    """A records function: ``train_loss [S]`` and, per ``name=attr``, ``state.<attr>``."""

    def records(state: Any, ctx: RoundContext, hp: Any) -> dict[str, jax.Array]:
        return {
            **train_loss_record(state, ctx, hp),
            **{k: getattr(state, a) for k, a in fields.items()},
        }

    return records


def baseline_algorithm(**fields: Any) -> Algorithm:
    """An ``Algorithm`` of a method that keeps one model per slot: ``init_baseline``,
    ``eval_own`` and ``train_loss_record`` unless ``fields`` name others."""
    defaults = {"init": init_baseline, "eval_params": eval_own, "records": train_loss_record}
    return Algorithm(**{**defaults, **fields})


def neighbor_models(params: Any, ctx: RoundContext) -> tuple[Any, jax.Array]:
    """``(pool, index [S, K])``: the model of list entry ``(s, k)`` is ``pool[index[s, k]]``.

    ``params [S, ...]`` are the models the slots send this round; the round returns them as
    its ``sent``. Without stale links this is ``(params, ctx.neighbors)`` itself. With
    ``stale=True`` (``runner.links``) the pool is ``concat(params, cache)`` (``[S + S K,
    ...]``, the last model received over each link) and a failed link points into the cache.
    Every algorithm reads its neighbors' models through this (``mix_sparse(pool, index,
    weights)``, ``neighbor_distances``), once per round.
    """
    links = getattr(ctx, "links", None)
    if links is None or getattr(links, "cache", None) is None:
        return params, jnp.asarray(ctx.neighbors)  # inside a round: already a jax array
    return append_slots(params, links.cache), links.source


def append_slots(params: Any, extra: Any) -> Any:
    """``params [S, ...]`` followed by ``extra [E, ...]`` (cast to params' dtypes), leaf by
    leaf: a pool ``[S + E, ...]`` for ``mix_sparse`` indices."""
    return jax.tree.map(lambda p, e: jnp.concatenate([p, e.astype(p.dtype)]), params, extra)


def neighbor_distances(
    params: Any,
    pool: Any,
    index: jax.Array,
    *,
    shards: int | None = 1,
    chunk: int | None = None,
) -> jax.Array:
    """``[S, K]`` float32 ``||params[s] - pool[index[s, k]]||^2`` (``neighbor_models``'
    pool): the engine's ``neighbor_sq_dist``, over chunks of ``chunk`` targets (None: the
    engine's ``block_size``); the result does not depend on the chunk."""
    return neighbor_sq_dist(params, index, pool=pool, shards=shards, chunk=chunk)


def average_in_groups(clients: ClientState, ctx: RoundContext) -> ClientState:
    """Replace each slot's params by its group's sample-weighted mean (optimizer state kept)."""
    weights = group_average_weights(ctx.neighbors, ctx.neighbor_mask, ctx.num_samples)
    pool, index = neighbor_models(clients.params, ctx)
    return clients._replace(params=mix_sparse(pool, index, weights, shards=ctx.shards))


def train_then_average(
    state: BaselineState, key: jax.Array, ctx: RoundContext, **train_kwargs: Any
) -> tuple[BaselineState, Any]:
    """FedAvg's round: ``local_update(..., **train_kwargs)``, then group averaging; returns
    ``(state, sent)`` (``sent``: the trained models the group averaged)."""
    clients, metrics = local_update(ctx, state.clients, key, **train_kwargs)
    return BaselineState(average_in_groups(clients, ctx), metrics["loss"]), clients.params


def sq_norm_diff(params: Any, anchor: Any) -> jax.Array:
    """``||params - anchor||^2`` summed over every leaf of one client's pytree."""
    leaves = jax.tree.leaves(jax.tree.map(lambda p, a: jnp.sum(jnp.square(p - a)), params, anchor))
    return sum(leaves, jnp.zeros((), jnp.float32))


def proximal_loss(base_loss: Callable[..., jax.Array], mu: float) -> Callable[..., jax.Array]:
    """``loss_fn(params, x, y, w, anchor) = base_loss(...) + mu/2 ||params - anchor||^2``."""

    def loss_fn(params, x, y, w, anchor):
        return base_loss(params, x, y, w, anchor) + 0.5 * mu * sq_norm_diff(params, anchor)

    return loss_fn


def check_sgd(ctx: RoundContext, name: str) -> None:
    """Raise a ValueError unless the context trains with its own SGD (``lr``): a method whose
    update rule needs the learning rate (SCAFFOLD's option II, APFL's clipped mixing weight)."""
    if ctx.optimizer is not None or ctx.lr is None:
        raise ValueError(f"{name} needs the context's SGD learning rate `lr`, not an optimizer")
