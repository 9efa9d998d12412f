"""CFL, clustered federated learning (Sattler, Mueller and Samek 2021, IEEE TNNLS): split a
cluster in two by the cosine similarity of its members' updates once its mean update stalls.

Every node ``i`` belongs to a cluster ``c(i)`` (all in one at the start). Round ``t``::

    dtheta_i   = local training of theta_i  -  theta_i
    a cluster c with |c| > 2, round >= warmup,
        || mean_{i in c} dtheta_i || < eps1  and  max_{i in c} || dtheta_i || > eps2
    is split in two: complete-linkage agglomerative clustering of its members on the cosine
    similarities alpha_ij = <dtheta_i, dtheta_j> / (||dtheta_i|| ||dtheta_j||)
    theta_i  <-  mean of the trained models of the nodes j in N_i with c(j) = c(i)

(the authors' code: unweighted means; in single-target mode every node hears every other, so
the last line is the server's cluster update ``theta_c + mean dtheta``). ``N_i``: ``i`` and
the listed neighbors whose model arrived this round.

**Lost packets.** A model that did not arrive is not averaged (a stale copy neither: it was
trained in an earlier round); a node that hears nobody of its cluster keeps its trained model.

**Departures.** The cluster statistics and the split use every member's update, a server's
view (in network mode a global one: the nodes' clusters span the network), from the dense
``[S, S]`` similarities: only up to ``SPLIT_LIMIT`` slots (above, clusters never split and
CFL is a cluster-restricted gossip average). At most one cluster splits per round (the
eligible one of largest max update norm; the paper splits every eligible cluster). The
paper's model cache and its per-cluster learning-rate details are not built.

Hyperparameters (the authors' code defaults): ``eps1 = 0.4``, ``eps2 = 1.6``,
``warmup = 20`` rounds before the first split. Records: ``train_loss [S]``, ``cluster [S]``
(each cluster labelled by its smallest slot).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_float, check_int
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
from pfedwn_jax.engine import ClientState, flatten_slots

#: Most slots whose clusters CFL splits (the dense similarities and an O(S^3) clustering).
SPLIT_LIMIT = 1024


@hparams(name="cfl")
class CFLHParams:
    """CFL hyperparameters (the authors' code's defaults).

    Attributes:
      eps1: a cluster's mean update norm below which it has stalled (>= 0). Default 0.4.
      eps2: a member's update norm above which the stall is not a common optimum (>= 0).
        Default 1.6.
      warmup: rounds before the first split (>= 0). Default 20.
    """

    eps1: float = checked(0.4, check_float, 0.0)
    eps2: float = checked(1.6, check_float, 0.0)
    warmup: int = checked(20, check_int, 0)


class CFLState(NamedTuple):
    """Attributes: ``clients`` (models ``[S, ...]``), ``cluster [S]`` int32 (the smallest
    slot of each cluster), ``round [] int32`` rounds done, ``train_loss [S]``."""

    clients: ClientState
    cluster: jax.Array
    round: jax.Array
    train_loss: jax.Array


def _init(key: jax.Array, ctx: RoundContext, hp: CFLHParams) -> CFLState:
    s = ctx.num_slots
    zeros = jnp.zeros((s,), jnp.int32)
    return CFLState(init_clients(key, ctx), zeros, jnp.zeros((), jnp.int32), zeros.astype(float))


def bipartition(similarity: jax.Array, members: jax.Array) -> jax.Array:
    """``[S]`` bool: the second part of complete-linkage agglomerative clustering into two of
    the ``members [S]`` on ``similarity [S, S]`` (dissimilarity ``-similarity``): merges the
    closest pair of clusters until two remain. Non-members: False."""
    s = similarity.shape[0]
    inf = jnp.float32(jnp.inf)
    pair = members[:, None] & members[None, :] & ~jnp.eye(s, dtype=bool)
    dist = jnp.where(pair, -similarity.astype(jnp.float32), inf)

    def merge(_: int, carry: tuple) -> tuple:
        dist, label, active = carry
        go = active.sum() > 2
        flat = jnp.argmin(dist)
        a, b = jnp.minimum(flat // s, flat % s), jnp.maximum(flat // s, flat % s)
        row = jnp.maximum(dist[a], dist[b]).at[a].set(inf)
        new = dist.at[a, :].set(row).at[:, a].set(row)
        new = new.at[b, :].set(inf).at[:, b].set(inf)
        label2 = jnp.where(label == b, a, label)
        return (
            jnp.where(go, new, dist),
            jnp.where(go, label2, label),
            jnp.where(go, active.at[b].set(False), active),
        )

    start = (dist, jnp.arange(s), members)
    _, label, _ = jax.lax.fori_loop(0, s, merge, start)
    first = jnp.argmax(members)  # the smallest member: its part is the first
    return members & (label != label[first])


def _split(state: CFLState, delta: jax.Array, hp: CFLHParams, real: jax.Array) -> jax.Array:
    """The clusters ``[S]`` after this round's split (at most one), updates ``delta [S, P]``."""
    s, label = delta.shape[0], state.cluster
    count = jax.ops.segment_sum(real.astype(jnp.float32), label, num_segments=s)
    mean = jax.ops.segment_sum(delta, label, num_segments=s) / jnp.maximum(count, 1)[:, None]
    norms = jnp.linalg.norm(delta, axis=1)
    top = jax.ops.segment_max(jnp.where(real, norms, 0.0), label, num_segments=s)
    ok = (count > 2) & (jnp.linalg.norm(mean, axis=1) < hp.eps1) & (top > hp.eps2)
    ok = ok & (state.round + 1 > hp.warmup)
    chosen = jnp.argmax(jnp.where(ok, top, -1.0))
    unit = delta / jnp.maximum(norms, 1e-30)[:, None]
    second = bipartition(unit @ unit.T, (label == chosen) & real)
    rows = jnp.arange(s)
    new_label = jnp.min(jnp.where(second, rows, s))
    return jnp.where(ok.any() & second, new_label, label).astype(jnp.int32)


