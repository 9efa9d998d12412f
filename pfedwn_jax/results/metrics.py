"""Per-round metrics: one registry that `Result`, `SweepResult`, their files and the writers read.

A metric is a function of a run's per-slot results of some rounds (`Rounds`: test accuracy
and loss of every slot, validation accuracy, the records, which slots are targets) returning
one number per round. The driver computes every registered metric for every run, method and
round on the host, so adding one is one `register_metric` call:

    from pfedwn_jax.results import register_metric

    register_metric("worst_target_accuracy",
                    lambda r: np.where(r.is_target, r.accuracy, np.inf).min(axis=1))

and it appears as a column of `SweepResult.rows` (and `rows.csv`), as a per-round list in
`Result.methods[name]` and in the metric writers.

A per-slot metric computed on the device inside the compiled round (`RoundOut.metrics`,
`[S]` each) is one entry of `SLOT_METRICS`: its function of the round's `SlotView`, the
per-slot row a `Result` keeps of it, and (optionally) the per-round metric of its mean over
the target slots, which reaches `SweepResult`, the CSV and the writers like any other.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from pfedwn_jax.engine.gossip import component_labels, consensus_deviation, spectral_gap
from pfedwn_jax.results.divergence import TRAIN_LOSS, slot_finite


class Rounds(NamedTuple):
    """`n` rounds of one run and method on the host.

    Attributes:
      accuracy: `[n, S]` test accuracy of every slot.
      loss: `[n, S]` test loss.
      val_accuracy: `[n, S]` validation accuracy, or None (no validation split).
      is_target: `[S]` bool, the slots reported as targets.
      records: `key -> [n, ...]` the records kept (pFedWN's `pi [n, S, K]`, ...).
      slots: `name -> [n, S]` every per-slot device metric (`SLOT_METRICS`).
    """

    accuracy: np.ndarray
    loss: np.ndarray
    val_accuracy: np.ndarray | None
    is_target: np.ndarray
    records: Mapping[str, np.ndarray]
    slots: Mapping[str, np.ndarray] = {}


class SlotView(NamedTuple):
    """What a per-slot device metric is computed from, inside the compiled round.

    Attributes:
      params: `[S, ...]` the models the slots are evaluated with.
      test: `accuracy [S]`, `loss [S]`: `engine.evaluate` on the test split.
      val: the same on the validation split, or None (no validation split).
      records: the round's records (the algorithm's and the links').
      num_slots: `S`.
      neighbors: `[S, K]` int32 the round's neighbor lists (`RoundContext.neighbors`), or None.
      listed: `[S, K]` bool the round's listed links (before the link draw), or None.
      mixing: `[S, K]` the round's gossip weights along `neighbors` over the delivered links
        (`Algorithm.mixing_weights`), or None: the method does not gossip.
      active: `[S]` bool the slots that hold data (a sweep's padded slots do not), or None.
    """

    params: Any
    test: Mapping[str, Any]
    val: Mapping[str, Any] | None
    records: Mapping[str, Any]
    num_slots: int
    neighbors: Any = None
    listed: Any = None
    mixing: Any = None
    active: Any = None


class SlotMetric(NamedTuple):
    """A per-slot device metric: `fn(SlotView) -> [S]` (None where it does not apply), the
    per-slot row a `Result` entry keeps (`client_...`; None: not kept), and `target`, the name
    of the per-round metric of its mean over the target slots (None: none)."""

    fn: Callable[[SlotView], Any]
    row: str | None
    target: str | None = None


def _finite(v: SlotView) -> Any:
    """`[S]` bool: the slot's parameters, test loss (and training loss) are finite."""
    losses = [v.test["loss"]]
    train = v.records.get(TRAIN_LOSS)
    if train is not None and train.shape == (v.num_slots,):
        losses.append(train)
    return slot_finite(v.params, losses)


def _consensus(v: SlotView) -> Any:
    """`[S]` squared distance of each slot's evaluated model from the mean model of its
    connected component of the round's listed graph (one component without lists):
    O(S K) per label sweep plus O(S P)."""
    labels = None if v.neighbors is None else component_labels(v.neighbors, v.listed)
    return consensus_deviation(v.params, labels)


def _spectral_gap(v: SlotView) -> Any:
    """`[S]` the round's spectral gap (`engine.gossip.spectral_gap` of the gossip weights over
    the delivered links) on every slot; None for a method that declares no weights."""
    if v.mixing is None or v.neighbors is None:
        return None
    gap = spectral_gap(v.neighbors, v.mixing, active=v.active)
    return jnp.broadcast_to(gap, (v.num_slots,))


#: The per-slot metrics every round computes on the device, in order. Adding one is two edits
#: here: its function and its entry (see docs/engine.md).
SLOT_METRICS: dict[str, SlotMetric] = {
    "accuracy": SlotMetric(lambda v: v.test["accuracy"], "client_accuracy"),
    "loss": SlotMetric(lambda v: v.test["loss"], "client_loss"),
    "finite": SlotMetric(_finite, None),
    "val_accuracy": SlotMetric(
        lambda v: None if v.val is None else v.val["accuracy"], "client_val_accuracy"
    ),
    "consensus_deviation": SlotMetric(_consensus, None, "consensus_distance"),
    "mixing_gap": SlotMetric(_spectral_gap, None, "spectral_gap"),
    # the cost of the round (`wireless.cost`, config `cost`), absent when it is not counted
    "bits_sent": SlotMetric(lambda v: v.records.get("bits_sent"), "client_bits_sent"),
    "airtime_s": SlotMetric(lambda v: v.records.get("airtime_s"), "client_airtime_s"),
    "energy_j": SlotMetric(lambda v: v.records.get("energy_j"), "client_energy_j"),
    "round_s": SlotMetric(lambda v: _per_slot(v, v.records.get("round_s")), None),
}


def _per_slot(v: SlotView, value: Any) -> Any:
    """A round's scalar `[]` as `[S]` (None stays None)."""
    return None if value is None else jnp.broadcast_to(value, (v.num_slots,))


def slot_metrics(view: SlotView) -> dict[str, Any]:
    """Every per-slot device metric that applies to this round: `name -> [S]`."""
    out = {name: m.fn(view) for name, m in SLOT_METRICS.items()}
    return {name: value for name, value in out.items() if value is not None}


def slot_rows() -> dict[str, str]:
    """Per-slot metric -> the row a `Result` entry keeps of it."""
    return {name: m.row for name, m in SLOT_METRICS.items() if m.row is not None}


QUANTILES = (10, 50, 90)  # percent: the client-accuracy quantiles kept every round
STATS = ("mean", *(f"q{q}" for q in QUANTILES))


def accuracy_stats(acc: np.ndarray) -> dict[str, list[float]]:
    """`acc [R, S]` -> `{"mean", "q10", "q50", "q90"}: [R]` over the slots (NaN ignored)."""
    acc = np.atleast_2d(np.asarray(acc, np.float64))
    if acc.size == 0:
        return {k: [] for k in STATS}
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a round with every slot NaN
        quant = np.nanpercentile(acc, QUANTILES, axis=1)
        mean = np.nanmean(acc, axis=1)
    return {"mean": mean.tolist(), **{f"q{q}": quant[i].tolist() for i, q in enumerate(QUANTILES)}}


RoundMetric = Callable[[Rounds], np.ndarray | None]
_METRICS: dict[str, RoundMetric] = {}


def register_metric(name: str, fn: RoundMetric) -> None:
    """Add per-round metric `name`: `fn(Rounds) -> [n]` floats, or None where it does not
    apply to a run (a table then holds NaN there); replaces a metric of that name."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"metric name must be an identifier string; got {name!r}")
    if not callable(fn):
        raise ValueError(f"metric {name!r}: fn must be callable; got {fn!r}")
    _METRICS[name] = fn


def unregister_metric(name: str) -> None:
    """Remove metric `name` (a ValueError if it is not registered)."""
    if name not in _METRICS:
        raise ValueError(f"metric {name!r} is not registered; registered: {list(_METRICS)}")
    del _METRICS[name]


def metric_names() -> tuple[str, ...]:
    """The registered metrics, in registration order, then the per-slot metrics' target
    means."""
    return tuple(dict.fromkeys([*_METRICS, *_slot_targets(), *CUMULATIVE]))


def _slot_targets() -> dict[str, str]:
    return {m.target: name for name, m in SLOT_METRICS.items() if m.target is not None}


#: Running totals over the rounds: metric -> the per-round metric it sums (`compute`): the
#: simulated clock and the energy spent so far (x axes of time- and energy-to-accuracy).
CUMULATIVE: dict[str, str] = {"clock_s": "round_s", "cumulative_energy_j": "energy_j"}


def compute(rounds: Rounds, ends: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """Every registered metric that applies to `rounds`: `name -> [n]` float64. The running
    totals (`CUMULATIVE`) go on from `ends` (each metric's value before these rounds)."""
    n = rounds.accuracy.shape[0]
    out = {}
    for name, fn in _METRICS.items():
        value = fn(rounds)
        if value is None:
            continue
        value = np.asarray(value, np.float64)
        if value.shape != (n,):
            raise ValueError(
                f"metric {name!r} must give one number per round ({n}); got shape {value.shape}"
            )
        out[name] = value
    for target, name in _slot_targets().items():
        if target not in out and name in rounds.slots:
            out[target] = _target_mean(np.asarray(rounds.slots[name], np.float64), rounds.is_target)
    for name, of in CUMULATIVE.items():
        if of in out:
            out[name] = (ends or {}).get(name, 0.0) + np.cumsum(out[of])
    return out


def _target_mean(values: np.ndarray, is_target: np.ndarray) -> np.ndarray:
    """`[n]` mean of `values [n, S]` over the target slots."""
    return values[:, is_target].mean(axis=1) if is_target.any() else np.full(len(values), np.nan)


register_metric("target_accuracy", lambda r: _target_mean(r.accuracy, r.is_target))
register_metric("target_loss", lambda r: _target_mean(r.loss, r.is_target))
register_metric("mean_client_accuracy", lambda r: r.accuracy.mean(axis=1))
register_metric(
    "target_val_accuracy",
    lambda r: None if r.val_accuracy is None else _target_mean(r.val_accuracy, r.is_target),
)


def _slot_total(r: Rounds, name: str) -> np.ndarray | None:
    """`[n]` sum over the slots of per-slot metric `name` (None where it is not computed)."""
    values = r.slots.get(name)
    return None if values is None else np.asarray(values, np.float64).sum(axis=1)


# the round's cost, total over the slots (`SLOT_METRICS`; absent when it is not counted)
register_metric("bits_sent", lambda r: _slot_total(r, "bits_sent"))
register_metric("airtime_s", lambda r: _slot_total(r, "airtime_s"))
register_metric("energy_j", lambda r: _slot_total(r, "energy_j"))
register_metric("round_s", lambda r: None if "round_s" not in r.slots else r.slots["round_s"][:, 0])
