"""The cost of one round: bits, airtime, energy and the clock, for all links at once.

The links are the runner's neighbor lists: receiver `i` lists senders ``neighbors[i, k]``
(`[S, K]`, column 0 the slot itself, ``listed`` marks real entries). A listed link carries
the sender's model (``payload_bits`` of it) at its rate (``rates.link_rate``: from its SINR, or
the fixed rate of the SINR threshold), with ARQ (``arq.arq_attempts``); the first attempt
is the link model's draw (``received``). A model's bits are its compressor's count
(``engine.compression``: ``Identity(value_bits=b).bits(tree)`` is parameters x `b`) plus
``header_bits`` per attempt.

Timing: every slot trains for ``compute_s`` and then sends; the model of sender `j` reaches
receiver `i` at ``finish_ij = compute_j + airtime_ij`` (``reception="parallel"``: each link on
its own sub-channel, the paper's best sub-channel per session), or, with ``"serial"``, after
the receiver has taken its links one at a time in the order they became ready (a single
server queue). Receiver `i` waits for every used link up to ``deadline_s``: its round ends at
``max(compute_i, max_k min(finish_ik, deadline_s))``; a model delivered after the deadline is
dropped (a straggler), as a failed link. The synchronous round lasts as long as its slowest
active slot. A link whose rate is 0 (below the MCS table) is not used: no attempt, no wait.

Energy per slot: ``tx_power_w`` x its airtime over every attempt on every link it sends on,
plus ``compute_w`` x ``compute_s``. Every attempt's airtime is counted, a straggler's too.
"""

from __future__ import annotations

import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax._checks import INT32_MAX, check_choice, check_range, is_concrete
from pfedwn_jax.wireless.arq import arq_attempts
from pfedwn_jax.wireless.compute import Devices, compute_seconds
from pfedwn_jax.wireless.params import ChannelParams
from pfedwn_jax.wireless.rates import HE_MCS_TABLE, RATE_MODELS, link_rate

RECEPTIONS = ("parallel", "serial")
#: Folded into the round key for the ARQ retries (the link draw keeps its own key).
COST_SALT = 0xC057


class CostParams(flax.struct.PyTreeNode):
    """How a round's cost is counted. Numeric fields are leaves (sweepable in one program).

    Attributes:
      rate_model: ``"threshold"`` (fixed rate at gamma_th), ``"shannon"`` or ``"mcs"``
        (``rates.RATE_MODELS``). Static.
      reception: ``"parallel"`` or ``"serial"`` (see the module). Static.
      mcs_table: (SINR thresholds dB, b/s/Hz) for ``"mcs"``; 802.11ax by default. Static.
      efficiency: fraction of the Shannon rate the modem achieves (threshold and shannon).
      retries: ARQ retries per link and round (0: one attempt).
      header_bits: bits added to every model sent (per attempt).
      deadline_s: seconds after the round starts; later models are dropped (inf: none).
    """

    rate_model: str = flax.struct.field(pytree_node=False, default="threshold")
    reception: str = flax.struct.field(pytree_node=False, default="parallel")
    mcs_table: Any = flax.struct.field(pytree_node=False, default=HE_MCS_TABLE)
    efficiency: Any = 1.0
    retries: Any = 0
    header_bits: Any = 0
    deadline_s: Any = math.inf

    def __post_init__(self) -> None:
        check_choice("rate_model", self.rate_model, RATE_MODELS)
        check_choice("reception", self.reception, RECEPTIONS)
        # concrete numbers only: inside jit / vmap the leaves are tracers, and JAX rebuilds
        # the tree with other leaves (a sweep's vmap axes: None; lowering: argument infos)
        leaves = (self.efficiency, self.retries, self.header_bits, self.deadline_s)
        if not all(_is_number(v) for v in leaves):
            return
        check_range("efficiency", self.efficiency, 0.0, 1.0, low_inclusive=False)
        check_range("retries", self.retries, 0, INT32_MAX)
        if is_concrete(self.retries) and not np.all(np.mod(np.asarray(self.retries), 1) == 0):
            raise ValueError(f"retries must be whole numbers; got {self.retries!r}")
        check_range("header_bits", self.header_bits, 0.0)
        check_range("deadline_s", self.deadline_s, 0.0, low_inclusive=False)


