"""The selection sweeps of the paper's Fig. 5 and Fig. 6, as vectorised grids.

Fig. 5: the mean number of selected neighbors over |F| x PPP density x gamma_th (eps 0.05);
Fig. 6: the mean |M_n| against |G_n| = 1..30 neighbors in the area, per (eps, gamma_th).
Used by `scripts/neighbor_selection_sweeps.py` and `pfedwn_jax.reproduce.wireless_figs`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pfedwn_jax.wireless import error_probability, place_uniform, sample_ppp, select_neighbors
from pfedwn_jax.wireless.params import ChannelParams

SUBCHANNELS = np.arange(8, 21)
DENSITIES = np.round(np.arange(1, 16) * 0.5e-3, 6)
GAMMAS = np.array([5.0, 10.0, 15.0])
FIG6_EPS = np.array([0.01, 0.03, 0.05, 0.1])
FIG6_GAMMA_A = 5.0
MAX_NEIGHBORS = 30


def fig5_grid(
    key: Any, draws: int, max_nodes: int, moments: str, eps: float = 0.05
) -> dict[str, Any]:
    """Mean selected count [gamma, F, density] and mean node count [density]."""
    params = ChannelParams()
    k_t, k_p = jax.random.split(key)
    targets = jax.random.uniform(k_t, (len(DENSITIES), draws, 2)) * params.area_m
    keys = jax.random.split(k_p, (len(DENSITIES), draws))
    dens = jnp.broadcast_to(jnp.asarray(DENSITIES)[:, None], keys.shape)
    xy, valid = jax.jit(jax.vmap(jax.vmap(lambda k, d: sample_ppp(k, d, params, max_nodes))))(
        keys, dens
    )

    def per_f(f: Any) -> Any:
        p = dataclasses.replace(params, num_subchannels=f)
        perr = error_probability(
            targets, xy, jnp.asarray(GAMMAS)[:, None, None], p, moments, valid
        )  # [gamma, density, draw, node]
        return select_neighbors(perr, eps, valid).sum(-1).mean(-1)  # [gamma, density]

    counts = jax.vmap(per_f)(jnp.asarray(SUBCHANNELS))  # [F, gamma, density]
    return {
        "num_subchannels": SUBCHANNELS.tolist(),
        "density_per_m2": DENSITIES.tolist(),
        "gamma_th": GAMMAS.tolist(),
        "eps": eps,
        "draws": draws,
        "max_nodes": max_nodes,
        "truncated_draws": int(np.sum(np.asarray(valid).all(-1))),
        "mean_nodes": np.asarray(valid).sum(-1).mean(-1).tolist(),
        "mean_selected": np.transpose(np.asarray(counts), (1, 0, 2)).tolist(),
    }


def fig6_grid(key: Any, draws: int, moments: str) -> dict[str, Any]:
    """Mean |M_n| vs |G_n| = 1..30 for each (gamma_th, eps)."""
    gammas = np.unique(np.concatenate([GAMMAS, [FIG6_GAMMA_A]]))
    keys = jax.random.split(key, draws)
    t, nb = jax.jit(jax.vmap(place_uniform, (0, None)), static_argnums=1)(keys, MAX_NEIGHBORS)
    sizes = np.arange(1, MAX_NEIGHBORS + 1)
    valid = jnp.arange(MAX_NEIGHBORS) < jnp.asarray(sizes)[:, None, None]  # [G, 1, n]
    valid = jnp.broadcast_to(valid, (len(sizes), draws, MAX_NEIGHBORS))
    perr = error_probability(
        t, nb, jnp.asarray(gammas)[:, None, None], None, moments, valid
    )  # [gamma, G, draw, n]
    chosen = select_neighbors(
        perr[None], jnp.asarray(FIG6_EPS)[:, None, None, None, None], valid
    )  # [eps, gamma, G, draw, n]
    mean = np.asarray(chosen.sum(-1).mean(-1))  # [eps, gamma, G]
    return {
        "num_neighbors": sizes.tolist(),
        "gamma_th": gammas.tolist(),
        "eps": FIG6_EPS.tolist(),
        "draws": draws,
        "mean_selected": mean.tolist(),
    }
