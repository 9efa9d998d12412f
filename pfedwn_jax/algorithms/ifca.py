"""IFCA, the iterative federated clustering algorithm (Ghosh, Chung, Yin and Ramchandran
2020, NeurIPS), over each node's neighbor list instead of a server.

Every node ``s`` holds ``k`` cluster models ``theta_s^1 .. theta_s^k`` (one initial model per
cluster, shared by all nodes). Round ``t``::

    c_s          = argmin_j  F_s(theta_s^j)            (loss on s's training data)
    theta~_s     = local training of theta_s^{c_s}
    theta_s^j   <- sum_{i in N_s, c_i = j} n_i theta~_i / sum_{i in N_s, c_i = j} n_i
                   (kept when no node of N_s chose j)

``N_s`` is ``s`` and the listed neighbors whose model arrived (their choice ``c_i`` rides
with the model); ``n_i`` the sample counts (IFCA's model-averaging option, the
server's average, here each node's own over its neighborhood). A node is evaluated with
the model of the cluster it joined. With one cluster this is FedAvg.

**Lost packets.** A model that did not arrive is not averaged (the others are renormalised);
a stale copy of a failed link is not used either (the cluster it was trained for is that of
an earlier round). A node that hears no one averages its own model only.

**Departures.** No server: each node averages over its neighborhood, so in network mode the
nodes' copies of cluster ``j`` differ. The paper's random restarts of the initial models
are not made.

Hyperparameters: ``clusters`` k (static; default 2, our choice: the paper sets k to the
number of underlying distributions, 2 to 4 in its experiments).

Records: ``train_loss [S]``, ``cluster [S]`` int32 the cluster each node joined.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_int
from pfedwn_jax.algorithms.base import RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import (
    baseline_algorithm,
    group_average_weights,
    init_clients,
    local_update,
    state_records,
)
from pfedwn_jax.algorithms.mixing import fresh_mask, gossip
from pfedwn_jax.algorithms.phases import Phase, Sizes, baseline
from pfedwn_jax.engine import ClientState, broadcast_slots, evaluate, where_slots


@hparams(name="ifca")
class IFCAHParams:
    """IFCA hyperparameters.

    Attributes:
      clusters: the number k of cluster models (>= 1). Default 2. Static.
    """

    clusters: int = checked(2, check_int, 1, static=True)


class IFCAState(NamedTuple):
    """Attributes: ``clients`` (``params``: the joined cluster's model ``[S, ...]``;
    optimizer state), ``models`` every node's cluster models ``[S, k, ...]``, ``cluster [S]``
    int32 the cluster joined, ``train_loss [S]``."""

    clients: ClientState
    models: Any
    cluster: jax.Array
    train_loss: jax.Array


def cluster_model(models: Any, j: Any) -> Any:
    """``[S, ...]`` every node's model of cluster ``j`` (an int or ``[S]`` ints)."""
    j = jnp.broadcast_to(jnp.asarray(j, jnp.int32), jax.tree.leaves(models)[0].shape[:1])
    return jax.tree.map(
        lambda a: jnp.take_along_axis(a, j.reshape((-1, 1) + (1,) * (a.ndim - 2)), 1)[:, 0], models
    )


def _init(key: jax.Array, ctx: RoundContext, hp: IFCAHParams) -> IFCAState:
    clients = init_clients(key, ctx)  # cluster 0: the shared initial model
    s = ctx.num_slots
    others = [
        broadcast_slots(ctx.model.init(jax.random.fold_in(key, j)), s)
        for j in range(1, hp.clusters)
    ]
    models = jax.tree.map(lambda *a: jnp.stack(a, axis=1), clients.params, *others)
    zeros = jnp.zeros((s,), jnp.int32)
    return IFCAState(clients, models, zeros, jnp.zeros((s,), jnp.float32))


def _round(
    state: IFCAState, key: jax.Array, ctx: RoundContext, hp: IFCAHParams
) -> tuple[IFCAState, Any]:
    losses = jnp.stack(
        [
            evaluate(ctx.model, cluster_model(state.models, j), ctx.train, ctx.data_client)["loss"]
            for j in range(hp.clusters)
        ],
        axis=1,
    )  # [S, k]
    choice = jnp.argmin(losses, axis=1).astype(jnp.int32)
    start = state.clients._replace(params=cluster_model(state.models, choice))
    trained, metrics = local_update(ctx, start, key)
    heard = fresh_mask(ctx)
    nbr = jnp.asarray(ctx.neighbors)
    columns = []
    for j in range(hp.clusters):
        in_j = heard & (choice[nbr] == j)
        weights = group_average_weights(nbr, in_j, ctx.num_samples)
        mixed = gossip(trained.params, ctx, weights)
        anyone = in_j.any(axis=1)
        columns.append(where_slots(anyone, mixed, cluster_model(state.models, j)))
    models = jax.tree.map(lambda *a: jnp.stack(a, axis=1), *columns)
    clients = trained._replace(params=cluster_model(models, choice))
    return IFCAState(clients, models, choice, metrics["loss"]), trained.params


def memory_phases(sz: Sizes, hp: IFCAHParams) -> list[Phase]:
    """The baseline's phases and the clusters' round: each cluster's model gathered for its
    losses, the k mixed columns and their stack, the joined models, ``[S, ...]`` each
    (measured: a run at 10,000 logistic-regression nodes, k = 2, held about 5.7 models'
    worth of every slot beyond its state)."""
    copies = (2 * hp.clusters + 2) * sz.slots * sz.param
    return [*baseline(sz, hp), Phase("IFCA clusters", copies, 0)]


IFCA = register(
    baseline_algorithm(
        name="ifca",
        hparams=IFCAHParams,
        init=_init,
        round=_round,
        records=state_records(cluster="cluster"),
        memory_phases=memory_phases,
        description="IFCA: k cluster models, each node joins the one of lowest loss on its data",
        family="clustered",
        default=False,
    )
)
