"""Runs of one compiled program: padded to common shapes, stacked along a leading run axis.

Runs that share a program (`program_key`) may still differ in their partition (samples per
client), their federation (slots, neighbors) and their numbers (learning rate, momentum,
float hyperparameters, keys). Their contexts are padded to the largest shape of the group
with the masks the engine already honours, so every run computes what `run()` of its own
config computes:

- samples: more padded samples per client (`mask` False): trailing masked steps, which the
  engine skips bit for bit;
- data clients: one more, empty, data client at the end (the *ghost*; count 0), when some
  run has fewer slots than the group (its padded slots train on it);
- slots: padded slots train on the ghost (no step), are nobody's target or neighbor (their
  neighbor list is `[s, s, ...]` with only column 0 True, and no other list names them),
  weigh 1 in their own average (`num_samples` 1, so nothing divides by zero), and their
  results are dropped;
- neighbor lists: every run's `[S, K]` lists are padded to the group's largest `K` with
  masked entries (index: the row's own slot), which every algorithm weighs 0.

Then `stack_runs` stacks every leaf along a new leading axis, except leaves equal in every run
(e.g. the learning rate of a seed sweep): those are kept once and broadcast (`vmap` axis None).
The data splits go through `stack_data`, which pads every run's data straight into the stacked
array, and keeps the data of runs with one partition once, so shared data is not copied per
run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from pfedwn_jax.algorithms import RoundContext
from pfedwn_jax.data import ClientData
from pfedwn_jax.experiment.link_setup import RADIO
from pfedwn_jax.experiment.setup import Experiment


def program_key(exp: Experiment) -> tuple:
    """What must be equal for two runs to share a compiled program (anything else is padded
    or an array). Model, data shapes and classes, a validation split or none, the schedule,
    rounds, momentum on/off, the link model and what keeps state across rounds (stale links,
    mobility)."""
    c = exp.config
    return (
        c.model,
        exp.data.name,
        int(exp.data.num_classes),
        tuple(int(s) for s in exp.data.train.x.shape[2:]),
        exp.data.val is None,
        exp.ctx.batch_size,  # the config's, clamped to the run's largest client
        c.local_epochs,
        c.local_steps,
        c.rounds,
        bool(c.momentum),
        c.link_model,
        c.link_failure is None,
        _static_channel(c) if c.link_model == "physical" else (),
        c.fading if c.link_model == "physical" or c.mobility != "none" else (),
        c.stale,
        (c.mobility, c.reselect_every, c.moments) if c.mobility != "none" else (),
        (c.rate_model, c.reception) if c.cost else None,
    )


def _static_channel(c: Any) -> tuple:
    """The channel overrides that are static in a program (all but `Links.radio`'s)."""
    return tuple(sorted((k, v) for k, v in c.channel.items() if k not in RADIO))


def _pad_axis(a: np.ndarray, axis: int, size: int, value: Any = 0) -> np.ndarray:
    """`a` padded with `value` at the end of `axis` to `size`."""
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, size - a.shape[axis])
    return np.pad(a, pad, constant_values=value)


def pad_client_data(data: ClientData, clients: int, samples: int) -> ClientData:
    """`data` with empty clients appended up to `clients` and every client padded to
    `samples` (host arrays)."""
    out = []
    for leaf in data:
        a = np.asarray(leaf)
        a = _pad_axis(a, 0, clients)
        out.append(_pad_axis(a, 1, samples) if a.ndim > 1 else a)
    return ClientData(*out)