def _round(
    state: CFLState, key: jax.Array, ctx: RoundContext, hp: CFLHParams
) -> tuple[CFLState, Any]:
    trained, metrics = local_update(ctx, state.clients, key)
    cluster = state.cluster
    if ctx.num_slots <= SPLIT_LIMIT:
        delta = flatten_slots(trained.params) - flatten_slots(state.clients.params)
        real = jnp.asarray(ctx.num_samples) > 0
        cluster = _split(state, delta.astype(jnp.float32), hp, real)
    nbr = jnp.asarray(ctx.neighbors)
    same = fresh_mask(ctx) & (cluster[nbr] == cluster[:, None])
    weights = group_average_weights(nbr, same, jnp.ones((ctx.num_slots,), jnp.float32))
    clients = trained._replace(params=gossip(trained.params, ctx, weights))
    return CFLState(clients, cluster, state.round + 1, metrics["loss"]), trained.params


def memory_phases(sz: Sizes, hp: Any) -> list[Phase]:
    """The baseline's phases and, up to `SPLIT_LIMIT` slots (above, no split is traced), the
    split: the trained and start models flattened, their difference, the clusters' mean
    update and the unit updates (`[S, P]` float32 each), and the `[S, S]` cosine
    similarities with the linkage's copies."""
    if sz.slots > SPLIT_LIMIT:
        return baseline(sz, hp)
    split = Phase("CFL split", 0, 5 * sz.slots * sz.param + 3 * 4 * sz.slots**2)
    return [*baseline(sz, hp), split]


CFL = register(
    baseline_algorithm(
        name="cfl",
        hparams=CFLHParams,
        init=_init,
        round=_round,
        records=state_records(cluster="cluster"),
        description="CFL: split a stalled cluster by the cosine similarity of its updates",
        family="clustered",
        default=False,
        memory_phases=memory_phases,
    )
)
