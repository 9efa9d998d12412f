"""Runs of one compiled program: padded to common shapes, stacked along a leading run axis.

Runs that share a program (`program_key`) may still differ in their partition (samples per
client), their federation (slots, neighbors) and their numbers (learning rate, momentum,
float hyperparameters, keys). Their contexts are padded to the largest shape of the group
with the masks the engine already honours, so every run computes what `run()` of its own
config computes:

- samples: more padded samples per client (`mask` False): trailing masked steps, which the
  engine skips bit for bit;
- data clients: one more, empty, data client at the end (the *ghost*; count 0);
- slots: padded slots train on the ghost (no step), are nobody's target or neighbor (their
  neighbor list is `[s, s, ...]` with only column 0 True, and no other list names them),
  weigh 1 in their own average (`num_samples` 1, so nothing divides by zero), and their
  results are dropped;
- neighbor lists: every run's `[S, K]` lists are padded to the group's largest `K` with
  masked entries (index: the row's own slot), which every algorithm weighs 0.

Then `stack_runs` stacks every leaf along a new leading axis, except leaves equal in every run
(e.g. the learning rate of a seed sweep, or the data of runs with one data seed): those are
kept once and broadcast (`vmap` axis None), so shared data is not copied per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax.algorithms import RoundContext
from pfedwn_jax.data import ClientData
from pfedwn_jax.experiment.runner import Experiment


def program_key(exp: Experiment) -> tuple:
    """What must be equal for two runs to share a compiled program (anything else is padded
    or an array). Model, data shapes and classes, a validation split or none, the schedule,
    rounds, momentum on/off."""
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
        tuple(sorted(c.channel.items())) if c.link_model == "physical" else (),
    )


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


class Shapes:
    """The common shapes of a group: slots `S`, neighbor list width `K`, data clients `N`
    (ghost included), samples of the train, test and validation splits (0: no validation)."""

    def __init__(self, exps: Sequence[Experiment]) -> None:
        self.slots = max(e.federation.num_slots for e in exps)
        self.degree = max(int(e.ctx.neighbors.shape[1]) for e in exps)  # K: max in-degree + 1
        self.clients = max(e.data.train.num_clients for e in exps) + 1  # + the ghost
        self.train = max(e.data.train.max_samples for e in exps)
        self.test = max(e.data.test.max_samples for e in exps)
        self.val = max(0 if e.data.val is None else e.data.val.max_samples for e in exps)

    @property
    def ghost(self) -> int:
        return self.clients - 1


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


def pad_context(exp: Experiment, shapes: Shapes) -> tuple[RoundContext, tuple]:
    """`(ctx, (test, val))` of `exp` padded to `shapes` (see the module docstring); host
    arrays; `val` None without a validation split."""
    ctx, n = exp.ctx, shapes.slots
    neighbors, mask = pad_lists(
        np.asarray(ctx.neighbors), np.asarray(ctx.neighbor_mask), n, shapes.degree
    )
    padded = ctx.replace(
        train=pad_client_data(exp.data.train, shapes.clients, shapes.train),
        data_client=_pad_axis(np.asarray(ctx.data_client), 0, n, shapes.ghost),
        neighbors=neighbors,
        neighbor_mask=mask,
        adjacency=None,
        is_target=_pad_axis(np.asarray(ctx.is_target), 0, n, False),
        num_samples=_pad_axis(np.asarray(ctx.num_samples), 0, n, 1.0),
        lr=np.asarray(ctx.lr),
        momentum=None if ctx.momentum is None else np.asarray(ctx.momentum),
        links=None if ctx.links is None else pad_links(ctx.links, n, shapes.degree),
        shards=1,
    )
    test = pad_client_data(exp.data.test, shapes.clients, shapes.test)
    val = exp.data.val
    if val is not None:
        val = pad_client_data(val, shapes.clients, shapes.val)
    return padded, (test, val)


def pad_links(links: Any, slots: int, k: int) -> Any:
    """`Links` padded to `[slots, k]` like the neighbor lists (`pad_lists`): padded links have
    P_err 0 (they are masked there); padded slots sit at the origin and do not transmit."""
    return links.replace(
        perr=_pad_axis(_pad_axis(np.asarray(links.perr), 1, k, 0.0), 0, slots, 0.0),
        positions=_pad_axis(np.asarray(links.positions), 0, slots, 0.0),
        active=_pad_axis(np.asarray(links.active), 0, slots, False),
    )


def stack_runs(trees: Sequence[Any], *, pad_ragged: bool = False) -> tuple[Any, Any]:
    """`(stacked, axes)`: the runs' pytrees (same structure) as one tree for `vmap`.

    A leaf equal in every run is kept once (axis None), any other is stacked (axis 0).
    `pad_ragged`: leaves whose shapes differ between runs are zero-padded at the end of each
    axis first (states whose shapes follow the unpadded context; the states `init` builds
    from padded contexts already agree).
    Leaves come back as device arrays (`jnp`), not yet placed on a mesh.
    """
    flat = [jax.tree_util.tree_flatten(t) for t in trees]
    treedef = flat[0][1]
    for _, other in flat[1:]:
        if other != treedef:
            raise ValueError(f"runs of one program differ in structure: {treedef} vs {other}")
    leaves, axes = [], []
    for column in zip(*(f[0] for f in flat), strict=True):
        arrays = [np.asarray(a) for a in column]
        if pad_ragged:
            arrays = _pad_to_common(arrays)
        if all(a.shape == arrays[0].shape and np.array_equal(a, arrays[0]) for a in arrays):
            leaves.append(jnp.asarray(arrays[0]))
            axes.append(None)
        else:
            leaves.append(jnp.asarray(np.stack(arrays)))
            axes.append(0)
    return treedef.unflatten(leaves), treedef.unflatten(axes)


def _pad_to_common(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Zero-pad arrays of equal rank to their common (max) shape."""
    shape = np.max([a.shape for a in arrays], axis=0) if arrays[0].ndim else ()
    out = []
    for a in arrays:
        for axis, size in enumerate(shape):
            a = _pad_axis(a, axis, int(size))
        out.append(a)
    return out


def take_run(tree: Any, axes: Any, r: int) -> Any:
    """Run `r`'s part of a stacked tree (a shared leaf is every run's)."""
    return jax.tree.map(
        lambda ax, a: a if ax is None else a[r], axes, tree, is_leaf=lambda x: x is None
    )
