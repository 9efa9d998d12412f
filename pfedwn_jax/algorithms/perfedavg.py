"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar 2020): MAML-style FedAvg, personalised by one step.

Each local step on a minibatch evaluates the MAML meta-gradient at the current model ``w``:

- inner (adaptation) step on batch part ``D``: ``w' = w - alpha * grad f(w; D)``;
- first-order (FO): ``g = grad f(w'; D')``;
- Hessian-free (HF, Fallah et al.'s Per-FedAvg (HF)): ``g = v - alpha * h`` with
  ``v = grad f(w'; D')`` and the Hessian-vector product ``H(w; D'') v`` estimated by a central
  finite difference of gradients on the independent batch ``D''``,
  ``h = (grad f(w + delta v; D'') - grad f(w - delta v; D'')) / (2 delta)`` (error
  O(delta^2) in exact arithmetic; float32 rounding adds ~ eps / delta);
- exact (``"exact"``, ours): the same with ``h = H(w; D'') v`` computed exactly by
  forward-over-reverse differentiation (``jax.jvp`` of the gradient), the ``delta -> 0``
  limit of HF (this was ``"hf"`` before the finite-difference estimate existed);

and the engine's optimizer applies ``g`` with its learning rate, which is the paper's outer
step size beta. With ``split_batch=True`` (default, the paper's independent batches) the
minibatch is dealt into disjoint parts by position: ``D`` = positions 0, k, 2k..., ``D'`` =
1, k+1, ... (k = 2 for FO, 3 for HF and exact, ``D''`` = 2, k+2, ...); ``False`` uses the whole
minibatch for every part. Aggregation is FedAvg's (sample-weighted mean in each group).

The personalised model a slot is evaluated with is the aggregated (global) model after one
adaptation step ``w - alpha * grad f(w; own training data)`` (full-batch gradient over the
slot's training split, accumulated in minibatch chunks).

With ``alpha = 0`` the meta-gradient is the plain gradient and the evaluation model is the
global model: with ``split_batch=False`` this is exactly FedAvg; with ``split_batch=True`` it
is FedAvg whose steps use only the ``D'`` part of each minibatch.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pfedwn_jax._checks import check_bool, check_choice, check_float
from pfedwn_jax.algorithms.base import RoundContext, checked, hparams, register
from pfedwn_jax.algorithms.common import BaselineState, baseline_algorithm, train_then_average
from pfedwn_jax.algorithms.phases import Phase, Sizes, chunk_of, evaluation, training
from pfedwn_jax.engine import default_loss, per_sample_ce, resolve_shards, shard_slots

VARIANTS = ("fo", "hf", "exact")
#: Variants with a Hessian-vector product term (and a third batch part D'').
HESSIAN_VARIANTS = ("hf", "exact")
#: Samples per chunk of the evaluation's full-batch gradient (memory of one such batch).
EVAL_CHUNK = 256


@hparams(name="perfedavg")
class PerFedAvgHParams:
    """Per-FedAvg hyperparameters.

    Attributes:
      alpha: inner (adaptation) step size, >= 0. Default 0.01 (ours; Fallah et al. tune it
        per dataset, e.g. 0.001-0.01 for MNIST). The outer step size beta is the experiment's
        SGD learning rate ``lr``.
      variant: "fo" (first-order), "hf" (Hessian-free: finite-difference Hessian-vector
        product with step ``delta``, as Fallah et al. define it) or "exact" (exact
        Hessian-vector product, the ``delta -> 0`` limit of "hf"). Default "fo" (ours; the
        paper reports FO and HF).
      delta: finite-difference step of "hf" (> 0; unused otherwise). Default 1e-3 (ours:
        Fallah et al. require delta small and give no value; in float32 the estimate's
        truncation error O(delta^2) and rounding error ~ 1e-7 / delta balance near 1e-3 to
        1e-2 for gradient-sized ``v``).
      split_batch: deal each minibatch into independent parts for the inner step, the outer
        gradient and (HF) the Hessian, as the paper samples independent batches (default
        True); False reuses the whole minibatch.
    """

    alpha: float = checked(0.01, check_float, 0.0)
    variant: str = checked("fo", check_choice, VARIANTS, static=True)
    split_batch: bool = checked(True, check_bool, static=True)
    delta: float = checked(1e-3, check_float, 0.0, low_inclusive=False)


def _axpy(a: float | jax.Array, x: Any, y: Any) -> Any:
    """``y + a * x`` over matching pytrees."""
    return jax.tree.map(lambda xi, yi: yi + a * xi, x, y)


def batch_parts(w: jax.Array, hp: PerFedAvgHParams) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Sample weights of the parts ``(D, D', D'')`` of one minibatch ``w [B]`` (over the
    whole minibatch; `batch_slices` cuts the same parts out)."""
    if not hp.split_batch:
        return w, w, w
    k = 3 if hp.variant in HESSIAN_VARIANTS else 2
    pos = jnp.arange(w.shape[0]) % k
    d, d1 = w * (pos == 0), w * (pos == 1)
    d2 = w * (pos == 2) if k == 3 else d
    return d, d1, d2


def batch_slices(
    x: jax.Array, y: jax.Array, w: jax.Array, hp: PerFedAvgHParams
) -> tuple[tuple[jax.Array, jax.Array, jax.Array], ...]:
    """The parts ``(D, D', D'')`` of one minibatch as ``(x, y, w)`` slices: the samples that
    `batch_parts` weights, without the zero-weighted rest (each gradient then costs its
    part's samples, not the whole minibatch's)."""
    if not hp.split_batch:
        return ((x, y, w),) * 3
    k = 3 if hp.variant in HESSIAN_VARIANTS else 2
    parts = [(x[i::k], y[i::k], w[i::k]) for i in range(k)]
    return parts[0], parts[1], parts[2] if k == 3 else parts[0]


def meta_grad_fn(base_loss: Any, hp: PerFedAvgHParams):
    """The engine ``grad_fn(params, x, y, w, aux_s, key) -> (loss, meta-gradient)``.

    ``base_loss(params, x, y, w, aux_s)`` is the masked mean cross-entropy; the returned loss
    is the outer loss ``f(w'; D')``. Each gradient runs on its part of the minibatch only
    (`batch_slices`).
    """

    def grad_fn(params, x, y, w, aux_s, key):
        del key
        d, d1, d2 = batch_slices(x, y, w, hp)
        g_in = jax.grad(base_loss)(params, *d, aux_s)
        adapted = _axpy(-hp.alpha, g_in, params)
        loss, g_out = jax.value_and_grad(base_loss)(adapted, *d1, aux_s)
        if hp.variant in HESSIAN_VARIANTS:
            grad_d2 = lambda p: jax.grad(base_loss)(p, *d2, aux_s)
            hvp = hessian_vector_product(grad_d2, params, g_out, hp)
            g_out = _axpy(-hp.alpha, hvp, g_out)
        return loss, g_out

    return grad_fn


def hessian_vector_product(grad_fn: Any, params: Any, v: Any, hp: PerFedAvgHParams) -> Any:
    """``H v`` for the Hessian of the loss whose gradient is ``grad_fn(params)``.

    ``"exact"``: forward-over-reverse (``jax.jvp`` of ``grad_fn``). ``"hf"``: Fallah et al.'s
    central difference ``(grad_fn(params + delta v) - grad_fn(params - delta v)) / (2 delta)``.
    """
    if hp.variant == "exact":
        return jax.jvp(grad_fn, (params,), (v,))[1]
    plus = grad_fn(_axpy(hp.delta, v, params))
    minus = grad_fn(_axpy(-hp.delta, v, params))
    return jax.tree.map(lambda a, b: (a - b) / (2.0 * hp.delta), plus, minus)


def full_batch_grad(
    model: Any, params: Any, x: jax.Array, y: jax.Array, mask: jax.Array, chunk: int
) -> Any:
    """Gradient of one client's masked mean cross-entropy over all its samples.

    ``params``: one model; ``x [N, ...]``, ``y [N]``, ``mask [N]`` (real samples first, as
    `ClientData` holds them). Summed over chunks of ``chunk`` samples, only as many as hold
    real samples (a padded chunk adds an exact zero), so memory stays that of one minibatch
    and a small client does not pay for the largest one's padding.
    """
    n = y.shape[0]
    chunk = max(1, min(chunk, n))

    def chunk_loss(p, idx, valid):
        w = (mask[idx] & valid).astype(jnp.float32)
        return jnp.sum(w * per_sample_ce(model.apply(p, x[idx]), y[idx]))

    def body(c, acc):
        idx = c * chunk + jnp.arange(chunk)
        valid = idx < n
        g = jax.grad(chunk_loss)(params, jnp.minimum(idx, n - 1), valid)
        return jax.tree.map(jnp.add, acc, g)

    count = mask.sum(dtype=jnp.int32)
    zero = jax.tree.map(jnp.zeros_like, params)
    total = jax.lax.fori_loop(0, -(-count // chunk), body, zero)
    return jax.tree.map(lambda g: g / jnp.maximum(count, 1).astype(jnp.float32), total)


def _round(
    state: BaselineState, key: jax.Array, ctx: RoundContext, hp: PerFedAvgHParams
) -> tuple[BaselineState, Any]:
    return train_then_average(state, key, ctx, grad_fn=meta_grad_fn(default_loss(ctx.model), hp))


def eval_params(state: BaselineState, ctx: RoundContext, hp: PerFedAvgHParams):
    """The held (global) model after one step of size alpha on the slot's own training data,
    each device adapting its own block of slots (`shard_slots`, as training splits them;
    a loop over the whole slot axis had every device gather and adapt every slot)."""
    params = state.clients.params  # alpha is traced (a dynamic hyperparameter): no shortcut at 0
    chunk = max(ctx.batch_size, EVAL_CHUNK)

    def adapt(train: Any, alpha: Any, params: Any, data_client: Any) -> Any:
        def one(args: tuple) -> Any:
            p, c = args
            g = full_batch_grad(ctx.model, p, train.x[c], train.y[c], train.mask[c], chunk)
            return _axpy(-alpha, g, p)

        slots = chunk_of(None, data_client.shape[0])  # one at a time on a CPU
        if slots == 1:  # a plain scan: `batch_size=1` (a vmap of one inside the scan) made
            return jax.lax.map(one, (params, data_client))  # XLA:CPU abort in a network run
        return jax.lax.map(one, (params, data_client), batch_size=slots)

    shards = resolve_shards(ctx.shards, ctx.num_slots)
    if shards == 1:
        return adapt(ctx.train, hp.alpha, params, ctx.data_client)
    replicated = (ctx.train, hp.alpha)
    return shard_slots(adapt, replicated, (params, ctx.data_client), ctx.num_slots, shards)


def memory_phases(sz: Sizes, hp: Any) -> list[Phase]:
    """Per-FedAvg: 2 (FO) or 3 (HF) passes per step; with `alpha > 0` its evaluation adapts
    the slots (a full-batch gradient in chunks of max(B, 256) samples; at most all S at once,
    as on an accelerator): adapted models and their gradients. Gradients per step: first-order 2,
    Hessian-free 3, each on the whole minibatch, or with `split_batch` on its part of it
    (`batch_slices`: together one minibatch)."""
    grads = {"fo": 2, "hf": 3}.get(getattr(hp, "variant", "fo"), 2)
    if getattr(hp, "split_batch", True):
        grads = 1
    train = training(sz, sz.slots, sz.steps, "local training (meta-gradient)", grads)
    plain = evaluation(sz, sz.slots, sz.m_test, "evaluation")
    if getattr(hp, "alpha", 1.0) == 0:  # evaluated with the held models
        return [train, plain]
    adapt = min(sz.m_train, max(sz.batch, EVAL_CHUNK))
    at_once = chunk_of(None, sz.slots)  # the slots `lax.map` adapts together
    adaptation = Phase(
        "evaluation (one-step adaptation)",
        (sz.slots + 2 * at_once) * sz.param,  # adapted models; a slot's model, gradient sum
        max(at_once * adapt * sz.train_sample, plain.activations),
    )
    return [train, adaptation]


PERFEDAVG = register(
    baseline_algorithm(
        name="perfedavg",
        tune=("alpha", (0.005, 0.02)),
        hparams=PerFedAvgHParams,
        round=_round,
        eval_params=eval_params,
        description="MAML-style FedAvg (Fallah et al. 2020), evaluated after one adaptation step",
        memory_phases=memory_phases,
        family="meta-learning",
    )
)