def _is_number(value: Any) -> bool:
    """`value` is a concrete number or numeric array (not a tracer, None or a JAX info)."""
    if value is None or isinstance(value, jax.core.Tracer):
        return False
    if isinstance(value, int | float | np.ndarray | np.generic | jax.Array):
        return np.asarray(value).dtype.kind in "biuf"
    return False


class RoundCost(flax.struct.PyTreeNode):
    """One round's cost. Per link `[S, K]` (receiver, list column): ``attempts`` int32,
    ``delivered`` (after ARQ and the deadline; column 0 True), ``straggler`` (arrived after
    the deadline). Per slot `[S]`: ``bits_sent``, ``airtime_s``, ``energy_j`` (as a sender,
    every attempt), ``finish_s`` (as a receiver: when its round ended). ``round_s`` `[]`:
    the synchronous round's length (its slowest active slot)."""

    attempts: jax.Array
    delivered: jax.Array
    straggler: jax.Array
    bits_sent: jax.Array
    airtime_s: jax.Array
    energy_j: jax.Array
    finish_s: jax.Array
    round_s: jax.Array


def subchannel_hz(channel: ChannelParams) -> Any:
    """``W / F``: the bandwidth of one of the paper's `F` sub-channels."""
    return channel.bandwidth_hz / channel.num_subchannels


class CostSetup(flax.struct.PyTreeNode):
    """What a run's rounds need to count their cost, built once on the host
    (``make_cost_setup``); every field a leaf but ``params``' static ones.

    Attributes:
      params: `CostParams`.
      payload_bits: `[]` or `[S]` bits each slot sends a listed neighbor in a round (header
        excluded; 0: the slot sends nothing). The runner sets it from the method's
        declaration (`algorithms.payload`) at ``value_bits``.
      compute_s: `[S]` each slot's local training time in a round (s).
      compute_w: `[S]` each slot's power draw while training (W).
      value_bits: `[]` bits a parameter is sent with (the config's ``bits_per_param``).
    """

    params: CostParams
    payload_bits: jax.Array
    compute_s: jax.Array
    compute_w: jax.Array
    value_bits: Any = 32.0


def make_cost_setup(
    params: CostParams,
    payload_bits: Any,
    devices: Devices,
    flops_per_sample: float,
    samples: Any,
    epochs: int,
    value_bits: float = 32.0,
) -> CostSetup:
    """The `CostSetup` of a run: ``payload_bits`` (a compressor's ``bits(tree)``), each slot's
    device (`compute.Devices`) and its training work (``flops_per_sample x samples [S] x
    epochs``, ``compute.compute_seconds``), parameters sent at ``value_bits`` bits."""
    compute = compute_seconds(flops_per_sample, samples, epochs, devices.flops_per_s)
    payload = jnp.asarray(payload_bits, jnp.float32)
    return CostSetup(params, payload, compute, devices.power_w, jnp.float32(value_bits))