def bucket(n: int) -> int:
    """`n` rounded up to `m * 2**k` with `m` in {2, 3, 4} (less than half more, about a fifth
    on average): runs whose largest client differs a little (the seeds of one partition
    scheme) get the same shapes, hence the same compiled program."""
    if n <= 4:
        return n
    step = 1 << (n.bit_length() - 2)
    return -(-n // step) * step


class Shapes:
    """The common shapes of a group: slots `S`, neighbor list width `K`, data clients `N`
    (the ghost included where some run has padded slots), samples of the train, test and
    validation splits (0: no validation).

    In single mode (a target and its few neighbors) the sample counts are `bucket`ed, so a
    loop of `run()` calls over seeds compiles once; in network mode (thousands of clients,
    whose memory the plan counts) they are the largest client's."""

    def __init__(self, exps: Sequence[Experiment]) -> None:
        self.slots = max(e.federation.num_slots for e in exps)
        self.degree = max(int(e.ctx.neighbors.shape[1]) for e in exps)  # K: max in-degree + 1
        ghost = any(e.federation.num_slots < self.slots for e in exps)
        self.clients = max(e.data.train.num_clients for e in exps) + ghost
        size = bucket if all(e.config.mode == "single" for e in exps) else int
        self.train = size(max(e.data.train.max_samples for e in exps))
        self.test = size(max(e.data.test.max_samples for e in exps))
        val = max(0 if e.data.val is None else e.data.val.max_samples for e in exps)
        self.val = size(val)


def pad_lists(
    neighbors: np.ndarray, mask: np.ndarray, slots: int, degree: int
) -> tuple[np.ndarray, np.ndarray]:
    """Neighbor lists `[S, K]` padded to `[slots, degree]` (host): new columns point at the
    row's own slot, masked; new rows are `[s, s, ...]` with only column 0 True."""
    s, k = neighbors.shape
    out = np.repeat(np.arange(slots, dtype=np.int32)[:, None], degree, axis=1)
    out_mask = np.zeros((slots, degree), bool)
    out_mask[:, 0] = True
    out[:s, :k], out_mask[:s, :k] = neighbors, mask
    out[:s, :k] = np.where(mask, neighbors, out[:s, :k])
    return out, out_mask


def pad_context(exp: Experiment, shapes: Shapes) -> RoundContext:
    """`exp`'s context padded to `shapes` (see the module docstring), host arrays, without
    its training data (`train` None: `stack_data` pads every run's data into the stacked
    array). Padded slots train on the last data client (the ghost, when there are padded
    slots)."""
    ctx, n = exp.ctx, shapes.slots
    neighbors, mask = pad_lists(
        np.asarray(ctx.neighbors), np.asarray(ctx.neighbor_mask), n, shapes.degree
    )
    return ctx.replace(
        train=None,
        data_client=_pad_axis(np.asarray(ctx.data_client), 0, n, shapes.clients - 1),
        neighbors=neighbors,
        neighbor_mask=mask,
        adjacency=None,
        is_target=_pad_axis(np.asarray(ctx.is_target), 0, n, False),
        num_samples=_pad_axis(np.asarray(ctx.num_samples), 0, n, 1.0),
        lr=np.asarray(ctx.lr),
        momentum=None if ctx.momentum is None else np.asarray(ctx.momentum),
        links=None if ctx.links is None else pad_links(ctx.links, n, shapes.degree),
    )


def stack_data(
    splits: Sequence[ClientData | None], clients: int, samples: int
) -> tuple[ClientData | None, Any]:
    """`(stacked, axes)`: one data split of every run, each with `clients` clients (the ghost
    included) of `samples` samples. Kept once (axes None) when every run holds the same
    split (one partition: `setup` shares its arrays); else `[R, clients, samples, ...]`,
    each run's arrays written into one array per field (no padded copy per run)."""
    first = splits[0]
    if first is None:
        return None, None
    if all(_same(split, first) for split in splits[1:]):
        if (first.num_clients, first.max_samples) != (clients, samples):
            first = pad_client_data(first, clients, samples)
        return first, jax.tree.map(lambda _: None, first)

    def shape(a: Any) -> tuple[int, ...]:
        return (clients, *((samples,) if np.ndim(a) > 1 else ()), *np.shape(a)[2:])

    columns = zip(*splits, strict=True)
    fields = [_stack_padded([np.asarray(a) for a in c], shape(c[0])) for c in columns]
    return ClientData(*fields), jax.tree.map(lambda _: 0, first)


def _same(a: Any, b: Any) -> bool:
    """Whether two data splits hold the same arrays (the same objects, or equal values)."""
    pairs = list(zip(a, b, strict=True))
    if all(x is y for x, y in pairs):
        return True
    return all(np.shape(x) == np.shape(y) for x, y in pairs) and all(
        np.array_equal(x, y) for x, y in pairs
    )


def pad_links(links: Any, slots: int, k: int) -> Any:
    """`Links` padded to `[slots, k]` like the neighbor lists (`pad_lists`): padded links have
    P_err 0 (they are masked there); padded slots sit at the origin and do not transmit (nor
    train: their compute time and power are 0 in the cost set-up; their shadowing ids are 0,
    unused)."""
    cost, shadow = links.cost, links.shadow
    if cost is not None:
        slot = {f: _pad_axis(np.asarray(getattr(cost, f)), 0, slots, 0.0) for f in _COST_SLOTS}
        cost = cost.replace(**slot)
    if shadow is not None:
        shadow = shadow.replace(ids=_pad_axis(np.asarray(shadow.ids), 0, slots, 0))
    return links.replace(
        shadow=shadow,
        perr=_pad_axis(_pad_axis(np.asarray(links.perr), 1, k, 0.0), 0, slots, 0.0),
        positions=_pad_axis(np.asarray(links.positions), 0, slots, 0.0),
        active=_pad_axis(np.asarray(links.active), 0, slots, False),
        cost=cost,
    )


#: The per-slot `[S]` fields of `wireless.cost.CostSetup`.
_COST_SLOTS = ("compute_s", "compute_w")


def stack_runs(trees: Sequence[Any]) -> tuple[Any, Any]:
    """`(stacked, axes)`: the runs' pytrees (same structure) as one tree for `vmap`.

    A leaf equal in every run is kept once (axis None), any other is stacked (axis 0); leaves
    whose shapes differ between runs (each run's data padded to its own largest client) are
    zero-padded at the end of each axis into the stacked array. Leaves come back as host
    arrays (NumPy), not yet placed.
    """
    flat = [jax.tree.flatten(t) for t in trees]
    treedef: Any = flat[0][1]  # a PyTreeDef: jaxlib ships no type stub of it
    for _, other in flat[1:]:
        if other != treedef:
            raise ValueError(f"runs of one program differ in structure: {treedef} vs {other}")
    leaves: list[np.ndarray] = []
    axes: list[int | None] = []
    for column in zip(*(f[0] for f in flat), strict=True):
        arrays = [np.asarray(a) for a in column]
        same = all(a.shape == arrays[0].shape for a in arrays)
        if same and all(np.array_equal(a, arrays[0]) for a in arrays[1:]):
            leaves.append(arrays[0])
            axes.append(None)
        else:
            leaves.append(np.stack(arrays) if same else _stack_padded(arrays))
            axes.append(0)
    return treedef.unflatten(leaves), treedef.unflatten(axes)


def _stack_padded(arrays: list[np.ndarray], shape: tuple[int, ...] | None = None) -> np.ndarray:
    """`[R, *shape]` of arrays of equal rank, each zero-padded at the end of every axis to
    `shape` (default: their common, largest, shape), written into one array (no padded
    copies)."""
    if len({a.ndim for a in arrays}) > 1:
        raise ValueError(
            f"runs of one program differ in a leaf's rank: {[a.shape for a in arrays]}"
        )
    if shape is None:
        shape = tuple(int(s) for s in np.max([a.shape for a in arrays], axis=0))
    out = np.zeros((len(arrays), *shape), np.result_type(*arrays))
    for r, a in enumerate(arrays):
        where: tuple[int | slice, ...] = (r, *(slice(0, d) for d in a.shape))
        out[where] = a
    return out
