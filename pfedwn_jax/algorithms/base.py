"""The algorithm interface: an FL method is data (a few pure functions), registered by name.

Conventions every algorithm follows (the runner relies on them):

**Slots and the federation.** A federation has ``S`` model slots. Slot ``s`` trains on data
client ``ctx.data_client[s]``. ``ctx.adjacency[i, j]`` (bool ``[S, S]``, diagonal True) says that
slot ``i`` receives slot ``j``'s model each round; an algorithm may only combine models along
adjacency rows. ``ctx.is_target[s]`` marks the slots whose metrics are reported as "target".
Single-target mode: slot 0 is the target, slots 1.. its selected neighbors, adjacency is all
True (the paper trains every baseline inside the target's group). Network-wide mode: every
client is a slot and a target; row ``i`` is client ``i`` plus its own selected neighbors.
The same algorithm code serves both: never special-case slot 0, use ``adjacency``/``is_target``.

**Functions** (all pure; ``round``, ``eval_params`` and ``records`` must be jittable):

- ``init(key, ctx, hp) -> state``: the initial state, a NamedTuple pytree of arrays with a
  leading slot axis where per-slot (use ``init_clients`` for the stacked ``ClientState``: one
  shared initial model, as FL does). Everything an algorithm needs across rounds (round
  counter, pi, anchors) lives in the state, so a checkpoint of the state is a complete resume
  point. Do not keep Python scalars in the state: every leaf must be an array.
- ``round(state, key, ctx, hp) -> state``: one communication round (local training plus
  aggregation, in the algorithm's order). ``key`` is fresh per round.
- ``eval_params(state, ctx, hp) -> params [S, ...]``: the personalised model each slot is
  evaluated with on its own data client's test split (after every round).
- ``records(state, ctx, hp) -> dict[str, array]`` or ``None``: extra per-round values (e.g.
  pFedWN's ``pi [S, S]``). The runner calls it after every round (inside the same compiled
  step) and stores ``Result.methods[name]["records"][key]`` as a list over rounds of nested
  lists (``array.tolist()``), so any fixed-shape float/int array works.

**Hyperparameters.** ``Algorithm.hparams`` is a frozen dataclass whose fields all have defaults
(documented in its docstring with their source). It validates itself in ``__post_init__``
with ``pfedwn_jax._checks`` and field names as the config spells them, e.g.
``"hparams.fedprox.mu"``, and stores the normalised values (``2.0 -> 2``).
The runner builds it with ``make_hparams(alg, overrides)`` from the config's
``hparams[name]`` dict (unknown keys are a ValueError listing the fields). The instance is
hashable and is closed over (static) when the round is compiled.

**Registration.** A module defines its ``Algorithm`` and calls ``register(ALG)`` at import;
``pfedwn_jax.algorithms`` imports every algorithm module, so ``get_algorithm(name)`` sees them.

**Training.** No algorithm copies the training loop: call ``local_update(ctx, clients, key,
...)`` (the engine's ``local_train`` with the context filled in) and differ only in the update
rule: aggregation matrix (``group_average_matrix``, ``pfedwn_jax.engine.tree.mix``), objective
(``loss_fn`` + ``aux``), gradient (``grad_fn``), ``sample_weight``, ``active``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pfedwn_jax.data.client_data import ClientData


class RoundContext(NamedTuple):
    """Everything fixed for one experiment that a round needs (built once by the runner).

    A pytree: the array fields are its leaves, the static fields (``model``, ``optimizer``,
    ``batch_size``, ``local_epochs``, ``num_steps``) ride in the tree definition, so a context
    can be passed as an argument to ``jax.jit``-compiled functions.

    Attributes:
      model: the engine's ``Model`` (name, init, apply). Static.
      optimizer: an ``optax.GradientTransformation`` for local training. Static.
      train: training ``ClientData`` of every *data* client ``[clients, samples, ...]``.
      data_client: ``[S]`` int32, slot -> data client row of ``train`` (and of the test split).
      adjacency: ``[S, S]`` bool, ``adjacency[i, j]``: slot ``i`` receives slot ``j``'s model.
      is_target: ``[S]`` bool, slots reported as targets.
      num_samples: ``[S]`` float32, training samples of each slot's data client.
      batch_size: local minibatch size. Static.
      local_epochs: local epochs per round. Static.
      num_steps: if not None, local SGD steps per round instead of epochs. Static.
      shards: devices the slots are split over in local training (``engine.sharding``);
        None: every device of the default backend. Static.
    """

    model: Any
    optimizer: Any
    train: ClientData
    data_client: jax.Array
    adjacency: jax.Array
    is_target: jax.Array
    num_samples: jax.Array
    batch_size: int
    local_epochs: int = 1
    num_steps: int | None = None
    shards: int | None = None

    @property
    def num_slots(self) -> int:
        return int(self.data_client.shape[0])


_STATIC = ("model", "optimizer", "batch_size", "local_epochs", "num_steps", "shards")
_DYNAMIC = ("train", "data_client", "adjacency", "is_target", "num_samples")


def _ctx_flatten(ctx: RoundContext):
    children = tuple(getattr(ctx, f) for f in _DYNAMIC)
    aux = tuple(getattr(ctx, f) for f in _STATIC)
    return children, aux


def _ctx_unflatten(aux, children) -> RoundContext:
    return RoundContext(
        **dict(zip(_STATIC, aux, strict=True)), **dict(zip(_DYNAMIC, children, strict=True))
    )


jax.tree_util.register_pytree_node(RoundContext, _ctx_flatten, _ctx_unflatten)


class Algorithm(NamedTuple):
    """A registered FL method: data, not a class hierarchy. See the module docstring."""

    name: str
    hparams: type
    init: Callable[..., Any]  # (key, ctx, hp) -> state
    round: Callable[..., Any]  # (state, key, ctx, hp) -> state
    eval_params: Callable[..., Any]  # (state, ctx, hp) -> params [S, ...]
    records: Callable[..., dict[str, jax.Array]] | None = None  # (state, ctx, hp) -> dict
    description: str = ""


@dataclasses.dataclass(frozen=True)
class NoHParams:
    """Hyperparameters of a method that has none beyond the shared training settings."""


_REGISTRY: dict[str, Algorithm] = {}


def register(alg: Algorithm) -> Algorithm:
    """Add ``alg`` to the registry (idempotent for the same object; a clash is an error)."""
    if not isinstance(alg, Algorithm):
        raise TypeError(f"register expects an Algorithm, got {type(alg).__name__}")
    if not dataclasses.is_dataclass(alg.hparams):
        raise TypeError(f"{alg.name}: hparams must be a dataclass type")
    old = _REGISTRY.get(alg.name)
    if old is not None and old is not alg:
        raise ValueError(f"algorithm {alg.name!r} is already registered")
    _REGISTRY[alg.name] = alg
    return alg


def available_algorithms() -> tuple[str, ...]:
    """Names of the registered algorithms, in registration order."""
    return tuple(_REGISTRY)


def get_algorithm(name: str) -> Algorithm:
    """The registered algorithm ``name``; a ValueError lists the available ones otherwise."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"algorithm must be one of {list(_REGISTRY)}; got {name!r}") from None


