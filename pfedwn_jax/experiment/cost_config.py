"""The cost model's config fields (`ExperimentConfig.cost` and its settings), checked.

`check_cost(config)` checks them as the config stores them; `cost_params(config)` is the
`wireless.cost.CostParams` of a run. Kept apart from `experiment.config` so that module
stays one screenful of fields per concern.
"""

from __future__ import annotations

import math
from typing import Any

from pfedwn_jax._checks import INT32_MAX, check_bool, check_choice, check_float, check_int
from pfedwn_jax.wireless.compute import DEVICE_DISTRIBUTIONS, DEVICE_PROFILES
from pfedwn_jax.wireless.cost import RECEPTIONS, CostParams
from pfedwn_jax.wireless.rates import RATE_MODELS

#: Rate models that take each link's rate from its SINR in the round: only the physical
#: link model draws one (its fading and interference); the others have a P_err only.
SINR_RATE_MODELS = ("shannon", "mcs")


def check_cost(cfg: Any) -> dict[str, Any]:
    """Checked cost fields of config `cfg`; a ValueError names the field and what is allowed."""
    deadline = math.inf if cfg.deadline_s is None else cfg.deadline_s  # None (JSON): none
    if not (isinstance(deadline, float) and deadline == math.inf):
        deadline = check_float("deadline_s", deadline, 0.0, low_inclusive=False)
    profiles = cfg.device_profiles
    if isinstance(profiles, str):
        profiles = (profiles,)
    if not isinstance(profiles, list | tuple) or not profiles:
        raise ValueError(
            f"device_profiles must be a non-empty list of {sorted(DEVICE_PROFILES)}; "
            f"got {cfg.device_profiles!r}"
        )
    cost, rate_model = (
        check_bool("cost", cfg.cost),
        check_choice("rate_model", cfg.rate_model, RATE_MODELS),
    )
    if cost and rate_model in SINR_RATE_MODELS and cfg.link_model != "physical":
        raise ValueError(
            f"rate_model={rate_model!r} takes each link's rate from its SINR, which only "
            f"link_model='physical' draws; got link_model={cfg.link_model!r} (use "
            "rate_model='threshold' with it)"
        )
    return {
        "cost": cost,
        "rate_model": rate_model,
        "reception": check_choice("reception", cfg.reception, RECEPTIONS),
        "rate_efficiency": check_float(
            "rate_efficiency", cfg.rate_efficiency, 0.0, 1.0, low_inclusive=False
        ),
        "retries": check_int("retries", cfg.retries, 0, INT32_MAX),
        "header_bits": check_float("header_bits", cfg.header_bits, 0.0),
        "deadline_s": deadline,
        "bits_per_param": check_int("bits_per_param", cfg.bits_per_param, 1, 64),
        "device_distribution": check_choice(
            "device_distribution", cfg.device_distribution, DEVICE_DISTRIBUTIONS
        ),
        "device_profiles": tuple(
            check_choice("device_profiles", p, tuple(DEVICE_PROFILES)) for p in profiles
        ),
    }


def cost_params(cfg: Any) -> CostParams:
    """The `CostParams` of config `cfg` (its numbers as float32 / int32 leaves)."""
    return CostParams(
        rate_model=cfg.rate_model,
        reception=cfg.reception,
        efficiency=float(cfg.rate_efficiency),
        retries=int(cfg.retries),
        header_bits=float(cfg.header_bits),
        deadline_s=float(cfg.deadline_s),
    )
