"""Link rates from SINR: Shannon with an efficiency factor, or an MCS table (802.11ax).

Every function is elementwise over arrays of links (any shape, e.g. `[S, K]`), jittable.

- ``"shannon"``: ``rate = efficiency W_sub log2(1 + SINR)``, the capacity of the link's
  sub-channel (``W_sub = W / F``: the band split into the paper's `F` sub-channels) scaled by
  how close the modem gets to it.
- ``"mcs"``: ``rate = W_sub eta_m``, with `m` the highest MCS whose SINR threshold the link
  meets; below the lowest threshold the rate is 0 (outage: the link cannot carry the model).
- ``"threshold"``: the fixed-rate code of the paper's error model: a transmission decodes iff
  its SINR >= gamma_th, i.e. the code runs at ``efficiency W_sub log2(1 + gamma_th)``, the
  same on every link. Needs no per-link SINR (the ``bernoulli`` link model has none).

The default MCS table is 802.11ax (HE SU, one spatial stream, 0.8 us guard interval):
spectral efficiencies are the standard's 20 MHz data rates (8.6 ... 143.4 Mb/s) over 20 MHz;
SINR thresholds are the standard's 20 MHz minimum receiver sensitivities (-82 ... -52 dBm)
over the noise floor they assume, ``-174 dBm/Hz + 10 log10(20 MHz) + 10 dB`` noise figure
(-91 dBm); see docs/wireless.md.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from pfedwn_jax._checks import check_choice

RATE_MODELS = ("threshold", "shannon", "mcs")

#: 802.11ax HE-SU MCS 0-11, 1 spatial stream, 0.8 us GI: 20 MHz data rates (Mb/s) / 20 MHz.
HE_RATES_MBPS = (8.6, 17.2, 25.8, 34.4, 51.6, 68.8, 77.4, 86.0, 103.2, 114.7, 129.0, 143.4)
#: Their minimum receiver sensitivities at 20 MHz (dBm).
HE_SENSITIVITY_DBM = (-82, -79, -77, -74, -70, -66, -65, -64, -59, -57, -54, -52)
#: The noise floor those sensitivities assume: -174 dBm/Hz + 10 log10(20e6) + 10 dB (dBm).
HE_NOISE_FLOOR_DBM = -174.0 + 10.0 * np.log10(20e6) + 10.0

#: (SINR thresholds in dB, spectral efficiencies in b/s/Hz), ascending: the default table.
HE_MCS_TABLE: tuple[tuple[float, ...], tuple[float, ...]] = (
    tuple(round(float(s - HE_NOISE_FLOOR_DBM), 2) for s in HE_SENSITIVITY_DBM),
    tuple(round(r / 20.0, 4) for r in HE_RATES_MBPS),
)


def db_to_linear(db: Any) -> Any:
    """``10^(db / 10)``."""
    return 10.0 ** (jnp.asarray(db, jnp.float32) / 10.0)


def shannon_rate(sinr: Any, bandwidth_hz: Any, efficiency: Any = 1.0) -> Any:
    """``efficiency * bandwidth_hz * log2(1 + sinr)`` in bit/s (`sinr` linear, >= 0); via
    ``log1p``, so a faint link (SINR 1e-5: seconds per bit) keeps float32's precision."""
    return efficiency * bandwidth_hz * (jnp.log1p(jnp.maximum(sinr, 0.0)) / np.log(2.0))


def mcs_index(sinr: Any, thresholds_db: Any) -> Any:
    """The highest MCS `m` (int32) with ``sinr >= thresholds[m]`` (linear `sinr`, ascending
    `thresholds_db`), -1 below the lowest."""
    thresholds = db_to_linear(jnp.asarray(thresholds_db, jnp.float32))
    return (jnp.asarray(sinr)[..., None] >= thresholds).sum(-1).astype(jnp.int32) - 1


def mcs_rate(sinr: Any, bandwidth_hz: Any, table: Any = HE_MCS_TABLE) -> Any:
    """``bandwidth_hz * eta[m]`` in bit/s for the MCS `m` the SINR meets (0 below the table)."""
    thresholds_db, efficiency = table
    _check_table(thresholds_db, efficiency)
    m = mcs_index(sinr, thresholds_db)
    eta = jnp.asarray(efficiency, jnp.float32)[jnp.maximum(m, 0)]
    return jnp.where(m >= 0, bandwidth_hz * eta, 0.0)


def _check_table(thresholds_db: Any, efficiency: Any) -> None:
    t, e = np.asarray(thresholds_db, float), np.asarray(efficiency, float)
    if t.ndim != 1 or t.shape != e.shape or t.size == 0:
        raise ValueError(
            "an MCS table is (thresholds_db, efficiencies), two 1-D sequences of one length; "
            f"got shapes {t.shape} and {e.shape}"
        )
    if np.any(np.diff(t) <= 0) or np.any(np.diff(e) <= 0) or np.any(e <= 0):
        raise ValueError(
            "an MCS table's thresholds and efficiencies must be positive and strictly "
            f"increasing; got {t.tolist()} and {e.tolist()}"
        )


def link_rate(
    model: str,
    sinr: Any,
    bandwidth_hz: Any,
    gamma_th: Any,
    efficiency: Any = 1.0,
    table: Any = HE_MCS_TABLE,
) -> Any:
    """The rate (bit/s) of links with SINR ``sinr`` (linear; unused by ``"threshold"``, may be
    None there) on sub-channels of ``bandwidth_hz``, under the rate ``model`` (``RATE_MODELS``)."""
    check_choice("rate_model", model, RATE_MODELS)
    if model == "threshold":
        rate = shannon_rate(gamma_th, bandwidth_hz, efficiency)
        return rate if sinr is None else jnp.broadcast_to(rate, jnp.shape(sinr))
    if sinr is None:
        raise ValueError(f"rate_model={model!r} needs each link's SINR; 'threshold' does not")
    if model == "shannon":
        return shannon_rate(sinr, bandwidth_hz, efficiency)
    return mcs_rate(sinr, bandwidth_hz, table)
