"""Time-to-accuracy and energy-to-accuracy: where a curve first reaches a target.

Pure NumPy over curves with a leading batch of runs (`[..., R]`, one entry per recorded
round). The x axis is whatever was spent by that round: the cumulative simulated clock
(``clock_s``), the cumulative energy (``energy_j`` summed over slots and rounds), bits, or
the round number itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def cumulative(per_round: Any) -> np.ndarray:
    """`[..., R]` running total of a per-round cost `[..., R]` (the round's spend included)."""
    return np.cumsum(np.asarray(per_round, np.float64), axis=-1)


def first_reaching(values: Any, spent: Any, target: float, relative: bool = False) -> np.ndarray:
    """`[...]` the ``spent`` (`[..., R]`, non-decreasing) at the first round whose ``values``
    (`[..., R]`, e.g. accuracy) reach ``target``: an absolute level, or with ``relative`` a
    fraction of the curve's final value. NaN where the curve never reaches it (or its
    final value is NaN)."""
    values, spent = np.asarray(values, np.float64), np.asarray(spent, np.float64)
    if values.shape != spent.shape or values.ndim < 1 or values.shape[-1] == 0:
        raise ValueError(
            "values and spent must be curves of one shape [..., rounds]; "
            f"got {values.shape} and {spent.shape}"
        )
    if relative and not 0.0 < target <= 1.0:
        raise ValueError(f"a relative target must be in (0, 1]; got {target!r}")
    level = target * values[..., -1:] if relative else np.full((*values.shape[:-1], 1), target)
    hit = values >= level  # NaN compares False
    first = np.argmax(hit, axis=-1)
    found = np.take_along_axis(spent, first[..., None], -1)[..., 0]
    return np.where(hit.any(axis=-1), found, np.nan)


#: The summaries' time- and energy-to-accuracy (`Result.summary`, `SweepResult.summary`):
#: the simulated seconds (`clock_s`) and the joules spent (`cumulative_energy_j`) at which
#: the target accuracy first reaches this fraction of its final value, under the keys
#: `TIME_TO_KEY` and `ENERGY_TO_KEY`.
TIME_TO_FRACTION = 0.9
TIME_TO_KEY = "time_to_90"
ENERGY_TO_KEY = "energy_to_90"
#: summary key -> the cumulative per-round column it reads the spend from.
SPENT_COLUMNS = {TIME_TO_KEY: "clock_s", ENERGY_TO_KEY: "cumulative_energy_j"}


def time_to_accuracy(accuracy: Any, clock_s: Any) -> np.ndarray:
    """`[...]` simulated seconds at which ``accuracy [..., R]`` first reaches
    `TIME_TO_FRACTION` of its final value (``clock_s [..., R]``; NaN: never)."""
    return first_reaching(accuracy, clock_s, TIME_TO_FRACTION, relative=True)


def energy_to_accuracy(accuracy: Any, energy_j: Any) -> np.ndarray:
    """`[...]` joules spent (``energy_j [..., R]``, cumulative over rounds, all slots) when
    ``accuracy [..., R]`` first reaches `TIME_TO_FRACTION` of its final value (NaN: never)."""
    return first_reaching(accuracy, energy_j, TIME_TO_FRACTION, relative=True)


def to_accuracy(accuracy: Any, columns: Any) -> dict[str, np.ndarray]:
    """Each summary key of `SPENT_COLUMNS` whose column ``columns`` (a mapping, e.g. a
    `Result` entry or a run's rows) holds: the spend at 90% of the final ``accuracy``."""
    return {
        key: first_reaching(accuracy, columns[col], TIME_TO_FRACTION, relative=True)
        for key, col in SPENT_COLUMNS.items()
        if col in columns
    }