def round_cost(
    key: jax.Array,
    setup: CostSetup,
    channel: ChannelParams,
    gamma_th: Any,
    neighbors: jax.Array,
    listed: jax.Array,
    received: jax.Array,
    perr: Any,
    sinr: jax.Array | None = None,
    active: jax.Array | None = None,
) -> RoundCost:
    """The cost of a round and which listed links deliver (`RoundCost`).

    Args:
      key: this round's cost key (ARQ retries).
      setup: `CostSetup` (the cost model, payload, each slot's compute time and power). A
        sender of payload 0 (Local) uses no airtime: its links' draw stands as it is.
      channel, gamma_th: the channel (sub-channel bandwidth, transmit power) and threshold.
      neighbors, listed, received: `[S, K]` the lists, their real entries and the link
        model's draw of the first attempt. perr: `[S, K]` (or scalar) per-attempt failure.
      sinr: `[S, K]` linear SINR (``"shannon"`` / ``"mcs"``), else None.
      active: `[S]` real slots (default all): only they set the round's length and spend
        energy (a sweep's padding slots list no links, so they send nothing either).
    """
    cost, compute_s, s = setup.params, setup.compute_s, neighbors.shape[0]
    payload = jnp.broadcast_to(jnp.asarray(setup.payload_bits, jnp.float32), (s,))[neighbors]
    silent = payload <= 0  # the sender sends nothing: no traffic, the draw stands
    used = listed.at[:, 0].set(False) & ~silent
    rate = link_rate(
        cost.rate_model, sinr, subchannel_hz(channel), gamma_th, cost.efficiency, cost.mcs_table
    )
    used = used & (jnp.broadcast_to(rate, used.shape) > 0)
    attempts, ok = arq_attempts(key, received, perr, cost.retries)
    attempts = jnp.where(used, attempts, 0)
    bits = (payload + cost.header_bits) * attempts
    airtime = jnp.where(used, bits / jnp.where(used, rate, 1.0), 0.0)
    finish = _finish_times(cost.reception, compute_s[neighbors], airtime, used)
    straggler = used & ok & (finish > cost.deadline_s)
    waited = jnp.where(used, jnp.minimum(finish, cost.deadline_s), 0.0)
    finish_s = jnp.maximum(compute_s, waited.max(axis=1))
    by_sender = _by_sender(neighbors, s)
    airtime_s = by_sender(airtime)
    real = jnp.ones((s,), bool) if active is None else active
    energy = jnp.where(real, channel.tx_power_w * airtime_s + setup.compute_w * compute_s, 0.0)
    return RoundCost(
        attempts=attempts.astype(jnp.int32),
        delivered=jnp.where(silent, received, used & ok & ~straggler).at[:, 0].set(True),
        straggler=straggler,
        bits_sent=by_sender(bits),
        airtime_s=airtime_s,
        energy_j=energy.astype(jnp.float32),
        finish_s=finish_s.astype(jnp.float32),
        round_s=jnp.where(real, finish_s, 0.0).max().astype(jnp.float32),
    )


def cost_records(cost: RoundCost) -> dict[str, jax.Array]:
    """A round's cost as records: per slot `[S]` ``bits_sent``, ``airtime_s``, ``energy_j``
    (as sender) and ``finish_s`` (as receiver), ``round_s`` `[]`, per link `[S, K]`
    ``link_attempts`` and ``link_straggler``. The clock is the running sum of ``round_s``."""
    return {
        "bits_sent": cost.bits_sent,
        "airtime_s": cost.airtime_s,
        "energy_j": cost.energy_j,
        "finish_s": cost.finish_s,
        "round_s": cost.round_s,
        "link_attempts": cost.attempts,
        "link_straggler": cost.straggler,
    }


def _by_sender(neighbors: jax.Array, s: int) -> Any:
    """``f(values [S, K]) -> [S]``: each sender's sum over the links it sends on."""
    return lambda v: jnp.zeros((s,), jnp.float32).at[neighbors].add(v.astype(jnp.float32))


def _finish_times(
    reception: str, ready: jax.Array, airtime: jax.Array, used: jax.Array
) -> jax.Array:
    """`[S, K]` when each used link's model (all its attempts) has reached its receiver."""
    if reception == "parallel":
        return ready + airtime
    # serial: per receiver, links in ready order (ties by column); link k ends at
    # C_k + max_{l <= k} (r_l - C_l + a_l), C_k the airtime of k and every link before it
    # (one server queue). K x K comparisons a receiver instead of a sort.
    r = jnp.where(used, ready, -jnp.inf)
    k = jnp.arange(r.shape[1])
    before = (r[:, None, :] < r[:, :, None]) | (
        (r[:, None, :] == r[:, :, None]) & (k[None, :] <= k[:, None])
    )  # [S, k, l]: link l is served no later than link k
    c = jnp.where(before, airtime[:, None, :], 0.0).sum(axis=2)
    slack = jnp.where(before, (r - c + airtime)[:, None, :], -jnp.inf).max(axis=2)
    finish = c + slack
    return jnp.where(used, finish, 0.0)