def make_hparams(alg: Algorithm, overrides: Mapping[str, Any] | None = None) -> Any:
    """Build ``alg``'s hyperparameter dataclass from defaults plus ``overrides``.

    Unknown keys raise a ValueError naming the algorithm and listing its fields; the
    dataclass's own ``__post_init__`` validates the values.
    """
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ValueError(
            f"hparams.{alg.name} must be a table of {alg.name}'s hyperparameters, e.g. "
            f"{{field = value}}; got {overrides!r}"
        )
    overrides = dict(overrides or {})
    fields = [f.name for f in dataclasses.fields(alg.hparams)]
    unknown = sorted(set(overrides) - set(fields), key=repr)
    if unknown:
        raise ValueError(f"hparams.{alg.name}: unknown field(s) {unknown}; allowed: {fields}")
    return alg.hparams(**overrides)


def hparams_dict(hp: Any) -> dict[str, Any]:
    """A JSON-friendly dict of a hyperparameter dataclass."""
    return dataclasses.asdict(hp)


# ---------------------------------------------------------------------------------------------
# Helpers shared by the algorithms (pure, jittable).


def init_clients(key: jax.Array, ctx: RoundContext, *, same_init: bool = True):
    """The stacked ``ClientState`` for every slot (one shared initial model by default)."""
    from pfedwn_jax.engine import init_client_state

    return init_client_state(ctx.model, ctx.optimizer, key, ctx.num_slots, same_init=same_init)


def local_update(ctx: RoundContext, clients, key: jax.Array, **kwargs):
    """The engine's ``local_train`` on every slot with the context's model, data and settings.

    ``kwargs`` go to ``local_train`` (``loss_fn``, ``grad_fn``, ``aux``, ``sample_weight``,
    ``active``, ``strategy``...). Returns ``(ClientState, metrics)``.
    """
    from pfedwn_jax.engine import local_train

    if ctx.num_steps is not None:
        kwargs.setdefault("num_steps", ctx.num_steps)
    kwargs.setdefault("shards", ctx.shards)
    return local_train(
        ctx.model,
        ctx.optimizer,
        clients,
        ctx.train,
        ctx.data_client,
        key,
        batch_size=ctx.batch_size,
        epochs=ctx.local_epochs,
        **kwargs,
    )


def group_average_matrix(adjacency: jax.Array, weights: jax.Array) -> jax.Array:
    """Row-stochastic ``[S, S]`` matrix averaging each row's neighborhood with ``weights [S]``.

    ``out[i, j] = adjacency[i, j] * weights[j] / sum_k adjacency[i, k] * weights[k]``: FedAvg
    over slot ``i``'s group with sample-count weights. A row whose weights sum to 0 keeps its
    own model (identity row).
    """
    w = jnp.where(adjacency, weights[None, :].astype(jnp.float32), 0.0)
    total = w.sum(axis=1, keepdims=True)
    eye = jnp.eye(adjacency.shape[0], dtype=w.dtype)
    return jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), eye)
