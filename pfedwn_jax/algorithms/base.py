"""The algorithm interface: an FL method is data (a few pure functions), registered by name.

Conventions every algorithm follows (the runner relies on them):

**Slots and the federation.** A federation has ``S`` model slots. Slot ``s`` trains on data
client ``ctx.data_client[s]``. Who receives whom is a neighbor list (sparse, O(S K)):
``ctx.neighbors [S, K]`` int32 and ``ctx.neighbor_mask [S, K]`` bool; row ``s`` lists the slots
whose models slot ``s`` receives each round: column 0 is ``s`` itself (mask True), then its
neighbors in increasing slot order, then padding (index ``s``, mask False); ``K`` is the
largest in-degree + 1. An algorithm may only combine models along these rows, by a gather and
a weighted sum (``pfedwn_jax.engine.mix_sparse``); it must not read ``ctx.adjacency`` (a
derived dense ``[S, S]`` view for small networks, None for large ones; ``neighbor_lists`` /
``dense_adjacency`` convert). ``ctx.is_target[s]`` marks the slots whose metrics are reported
as "target". Single-target mode: slot 0 is the target, slots 1.. its selected neighbors, every
slot receives every other (the paper trains every baseline inside the target's group).
Network-wide mode: every client is a slot and a target; row ``i`` is client ``i`` plus its
own selected neighbors. The same algorithm code serves both: never special-case slot 0, use
the neighbor lists and ``is_target``.

**Functions** (all pure; ``round``, ``eval_params`` and ``records`` must be jittable):

- ``init(key, ctx, hp) -> state``: the initial state, a NamedTuple pytree of arrays with a
  leading slot axis where per-slot (use ``init_clients`` for the stacked ``ClientState``: one
  shared initial model, as FL does). Everything an algorithm needs across rounds (round
  counter, pi, anchors) lives in the state, so a checkpoint of the state is a complete resume
  point. Do not keep Python scalars in the state: every leaf must be an array.
- ``round(state, key, ctx, hp) -> (state, sent)``: one communication round (local training
  plus aggregation, in the algorithm's order). ``key`` is fresh per round. ``sent`` is what
  the round produced for others: the models ``[S, ...]`` the slots sent their neighbors (the
  ``params`` given to ``neighbor_models``), or None when nothing is sent (Local). The runner
  keeps a failed link's last delivered copy from it (``stale`` links); nothing leaves a
  round any other way. Where ``sent`` is not shaped as ``eval_params`` (FedEM sends all its
  components), ``Algorithm.sent_params(state, ctx, hp)`` returns something of its shapes.
  With the cost counted, a link carries ``Algorithm.payload_bits`` bits a round (default:
  every parameter of ``sent``; ``pfedwn_jax.algorithms.payload``).
- ``eval_params(state, ctx, hp) -> params [S, ...]``: the personalised model each slot is
  evaluated with on its own data client's test split (after every round).
- ``records(state, ctx, hp) -> dict[str, array]`` or ``None``: extra per-round values (e.g.
  pFedWN's ``pi [S, K]``, columns as in ``ctx.neighbors``). The runner calls it after every
  round (inside the same compiled step) and stores ``Result.methods[name]["records"][key]``
  as a list over rounds of nested lists (``array.tolist()``), so any fixed-shape float/int
  array works.

**Hyperparameters.** ``Algorithm.hparams`` is a class decorated with ``hparams`` (a frozen
dataclass and a pytree) whose fields all have defaults (documented in its docstring with
their source). Its fields are leaves of the compiled round, passed in as arrays (one program
serves every value; a sweep vmaps over them), unless declared ``static(default)``: a value
that changes the program (a loop length, a switch, a mode), part of the tree definition. An
algorithm uses the leaves as numbers (``jnp`` arithmetic, no Python ``if hp.mu == 0``). The
class validates itself in ``__post_init__`` (the built-in ones declare each field's check,
``checked(default, check_float, 0.0)``, a ``pfedwn_jax._checks`` function, and the decorator
``hparams(name=...)`` runs them) with field names as the config spells them, e.g.
``"hparams.fedprox.mu"``, and stores the normalised values (``2.0 -> 2``); a tree rebuilt
from leaves is not validated again. The runner builds it with
``make_hparams(alg, overrides)`` from the config's ``hparams[name]`` dict (unknown keys are a
ValueError listing the fields).

**Registration.** A module defines its ``Algorithm`` and calls ``register(ALG)`` at import;
``pfedwn_jax.algorithms`` imports every built-in algorithm module, so ``get_algorithm(name)``
sees them. ``unregister(name)`` removes one again (e.g. a user's algorithm after a test).
``docs/algorithms.md`` has a worked example of a user's own algorithm.

**Training.** No algorithm copies the training loop: every local training goes through
``local_update(ctx, clients, key, ...)`` (``pfedwn_jax.algorithms.common``: the engine's
``local_train`` with the context filled in), and algorithms differ only in the update rule:
aggregation weights (``group_average_weights``, ``pfedwn_jax.engine.mix_sparse``), objective
(``loss_fn`` + ``aux``), gradient (``grad_fn``), ``sample_weight``, ``active``, schedule
(``epochs`` / ``num_steps``) and which data each slot trains on (``data_client``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from pfedwn_jax._checks import check_shape, set_fields
from pfedwn_jax.data.client_data import ClientData


def neighbor_lists(adjacency: Any) -> tuple[np.ndarray, np.ndarray]:
    """Neighbor lists of a dense ``adjacency [S, S]`` (host, NumPy): ``(neighbors, mask)``.

    ``neighbors [S, K]`` int32: row ``s`` is ``s`` itself, then every ``j != s`` with
    ``adjacency[s, j]`` in increasing order, then padding ``s``; ``mask [S, K]`` bool, True on
    the real entries. ``K`` = the largest row degree (without the diagonal) + 1. The
    diagonal is implied: a slot always holds its own model.
    """
    adj = np.asarray(adjacency)
    check_shape("adjacency", adj, (None, None))
    s = adj.shape[0]
    check_shape("adjacency", adj, (s, s))
    if adj.dtype.kind != "b":
        raise ValueError(f"adjacency must be a bool [S, S] matrix; got dtype {adj.dtype}")
    off = adj & ~np.eye(s, dtype=bool)
    degree = off.sum(axis=1)
    k = int(degree.max(initial=0)) + 1
    neighbors = np.repeat(np.arange(s, dtype=np.int32)[:, None], k, axis=1)
    mask = np.zeros((s, k), bool)
    mask[:, 0] = True
    rows, cols = np.nonzero(off)  # row-major: each row's neighbors in increasing order
    first = np.repeat(np.cumsum(degree) - degree, degree)  # index of each row's first edge
    pos = 1 + np.arange(rows.size) - first
    neighbors[rows, pos] = cols
    mask[rows, pos] = True
    return neighbors, mask


def dense_adjacency(neighbors: Any, neighbor_mask: Any, num_slots: int) -> jax.Array:
    """The dense ``[S_out, num_slots]`` bool view of neighbor lists ``[S_out, K]``:
    ``out[s, neighbors[s, k]]`` is True where ``neighbor_mask[s, k]`` (jittable)."""
    neighbors = jnp.asarray(neighbors)
    mask = jnp.asarray(neighbor_mask, bool)
    check_shape("neighbor_mask", mask, neighbors.shape)
    rows = jnp.broadcast_to(jnp.arange(neighbors.shape[0])[:, None], neighbors.shape)
    cols = jnp.where(mask, neighbors, num_slots)  # out of bounds: dropped
    out = jnp.zeros((neighbors.shape[0], num_slots), bool)
    return out.at[rows, cols].set(True, mode="drop")


class RoundContext(flax.struct.PyTreeNode):
    """Everything fixed for one experiment that a round needs (built once by the runner).

    A pytree (a ``flax.struct.PyTreeNode`` dataclass): the array fields are its leaves, the
    static fields (``model``, ``optimizer``, ``batch_size``, ``local_epochs``, ``num_steps``,
    ``shards``) ride in the tree definition, so a context can be passed as an argument to
    ``jax.jit``-compiled functions; a compiled round is reused for any context with equal
    static fields (they must be hashable) and equal array shapes. Change a field with
    ``ctx.replace(shards=...)``.

    Attributes:
      model: the engine's ``Model`` (name, init, apply). Static.
      optimizer: an ``optax.GradientTransformation`` for local training, or None: SGD with
        the ``lr`` and ``momentum`` leaves (see ``tx``). Static.
      train: training ``ClientData`` of every *data* client ``[clients, samples, ...]``.
      data_client: ``[S]`` int32, slot -> data client row of ``train`` (and of the test split).
      neighbors: ``[S, K]`` int32, row ``s``: the slots whose models slot ``s`` receives,
        column 0 = ``s``, then its neighbors in increasing order, then padding (``s``).
      neighbor_mask: ``[S, K]`` bool, True on real entries (column 0 always True).
      is_target: ``[S]`` bool, slots reported as targets.
      num_samples: ``[S]`` float32, training samples of each slot's data client.
      batch_size: local minibatch size. Static.
      local_epochs: local epochs per round. Static.
      num_steps: if not None, local SGD steps per round instead of epochs. Static.
      shards: devices the slots are split over in local training (``engine.sharding``);
        None: every device of the default backend. Static.
      lr: ``[]`` float32 SGD learning rate (used when ``optimizer`` is None). An array, not a
        static, so runs with other learning rates share one compiled program.
      momentum: ``[]`` float32 SGD momentum, or None for plain SGD (no trace in the state).
      links: the experiment's per-round link model (``runner.links.Links``), or None
        (``ideal``: every listed model arrives). Inside a round the runner has already
        restricted ``neighbor_mask`` to the models that arrived; an algorithm that keeps
        weights across rounds (pFedWN's pi) renormalises them over that row when this is set.
      adjacency: ``[S, S]`` bool dense view of the lists (``adjacency[i, j]``: slot ``i``
        receives slot ``j``'s model), or None. Derived, for small networks and tests only: no
        algorithm reads it.
      init_params: the shared initial model ``model.init(init key)`` (one model, no slot
        axis) while the runner initialises a state, else None: computed once for every
        method (``init_clients`` uses it), so no method's init compiles the model's again.
    """

    model: Any = flax.struct.field(pytree_node=False)
    optimizer: Any = flax.struct.field(pytree_node=False)
    train: ClientData
    # host (NumPy) arrays as `experiment.setup` builds them, device arrays once placed
    data_client: jax.Array | np.ndarray
    neighbors: jax.Array | np.ndarray
    neighbor_mask: jax.Array | np.ndarray
    is_target: jax.Array | np.ndarray
    num_samples: jax.Array | np.ndarray
    batch_size: int = flax.struct.field(pytree_node=False)
    local_epochs: int = flax.struct.field(pytree_node=False, default=1)
    num_steps: int | None = flax.struct.field(pytree_node=False, default=None)
    shards: int | None = flax.struct.field(pytree_node=False, default=None)
    lr: Any = None
    momentum: Any = None
    links: Any = None
    adjacency: Any = None
    init_params: Any = None

    @property
    def num_slots(self) -> int:
        return int(self.data_client.shape[0])

    @property
    def tx(self) -> optax.GradientTransformation:
        """The local optimizer: ``optimizer``, or SGD built from the ``lr``/``momentum`` leaves
        (inside a compiled round they are the run's traced values; every ``init`` of an
        optimizer state, EM's scratch models included, gets the same run's settings)."""
        if self.optimizer is not None:
            return self.optimizer
        if self.lr is None:
            raise ValueError("RoundContext needs an optimizer or a learning rate `lr`")
        return optax.sgd(self.lr, momentum=self.momentum)


class Algorithm(NamedTuple):
    """A registered FL method: data, not a class hierarchy. See the module docstring."""

    name: str
    hparams: type
    init: Callable[..., Any]  # (key, ctx, hp) -> state
    round: Callable[..., Any]  # (state, key, ctx, hp) -> (state, sent)
    eval_params: Callable[..., Any]  # (state, ctx, hp) -> params [S, ...]
    records: Callable[..., dict[str, jax.Array]] | None = None  # (state, ctx, hp) -> dict
    description: str = ""
    # (sizes, hp) -> [phases.Phase]: the round's phases for the memory plan; None: baseline
    memory_phases: Callable[..., list] | None = None
    # The method's family (one of FAMILIES, or a user's own name): registry-wide checks run
    # for one representative per family in the quick test tier and for every method in the slow.
    family: str = "other"
    # Whether the method runs when a config names no algorithms (the paper's six and a user's
    # own registered methods do; the package's further methods are named explicitly).
    default: bool = True
    # (state, ctx, hp) -> what a round sends, [S, ...], where its shapes differ from
    # `eval_params`' (FedEM sends all its components): it sizes the stale-link cache.
    # None: the round sends models shaped as `eval_params`.
    sent_params: Callable[..., Any] | None = None
    # (state, ctx, hp) -> [S, K] the round's gossip weights along `ctx.neighbors` over the
    # links it combined (row- or column-stochastic): the engine reports their spectral gap
    # (metric `spectral_gap`). None: the method does not gossip (no such metric).
    mixing_weights: Callable[..., Any] | None = None
    # (state, ctx, hp, value_bits) -> [] or [S] bits each slot sends a listed neighbor in a
    # round (`algorithms.payload`; what the round's cost charges). None: every parameter of
    # what the round sends (`sent_params`, else `eval_params`) at `value_bits` bits.
    payload_bits: Callable[..., Any] | None = None
    # The method's own tuning axis in the comparison table (`reproduce.field`): `(key,
    # (v1, v2))`, a dynamic hyperparameter (as `hparams` spells it) and the two values tried
    # beside two learning rates, from its paper's grid. None: the method has none, and the
    # table tries four learning rates instead (every method gets the same number of points).
    tune: tuple[str, tuple[Any, Any]] | None = None


# The built-in families, in the order docs/algorithms.md lists them.
FAMILIES = (
    "local",
    "traditional",
    "meta-learning",
    "regularized",
    "personalized-aggregation",
    "splitting",
    "mixture",
    "decentralized",
    "clustered",
    "other",
)

_REGISTRY: dict[str, Algorithm] = {}


def register(alg: Algorithm) -> Algorithm:
    """Add ``alg`` to the registry (idempotent for the same object; a clash is an error)."""
    if not isinstance(alg, Algorithm):
        raise TypeError(f"register expects an Algorithm, got {type(alg).__name__}")
    if not dataclasses.is_dataclass(alg.hparams) or not hasattr(alg.hparams, "dynamic_fields"):
        raise TypeError(
            f"{alg.name}: hparams must be a class decorated with pfedwn_jax.algorithms.hparams"
        )
    if not isinstance(alg.family, str) or not alg.family:
        raise ValueError(f"{alg.name}: family must be a non-empty name; got {alg.family!r}")
    _check_tune(alg)
    old = _REGISTRY.get(alg.name)
    if old is not None and old is not alg:
        raise ValueError(f"algorithm {alg.name!r} is already registered")
    _REGISTRY[alg.name] = alg
    return alg


def _check_tune(alg: Algorithm) -> None:
    """`alg.tune`: None or `(key, (v1, v2))`, `key` a dynamic hyperparameter (one program
    serves both values; two: the comparison table's budget)."""
    if alg.tune is None:
        return
    dynamic = dynamic_fields(alg.hparams)
    ok = isinstance(alg.tune, tuple) and len(alg.tune) == 2 and alg.tune[0] in dynamic
    if not ok or not isinstance(alg.tune[1], tuple) or len(alg.tune[1]) != 2:
        raise ValueError(
            f"{alg.name}: tune must be None or (key, (v1, v2)) with key one of its dynamic "
            f"hyperparameters {list(dynamic)}; got {alg.tune!r}"
        )


def unregister(name: str) -> Algorithm:
    """Remove the algorithm ``name`` from the registry and return it (ValueError if absent)."""
    alg = get_algorithm(name)
    del _REGISTRY[name]
    return alg


def available_algorithms() -> tuple[str, ...]:
    """Names of the registered algorithms, in registration order."""
    return tuple(_REGISTRY)


def default_algorithms() -> tuple[str, ...]:
    """Names of the registered algorithms that run when a config names none, in order."""
    return tuple(name for name, alg in _REGISTRY.items() if alg.default)


def family_representatives() -> tuple[str, ...]:
    """The first registered algorithm of each family, in registration order."""
    first: dict[str, str] = {}
    for name, alg in _REGISTRY.items():
        first.setdefault(alg.family, name)
    return tuple(n for n in _REGISTRY if n in first.values())


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


def hparams(cls: type[Any] | None = None, *, name: str | None = None) -> Any:
    """Class decorator of an algorithm's hyperparameters: a frozen dataclass and a pytree.

    Every field is a leaf of the compiled program (one program serves every value, a sweep
    vmaps over them) unless declared ``static(default)``: a choice that changes the program
    (an int loop length, a bool, a string), held in the tree's definition. The leaves must be
    used as numbers (``jnp`` arithmetic, no Python ``if hp.mu == 0``). ``__post_init__``
    validates a user's values; rebuilding the tree from leaves (tracers, stacked arrays) does
    not call it again, so validation never sees a tracer. With ``name`` (the algorithm's),
    ``__post_init__`` runs the ``checked`` fields' checks on ``"hparams.<name>.<field>"``.
    """
    if cls is None:
        return lambda c: hparams(c, name=name)
    if name is not None:
        cls.__post_init__ = _field_checks(name, getattr(cls, "__post_init__", None))
    cls = dataclasses.dataclass(frozen=True)(cls)
    fields = dataclasses.fields(cls)
    data = tuple(f.name for f in fields if f.metadata.get("pytree_node", True))
    meta = tuple(f.name for f in fields if not f.metadata.get("pytree_node", True))

    def flatten(hp: Any) -> tuple[tuple, tuple]:
        children = tuple((jax.tree_util.GetAttrKey(n), getattr(hp, n)) for n in data)
        return children, tuple(getattr(hp, n) for n in meta)

    def unflatten(static: tuple, leaves: Any) -> Any:
        out = object.__new__(cls)
        for name, value in (*zip(meta, static, strict=True), *zip(data, leaves, strict=True)):
            object.__setattr__(out, name, value)
        return out

    jax.tree_util.register_pytree_with_keys(cls, flatten, unflatten)
    cls.dynamic_fields = data
    return cls


def static(default: Any) -> Any:
    """A static field of a ``hparams`` class (or of any ``flax.struct`` dataclass): part of
    the compiled program, not an argument of it."""
    return flax.struct.field(pytree_node=False, default=default)


def checked(
    default: Any, check: Callable[..., Any], *args: Any, static: bool = False, **kw: Any
) -> Any:
    """A field of a ``hparams(name=...)`` class that ``check(field's config name, value, *args,
    **kw)`` validates and normalises; ``static=True``: a static field (``static``)."""
    return flax.struct.field(not static, default=default, metadata={"check": (check, args, kw)})


def _field_checks(name: str, then: Callable[[Any], None] | None) -> Callable[[Any], None]:
    """The ``__post_init__`` of ``hparams(name=name)``: every ``checked`` field's check, then
    the class's own ``__post_init__`` (``then``), if it has one."""

    def __post_init__(self: Any) -> None:
        values = {}
        for f in dataclasses.fields(self):
            if "check" in f.metadata:
                check, args, kw = f.metadata["check"]
                values[f.name] = check(
                    f"hparams.{name}.{f.name}", getattr(self, f.name), *args, **kw
                )
        set_fields(self, **values)
        if then is not None:
            then(self)

    return __post_init__


def dynamic_fields(hp_type: type) -> tuple[str, ...]:
    """The fields of a ``hparams`` class that are leaves of the compiled program."""
    return tuple(getattr(hp_type, "dynamic_fields", ()))


def hparam_leaves(hp: Any) -> Any:
    """``hp`` with its leaves as host arrays (floats as float32): what a program takes."""
    return jax.tree.map(lambda v: np.asarray(v, np.float32 if isinstance(v, float) else None), hp)


def static_hparams(hp: Any) -> Any:
    """What fixes the program of hyperparameters ``hp``: their tree definition (the static
    fields' values); equal for hyperparameters that share a compiled program."""
    return jax.tree.structure(hp)


@hparams
class NoHParams:
    """Hyperparameters of a method that has none beyond the shared training settings."""


def hparams_dict(hp: Any) -> dict[str, Any]:
    """A JSON-friendly dict of a hyperparameter dataclass."""
    return dataclasses.asdict(hp)
