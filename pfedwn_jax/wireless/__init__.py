"""D2D wireless channel model of pFedWN: P_err, neighbor selection, topologies, Monte Carlo.

See docs/wireless.md for the model, the three interference-moment modes and validation, and
docs/robustness.md for per-round link realisations (`links`) and mobility (`mobility`).
"""

from pfedwn_jax.wireless.channel import (
    MOMENT_MODES,
    best_channel_moments,
    interference_ccdf,
    interferer_moments,
    log_noise_power,
    lognormal_from_moments,
    lognormal_params,
    path_gain,
    rayleigh_pdf,
    threshold_moments,
    transmit_probability,
)
from pfedwn_jax.wireless.fading import FADING_KINDS, Fading, draw_power, shadowing_db
from pfedwn_jax.wireless.links import (
    LINK_MODELS,
    LinkAge,
    bernoulli_received,
    check_link_model,
    nearest_interferers,
    physical_received,
)
from pfedwn_jax.wireless.mobility import GaussianWalk, RandomWaypoint
from pfedwn_jax.wireless.montecarlo import simulate_links
from pfedwn_jax.wireless.neighbors import candidate_neighbors
from pfedwn_jax.wireless.params import ChannelParams
from pfedwn_jax.wireless.perr import (
    error_probability,
    interference_ratios,
    link_geometry,
    power_ratio_matrix,
)
from pfedwn_jax.wireless.selection import eps_ceiling_message, perr_ceiling, select_neighbors
from pfedwn_jax.wireless.sparse_perr import (
    far_field_sums,
    interferer_sets,
    sparse_error_probability,
)
from pfedwn_jax.wireless.topology import place_network, place_uniform, sample_ppp, topology_keys

__all__ = [
    "FADING_KINDS",
    "LINK_MODELS",
    "MOMENT_MODES",
    "ChannelParams",
    "Fading",
    "GaussianWalk",
    "LinkAge",
    "RandomWaypoint",
    "bernoulli_received",
    "best_channel_moments",
    "candidate_neighbors",
    "check_link_model",
    "draw_power",
    "eps_ceiling_message",
    "error_probability",
    "far_field_sums",
    "interference_ccdf",
    "interference_ratios",
    "interferer_moments",
    "interferer_sets",
    "link_geometry",
    "log_noise_power",
    "lognormal_from_moments",
    "lognormal_params",
    "nearest_interferers",
    "path_gain",
    "perr_ceiling",
    "physical_received",
    "place_network",
    "place_uniform",
    "power_ratio_matrix",
    "rayleigh_pdf",
    "sample_ppp",
    "select_neighbors",
    "shadowing_db",
    "simulate_links",
    "sparse_error_probability",
    "threshold_moments",
    "topology_keys",
    "transmit_probability",
]
