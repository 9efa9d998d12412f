"""The compiled unit of a sweep: `K` rounds of one method for `R` runs at once.

`block(state, ctx, test, hvalues, round_root, start)` scans the runner's own round
(`runner._step`: the algorithm's round, evaluation, divergence flags) over rounds
`start .. start + K - 1` of one run, with round `r`'s key `fold_in(round_root, r)` as in
`run()`. `vmap` makes it a program over the leading run axis of every argument (shared leaves
broadcast), `jit` compiles it once per method and shape group, and the run axis is the
`"runs"` axis of a `Mesh(("runs", "slots"))`: every device computes its own runs
(`shard_map`), and the host sees the device once per block (metrics `[R, K, S]`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pfedwn_jax.distributed import from_host
from pfedwn_jax.experiment.runner import _step

RUNS, SLOTS = "runs", "slots"


def default_mesh(devices: list | None = None) -> Mesh:
    """A `Mesh(("runs", "slots"))` with every device on the run axis (slots unsplit)."""
    devices = list(jax.devices() if devices is None else devices)
    return Mesh(np.array(devices).reshape(len(devices), 1), (RUNS, SLOTS))


def _block(alg, hp, num_rounds, state, ctx, evals, hvalues, round_root, start):
    """One run: rounds `start ..` `start + num_rounds - 1`; returns `(state, metrics [K, ...])`.

    `evals` is `(test, val)`; with a validation split the metrics add `val_accuracy [S]`."""
    test, val = evals

    def body(state, r):
        key = jax.random.fold_in(round_root, r)
        state, metrics, records = _step(alg, hp, state, key, ctx, test, hvalues, val)
        if val is not None:
            metrics = {**metrics, "val_accuracy": records["val_acc"]}
        return state, metrics

    return jax.lax.scan(body, state, start + jnp.arange(num_rounds, dtype=jnp.int32))


@functools.lru_cache(maxsize=64)
def block_program(alg, static_hp, num_rounds: int, ctx_axes_key, state_axes_key, mesh: Mesh):
    """The jitted, run-vmapped block (cached per method, static hyperparameters, block length,
    which context and state leaves are per run, and mesh). Call it as
    `(state, ctx, test, hvalues, round_roots, start)`; `ctx_axes_key` is `(ctx_axes,
    test_axes)` and `state_axes_key` `(state_axes, ...)` as hashable pairs of
    treedef-and-leaves (see `axes_key`)."""
    ctx_axes, test_axes = _axes_from_key(ctx_axes_key)
    state_axes, _ = _axes_from_key(state_axes_key)
    fn = functools.partial(_block, alg, static_hp, num_rounds)
    in_axes = (state_axes, ctx_axes, test_axes, 0, 0, None)
    vmapped = jax.vmap(fn, in_axes=in_axes, out_axes=(state_axes, 0))
    local = jax.shard_map(
        vmapped,
        mesh=mesh,
        in_specs=_specs(in_axes),
        out_specs=_specs((state_axes, 0)),
        check_vma=False,
    )
    return jax.jit(local, donate_argnums=0)


def _specs(axes: Any) -> Any:
    """`shard_map` specs of `vmap` axes: run-axis leaves split over `"runs"`, others whole.

    Each device runs its own runs as a local program (`shard_map`), so nothing inside a
    round (the engine's per-slot loops, dynamic slices over the folded run-and-slot axis)
    is left to the SPMD partitioner, which would gather those loops' operands."""
    return jax.tree.map(
        lambda ax: P() if ax is None else P(RUNS), axes, is_leaf=lambda x: x is None
    )


def state_axes(state: Any) -> Any:
    """`vmap` axes of a stacked state: 0, but None for the scalar leaves the runs share
    (round counters: the runs of a program advance in lockstep). Kept unbatched, a counter
    keeps `lax.cond` on it a branch (pFedWN's EM round) instead of a select that would run
    both branches every round."""
    return jax.tree.map(lambda a: None if jnp.ndim(a) == 0 else 0, state)


def axes_key(ctx_axes: Any, test_axes: Any) -> tuple:
    """A hashable form of the `vmap` axes of the context and the test data."""
    flat_c = jax.tree_util.tree_flatten(ctx_axes, is_leaf=lambda x: x is None)
    flat_t = jax.tree_util.tree_flatten(test_axes, is_leaf=lambda x: x is None)
    return (tuple(flat_c[0]), flat_c[1], tuple(flat_t[0]), flat_t[1])


def _axes_from_key(key: tuple) -> tuple[Any, Any]:
    c_leaves, c_def, t_leaves, t_def = key
    return c_def.unflatten(c_leaves), t_def.unflatten(t_leaves)


def place(tree: Any, axes: Any, mesh: Mesh) -> Any:
    """Put a stacked tree on `mesh`: run-axis leaves split over `"runs"`, shared ones
    replicated. A leaf with run axis must have a multiple of the mesh's run size.

    A mesh over several processes: every process passes the same tree (each sets up every
    run) and copies only its own devices' rows (`distributed.from_host`, no communication)."""
    split, whole = NamedSharding(mesh, P(RUNS)), NamedSharding(mesh, P())

    def put(ax, a):
        sharding = whole if ax is None else split
        if not mesh.is_multi_process:
            return jax.device_put(a, sharding)
        return jax.tree.map(lambda x: from_host(x, sharding), a)

    return jax.tree.map(put, axes, tree, is_leaf=lambda x: x is None)
