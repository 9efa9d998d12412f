"""Channel parameters of the D2D link model (paper Table I).

`ChannelParams` is a frozen dataclass registered as a JAX pytree (`flax.struct.PyTreeNode`):
every numeric field is a leaf, so a sweep over e.g. the number of sub-channels is one
`jax.vmap` over a `ChannelParams` whose `num_subchannels` is an array. Validation runs on
construction for concrete values only (inside `jit`/`vmap` the fields are tracers and are
left alone).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from flax import struct

from pfedwn_jax._checks import check_finite, check_range
from pfedwn_jax.wireless.fading import Fading

SPEED_OF_LIGHT = 299_792_458.0  # m/s

# field -> (low, low_inclusive); every field is also bounded above by +inf (exclusive).
_BOUNDS: dict[str, tuple[float, bool]] = {
    "area_m": (0.0, False),
    "num_subchannels": (1.0, True),
    "pathloss_exp": (0.0, False),
    "d0_m": (0.0, False),
    "tx_power_w": (0.0, False),
    "freq_hz": (0.0, False),
    "boltzmann": (0.0, False),
    "noise_temp_k": (0.0, True),
    "bandwidth_hz": (0.0, False),
    "fading_threshold": (0.0, True),
    "shadowing_db": (0.0, True),
}


def _concrete_numeric(value: Any) -> np.ndarray | None:
    """`value` as a numpy array if it is a concrete number/array, else None (tracer, sentinel)."""
    if isinstance(value, jax.core.Tracer):
        return None
    try:
        arr = np.asarray(value)
    except Exception:
        return None
    if arr.dtype.kind not in "biuf":
        return None
    return arr


class ChannelParams(struct.PyTreeNode):
    """Physical constants of the wireless model; defaults are the paper's Table I.

    Fields may be Python numbers or arrays (for vmapped sweeps). Units: metres, watts,
    hertz, kelvin, dB. `fading` is the small-scale fading model (`wireless.fading.Fading`:
    Rayleigh with Gamma = E[h^2] = 2 by default); `fading_threshold` is beta (on the fading
    amplitude h); `shadowing_db` the standard deviation (dB) of the log-normal shadowing of
    the path loss (0: none; its draws are per link and topology, `fading.shadowing_db`).
    `replace(**changes)` returns a copy with some fields changed (validated again).
    """

    area_m: Any = 50.0
    num_subchannels: Any = 14
    fading: Fading = Fading()
    pathloss_exp: Any = 3.0
    d0_m: Any = 1.0
    tx_power_w: Any = 0.2
    freq_hz: Any = 2.4e9
    boltzmann: Any = 1.38e-23
    noise_temp_k: Any = 290.0
    bandwidth_hz: Any = 100e6
    fading_threshold: Any = 2.0
    shadowing_db: Any = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.fading, Fading):
            self.fading.validate()
        elif _concrete_numeric(self.fading) is not None:
            raise ValueError(
                f"ChannelParams.fading must be a wireless.fading.Fading (e.g. "
                f"Fading.of('nakagami', 2.0)); got {self.fading!r}"
            )
        for name, (low, low_inc) in _BOUNDS.items():
            arr = _concrete_numeric(getattr(self, name))
            if arr is None:
                continue
            check_finite(f"ChannelParams.{name}", arr.astype(float))
            check_range(
                f"ChannelParams.{name}", arr, low, None, low_inclusive=low_inc, high_inclusive=False
            )
            if name == "num_subchannels" and not np.all(np.mod(arr, 1) == 0):
                bad = arr[np.mod(arr, 1) != 0].ravel()[0]
                raise ValueError(
                    f"ChannelParams.num_subchannels must be an integer >= 1; got {bad!r}"
                )

    # Derived quantities (work on traced fields too).
    @property
    def wavelength_m(self) -> Any:
        """lambda = c / f."""
        return SPEED_OF_LIGHT / self.freq_hz

    @property
    def noise_w(self) -> Any:
        """Thermal noise power sigma^2 = kappa T W."""
        return self.boltzmann * self.noise_temp_k * self.bandwidth_hz

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dict of the fields (arrays become lists), for JSON records."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "fading":
                out[f.name] = self.fading.to_dict()
                continue
            v = np.asarray(getattr(self, f.name))
            out[f.name] = v.item() if v.ndim == 0 else v.tolist()
        return out


#: Numeric `ChannelParams` fields a settings mapping may override, plus "fading_gamma"
#: (Gamma = E[h^2] of the fading). The fading model and the shadowing deviation are
#: separate arguments of `channel_params_from`.
CHANNEL_OVERRIDES = tuple(
    sorted(
        [k for k in _BOUNDS if k != "shadowing_db"] + ["fading_gamma"],
    )
)


def channel_params_from(
    overrides: Any = None,
    fading: str = "rayleigh",
    fading_param: Any = None,
    shadowing_db: Any = 0.0,
) -> ChannelParams:
    """`ChannelParams` from plain settings: numeric `overrides` (keys in `CHANNEL_OVERRIDES`),
    the fading model `fading` with its shape `fading_param` (None: the value at which it is
    Rayleigh) and the shadowing deviation `shadowing_db` (dB)."""
    over = dict(overrides or {})
    unknown = sorted(set(over) - set(CHANNEL_OVERRIDES))
    if unknown:
        raise ValueError(f"channel: unknown field(s) {unknown}; allowed: {list(CHANNEL_OVERRIDES)}")
    model = Fading.of(fading, fading_param, over.pop("fading_gamma", 2.0))
    return ChannelParams(fading=model, shadowing_db=shadowing_db, **over)
