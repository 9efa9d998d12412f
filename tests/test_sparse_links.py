"""Candidate links and truncated-interference P_err of large networks (wireless/neighbors.py,
wireless/sparse_perr.py), against brute force, the dense `network_perr`, explicit reduced
interferer sets (JAX and scipy) and a Monte Carlo of the log-normal model."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from pfedwn_jax.experiment.federation import network_perr
from pfedwn_jax.wireless import (
    ChannelParams,
    candidate_neighbors,
    error_probability,
    interferer_sets,
    simulate_links,
    sparse_error_probability,
)
from pfedwn_jax.wireless import neighbors as neighbors_mod
from pfedwn_jax.wireless import sparse_perr as sparse_mod
from pfedwn_jax.wireless.reference import error_probability_reference, received_power_scale
from pfedwn_jax.wireless.sparse_perr import far_field_sums

P = ChannelParams()


def _brute(xy: np.ndarray, k: int | None = None, radius: float | None = None):
    """Reference candidates: full [N, N] squared distances (same float64 expression), each row
    sorted by (distance, index), self and out-of-radius nodes dropped."""
    n = len(xy)
    dx = xy[None, :, 0] - xy[:, None, 0]
    dy = xy[None, :, 1] - xy[:, None, 1]
    d2 = dx * dx + dy * dy
    np.fill_diagonal(d2, np.inf)
    if radius is not None:
        d2 = np.where(d2 <= radius * radius, d2, np.inf)
    rows = []
    for i in range(n):
        order = sorted(range(n), key=lambda j: (d2[i, j], j))  # plain loop: (distance, index)
        rows.append([j for j in order if np.isfinite(d2[i, j])])
    width = k if k is not None else max(1, max(len(r) for r in rows))
    idx = np.array([[r[c] if c < len(r) else i for c in range(width)] for i, r in enumerate(rows)])
    mask = np.array([[c < len(r) for c in range(width)] for r in rows])
    return idx, mask


def _layouts() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "uniform": rng.uniform(0.0, 100.0, (120, 2)),
        "lattice_ties": np.round(rng.uniform(0.0, 6.0, (120, 2))),  # many equal distances
        "sparse": rng.uniform(0.0, 1e4, (60, 2)),  # radius far below the spacing
        "coincident": np.zeros((6, 2)),
    }


@pytest.mark.parametrize("layout", list(_layouts()))
@pytest.mark.parametrize(
    "kw", [{"k": 1}, {"k": 5}, {"k": "all"}, {"radius": 2.0}, {"radius": 9.0}, {"radius": 1e6},
           {"k": 4, "radius": 3.0}],
)  # fmt: skip
def test_candidates_equal_brute_force(layout, kw):
    xy = _layouts()[layout]
    kw = {**kw, "k": len(xy) - 1} if kw.get("k") == "all" else kw
    idx, mask = candidate_neighbors(xy, **kw)
    ref_idx, ref_mask = _brute(xy, **kw)
    assert idx.dtype == np.int32 and mask.dtype == bool
    np.testing.assert_array_equal(mask, ref_mask)
    np.testing.assert_array_equal(idx, ref_idx)


def test_candidates_chunked_equal_unchunked(monkeypatch):
    xy = np.random.default_rng(1).uniform(0.0, 300.0, (400, 2))
    whole = candidate_neighbors(xy, radius=40.0), candidate_neighbors(xy, k=7)
    monkeypatch.setattr(neighbors_mod, "_CHUNK_ELEMENTS", 64)  # one or two rows per chunk
    small = candidate_neighbors(xy, radius=40.0), candidate_neighbors(xy, k=7)
    for a, b in zip(whole, small, strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def _network(n: int, seed: int = 0, side: float = 150.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.0, side, (n, 2))


@pytest.mark.parametrize("k", [8, 59])
def test_all_equals_dense_network_perr(k):
    xy = _network(60)
    dense = network_perr(xy, 5.0, P, "paper")
    idx, mask = candidate_neighbors(xy, k=k)
    perr = np.asarray(sparse_error_probability(xy, idx, mask, 5.0, P))
    assert perr.shape == (60, k)
    np.testing.assert_allclose(perr, np.take_along_axis(dense, idx, 1), rtol=0, atol=1e-6)


def test_masked_slots_are_one_and_chunking_changes_nothing(monkeypatch):
    xy = _network(80, seed=2)
    idx, mask = candidate_neighbors(xy, radius=25.0)
    assert not mask.all()
    whole = np.asarray(sparse_error_probability(xy, idx, mask, 10.0, P))
    assert np.all(whole[~mask] == 1.0) and np.all(whole[mask] < 0.14)
    # 3 receivers per map step: 80 = 26 x 3 + 2, so the last step is padded
    monkeypatch.setattr(sparse_mod, "CHUNK_ELEMENTS", 3 * idx.shape[1] * 80)
    chunked = np.asarray(sparse_error_probability(xy, idx, mask, 10.0, P))
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-7)  # other fusion: rounding only


def test_full_cutoffs_equal_all():
    xy = _network(50, seed=3)
    idx, mask = candidate_neighbors(xy, k=10)
    full = np.asarray(sparse_error_probability(xy, idx, mask, 5.0, P))
    wide = sparse_error_probability(xy, idx, mask, 5.0, P, interference="radius", cutoff=1e4)
    every = sparse_error_probability(xy, idx, mask, 5.0, P, interference="nearest",
                                     num_interferers=49)  # fmt: skip
    np.testing.assert_allclose(np.asarray(wide), full, rtol=0, atol=1e-7)
    np.testing.assert_allclose(np.asarray(every), full, rtol=0, atol=1e-7)


def _reduced_sets(xy, idx, intf, links):
    """Explicit node sets of links (i, k): targets [L, 2], neighbors [L, W, 2] = j first, then
    R_i minus j, padded (valid [L, W]), built with plain loops."""
    sets = []
    for i, k in links:
        j = idx[i, k]
        sets.append(
            [j] + [r for r, ok in zip(intf[0][i], intf[1][i], strict=True) if ok and r != j]
        )
    width = max(len(s) for s in sets)
    nodes = np.array([s + [s[0]] * (width - len(s)) for s in sets])
    valid = np.array([[c < len(s) for c in range(width)] for s in sets])
    return xy[[i for i, _ in links]], xy[nodes], valid


@pytest.mark.parametrize(
    "mode", [{"interference": "radius", "cutoff": 30.0},
             {"interference": "nearest", "num_interferers": 6}],
)  # fmt: skip
def test_truncated_equals_explicit_interferer_set(mode):
    """Link j -> i with interferers R_i \\ {j} == error_probability on exactly that node set,
    and (float64) the link-by-link scipy reference."""
    xy = _network(90, seed=4)
    idx, mask = candidate_neighbors(xy, k=6)
    intf = interferer_sets(xy, **mode)
    perr = np.asarray(sparse_error_probability(xy, idx, mask, 5.0, P, **mode))
    links = [(i, k) for i in range(0, 90, 7) for k in (0, 3, 5)]
    sparse = np.array([perr[i, k] for i, k in links])
    t, nb, valid = _reduced_sets(xy, idx, intf, links)
    explicit = np.asarray(error_probability(t, nb, 5.0, P, valid=valid))[:, 0]
    np.testing.assert_allclose(sparse, explicit, rtol=0, atol=1e-6)
    with jax.enable_x64(True):
        p64 = np.asarray(sparse_error_probability(xy, idx, mask, 5.0, P, **mode))
    for n, (i, k) in enumerate(links[:8]):
        ref = error_probability_reference(t[n], nb[n], 5.0, P, valid=valid[n])[0]
        assert abs(p64[i, k] - ref) < 1e-9, (i, k, p64[i, k], ref)


def test_truncation_error_decreases_with_cutoff():
    xy = _network(300, seed=5, side=260.0)  # the default demo's density (11 nodes / 50 m^2)
    idx, mask = candidate_neighbors(xy, k=10)
    full = np.asarray(sparse_error_probability(xy, idx, mask, 5.0, P))
    errs = []
    for cutoff in (20.0, 60.0, 180.0):
        p = sparse_error_probability(xy, idx, mask, 5.0, P, interference="radius", cutoff=cutoff)
        errs.append(np.abs(np.asarray(p) - full).max())
        # (not monotone per link: dropping many weak interferers widens the log-normal)
        assert np.all((np.asarray(p) >= 0) & (np.asarray(p) <= np.exp(-2.0)))
    assert errs[0] > 0.05 and errs[0] > errs[1] > errs[2], errs
    assert errs[2] < 0.01, errs


def test_far_field_sums_match_exact_sums_of_uniform_nodes():
    """Mean-field sums beyond rho ~ the plain sums over the actual far nodes (numpy loop)."""
    xy = _network(800, seed=8, side=430.0)
    rho = np.where(np.arange(800) % 2 == 0, 50.0, 120.0)
    t1, t2 = (np.asarray(t, float) for t in far_field_sums(xy, rho, P))
    e1, e2 = np.empty(800), np.empty(800)
    for i in range(800):
        d = np.hypot(*(xy - xy[i]).T)
        c = received_power_scale(d[d > rho[i]], P)
        e1[i], e2[i] = np.log(c.sum()), np.log((c * c).sum())
    # a density, not the sample: the mean log error is the placement's luck (|.| <= 0.02 over
    # seeds 0-3 and 8), the spread the receivers' (0.06-0.09; 0.12-0.17 for c^2); a wrong
    # factor or exponent in the integral would be off by >= 0.5
    assert abs(np.mean(t1 - e1)) < 0.05 and np.std(t1 - e1) < 0.15
    assert abs(np.mean(t2 - e2)) < 0.1 and np.std(t2 - e2) < 0.3
    # a hand-computed case: receiver at the centre of a square of half-side a, c = c1 r^-3:
    # lambda c1 int_0^2pi (1/rho - 1/L(theta)) dtheta = lambda c1 (2 pi / rho - 4 sqrt(2) / a)
    a, rho = 500.0, 20.0
    axis = np.linspace(-a, a, 201)
    grid = np.stack(np.meshgrid(axis, axis), -1).reshape(-1, 2)
    t1c, _ = far_field_sums(grid, rho, P)
    lam, c1 = (len(grid) - 1) / (2 * a) ** 2, received_power_scale(np.ones(1), P)[0]
    want = lam * c1 * (2 * np.pi / rho - 4 * np.sqrt(2) / a)
    assert abs(float(t1c[len(grid) // 2]) - np.log(want)) < 1e-4


def test_mean_field_tail_reduces_truncation_error():
    xy = _network(300, seed=5, side=260.0)
    idx, mask = candidate_neighbors(xy, k=10)
    full = np.asarray(sparse_error_probability(xy, idx, mask, 5.0, P))
    for mode in ({"interference": "radius", "cutoff": 60.0},
                 {"interference": "nearest", "num_interferers": 30}):  # fmt: skip
        cut = np.asarray(sparse_error_probability(xy, idx, mask, 5.0, P, **mode))
        mean = np.asarray(sparse_error_probability(xy, idx, mask, 5.0, P, tail="mean", **mode))
        e_cut, e_mean = np.abs(cut - full)[mask], np.abs(mean - full)[mask]
        assert e_mean.mean() < 0.2 * e_cut.mean() and e_mean.max() < 0.3 * e_cut.max(), mode


def test_monte_carlo_of_truncated_links():
    """1 - success rate of the log-normal Monte Carlo over exactly R_i \\ {j} ~ P_err."""
    xy = _network(90, seed=6)
    idx, mask = candidate_neighbors(xy, k=4)
    mode = {"interference": "radius", "cutoff": 35.0}
    perr = np.asarray(sparse_error_probability(xy, idx, mask, 5.0, P, **mode))
    links = [(i, 3) for i in range(0, 90, 18)]
    t, nb, valid = _reduced_sets(xy, idx, interferer_sets(xy, **mode), links)
    draws = 40_000
    ok = simulate_links(jax.random.key(0), t, nb, 5.0, draws, P, valid, "lognormal")
    rate = 1.0 - np.asarray(ok)[:, :, 0].mean(0)
    want = np.array([perr[i, k] for i, k in links])
    sigma = np.maximum(np.sqrt(want * (1 - want) / draws), 1.0 / draws)
    assert want.max() > 0.05  # links that do fail sometimes
    np.testing.assert_array_less(np.abs(rate - want), 5 * sigma)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"positions": np.zeros((1, 2)), "k": 1}, "positions"),
        ({"positions": np.zeros((5, 3)), "k": 1}, "positions"),
        ({"positions": np.array([[0.0, np.nan], [1.0, 1.0]]), "k": 1}, "positions"),
        ({"positions": np.zeros((5, 2))}, "radius"),
        ({"positions": np.zeros((5, 2)), "k": 5}, "k"),
        ({"positions": np.zeros((5, 2)), "k": 0}, "k"),
        ({"positions": np.zeros((5, 2)), "radius": -1.0}, "radius"),
        ({"positions": np.zeros((5, 2)), "radius": float("inf")}, "radius"),
    ],
)
def test_candidate_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        candidate_neighbors(**kwargs)


@pytest.mark.parametrize(
    ("change", "name"),
    [
        ({"idx": np.zeros((5, 2), np.int32)}, "idx"),
        ({"idx": np.full((6, 2), 6)}, "idx"),
        ({"idx": np.zeros((6, 2))}, "idx"),
        ({"mask": np.ones((6, 3), bool)}, "mask"),
        ({"mask": np.ones((6, 2), int)}, "mask"),
        ({"gamma_th": 0.0}, "gamma_th"),
        ({"gamma_th": np.ones(5)}, "gamma_th"),
        ({"interference": "cell"}, "interference"),
        ({"interference": "radius"}, "cutoff"),
        ({"interference": "radius", "cutoff": 0.0}, "cutoff"),
        ({"cutoff": 10.0}, "cutoff"),
        ({"interference": "nearest"}, "num_interferers"),
        ({"interference": "nearest", "num_interferers": 6}, "num_interferers"),
        ({"num_interferers": 3}, "num_interferers"),
        ({"moments": "wrong"}, "moments"),
        ({"tail": "mean"}, "tail"),
        ({"interference": "radius", "cutoff": 10.0, "tail": "far"}, "tail"),
        ({"params": {"area_m": 1}}, "params"),
        ({"num_nodes": 1}, "num_nodes"),
    ],
)
def test_sparse_perr_bad_arguments(change, name):
    xy = _network(6, seed=7)
    idx, mask = candidate_neighbors(xy, k=2)
    args = {"positions": xy, "idx": idx, "mask": mask, "gamma_th": 5.0, **change}
    with pytest.raises(ValueError, match=name):
        sparse_error_probability(**args)
