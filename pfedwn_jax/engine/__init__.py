"""The vectorized training engine: every model slot in one stacked pytree (leading axis S)."""

from pfedwn_jax.engine.batches import slot_batches
from pfedwn_jax.engine.evaluate import cross_evaluate, evaluate
from pfedwn_jax.engine.losses import default_loss, per_sample_ce, weighted_ce
from pfedwn_jax.engine.sharding import (
    constrain_slots,
    put_slots,
    replicate,
    resolve_shards,
    shard_slots,
)
from pfedwn_jax.engine.state import ClientState, init_client_state
from pfedwn_jax.engine.strategy import resolve_strategy
from pfedwn_jax.engine.train import local_train
from pfedwn_jax.engine.tree import (
    broadcast_slots,
    check_neighbors,
    flatten_slots,
    mix,
    mix_sparse,
    neighbor_sq_dist,
    num_slots_of,
    sq_dist,
    take_slots,
    where_slots,
)

__all__ = [
    "ClientState",
    "broadcast_slots",
    "check_neighbors",
    "constrain_slots",
    "cross_evaluate",
    "default_loss",
    "evaluate",
    "flatten_slots",
    "init_client_state",
    "local_train",
    "mix",
    "mix_sparse",
    "neighbor_sq_dist",
    "num_slots_of",
    "per_sample_ce",
    "put_slots",
    "replicate",
    "resolve_shards",
    "resolve_strategy",
    "shard_slots",
    "slot_batches",
    "sq_dist",
    "take_slots",
    "weighted_ce",
    "where_slots",
]
