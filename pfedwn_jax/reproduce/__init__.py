"""Reproduction of the paper's tables and figures.

`cases`: the target-client cases (Case 1-3, the 20-neighbor network); `wireless_figs`: Fig. 4-7
(P_err heatmaps, selection sweeps, data distributions). The learning part (Table II/III,
Fig. 1, 8, 9): `presets` (what a preset runs), `runs` (the sweeps and the choice of
hyperparameters on validation), `tables`, `figures`, `report` (REPORT.md), and
`learning.reproduce`, the entry point. Beyond the paper: `crossover` (where collaboration
pays: every method against Local over the clients' sample cap and the neighbors' classes).
"""

from pfedwn_jax.reproduce.cases import (
    Case,
    case_rows,
    network20_case,
    paper_cases,
)
from pfedwn_jax.reproduce.learning import reproduce
from pfedwn_jax.reproduce.wireless_figs import (
    FIGURES,
    fig4,
    fig5,
    fig6,
    fig7,
    preset_config,
    shared_data_dir,
)

__all__ = [
    "FIGURES",
    "Case",
    "case_rows",
    "fig4",
    "fig5",
    "fig6",
    "fig7",
    "network20_case",
    "paper_cases",
    "preset_config",
    "reproduce",
    "shared_data_dir",
]
