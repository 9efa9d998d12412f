"""D2D wireless channel model of pFedWN: P_err, neighbor selection, topologies, Monte Carlo.

See docs/wireless.md for the model, the three interference-moment modes and validation.
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
from pfedwn_jax.wireless.montecarlo import INTERFERENCE_MODES, simulate_links
from pfedwn_jax.wireless.neighbors import candidate_neighbors
from pfedwn_jax.wireless.params import SPEED_OF_LIGHT, ChannelParams
from pfedwn_jax.wireless.perr import (
    error_probability,
    interference_ratios,
    link_geometry,
    power_ratio_matrix,
)
from pfedwn_jax.wireless.selection import select_neighbors
from pfedwn_jax.wireless.sparse_perr import (
    CUTOFF_MODES,
    TAIL_MODES,
    far_field_sums,
    interferer_sets,
    sparse_error_probability,
)
from pfedwn_jax.wireless.topology import place_network, place_uniform, sample_ppp, topology_keys

__all__ = [
    "CUTOFF_MODES",
    "INTERFERENCE_MODES",
    "MOMENT_MODES",
    "SPEED_OF_LIGHT",
    "TAIL_MODES",
    "ChannelParams",
    "best_channel_moments",
    "candidate_neighbors",
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
    "path_gain",
    "place_network",
    "place_uniform",
    "power_ratio_matrix",
    "rayleigh_pdf",
    "sample_ppp",
    "select_neighbors",
    "simulate_links",
    "sparse_error_probability",
    "threshold_moments",
    "topology_keys",
    "transmit_probability",
]
