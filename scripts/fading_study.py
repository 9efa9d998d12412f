"""Fading models: the formula's error against the packet-level Monte Carlo, and selected-neighbor
counts across Nakagami m and Rician K (the paper's Fig. 5/6 layout: Table I, 50 m square).

    PYTHONPATH=. python scripts/fading_study.py --out docs/img/fading_study.json

Part 1 (approximation): for each model, 5 topologies of 10 neighbors, gamma_th = 5: P_err of
the formula ("paper" and "physical" moments) against (a) the log-normal Monte Carlo (the law
the formula assumes: must agree to MC error) and (b) the packet-level Monte Carlo
`P(node transmits and SINR < gamma_th)` (the exact law: every node's F fades, best
sub-channel above beta, co-channel interference); 40,000 draws. Part 2 (selection): mean
number of selected neighbors (P_err < eps) over 20 topologies for 5..30 neighbors, per model.
Writes the numbers as JSON and a figure next to it (.png). Learning accuracy across fading
models is not part of this study.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np

from pfedwn_jax.wireless import (
    ChannelParams,
    Fading,
    error_probability,
    place_network,
    select_neighbors,
    simulate_links,
)
from pfedwn_jax.wireless import fading as fd

MODELS = [
    ("rayleigh", 1.0),
    ("nakagami", 0.6),
    ("nakagami", 2.0),
    ("nakagami", 5.0),
    ("rician", 1.0),
    ("rician", 3.0),
    ("rician", 10.0),
]
NEIGHBORS = (5, 10, 15, 20, 25, 30)


def _label(kind: str, p: float) -> str:
    return {"rayleigh": "Rayleigh", "nakagami": f"Nakagami m={p:g}", "rician": f"Rician K={p:g}"}[
        kind
    ]


def approximation(params: ChannelParams, draws: int) -> dict:
    """Formula vs the two Monte Carlos, over 5 topologies of 10 neighbors (gamma_th = 5)."""
    rows = []
    for seed in range(5):
        t, nb = place_network(seed, 10, params)
        key = jax.random.key(100 + seed)
        f = float(params.num_subchannels)
        b = float(params.fading_threshold) ** 2 / float(params.fading.gamma)
        silent = float(1.0 - fd.survival(params.fading, np.float32(b))) ** f
        packet = 1.0 - np.asarray(simulate_links(key, t, nb, 5.0, draws, params)).mean(0)
        for moments in ("paper", "physical"):
            perr = np.asarray(error_probability(t, nb, 5.0, params, moments=moments), float)
            ok = simulate_links(
                key, t, nb, 5.0, draws, params, interference="lognormal", moments=moments
            )
            rows.append(
                {
                    "seed": seed,
                    "moments": moments,
                    "perr": perr.tolist(),
                    "mc_lognormal": (1.0 - np.asarray(ok).mean(0)).tolist(),
                    "mc_packet_sent_and_lost": (packet - silent).tolist(),
                }
            )
    out = {"rows": rows, "silent": silent}
    for moments in ("paper", "physical"):
        sel = [r for r in rows if r["moments"] == moments]
        p = np.concatenate([r["perr"] for r in sel])
        ln = np.concatenate([r["mc_lognormal"] for r in sel])
        pk = np.concatenate([r["mc_packet_sent_and_lost"] for r in sel])
        out[moments] = {
            "max_abs_vs_lognormal_mc": float(np.max(np.abs(p - ln))),
            "mean_abs_vs_packet_mc": float(np.mean(np.abs(p - pk))),
            "max_abs_vs_packet_mc": float(np.max(np.abs(p - pk))),
        }
    return out


def selection(params: ChannelParams, eps: float, gamma_th: float) -> list[float]:
    """Mean selected count over 20 topologies for each neighbor count."""
    counts = []
    for n in NEIGHBORS:
        nets = [place_network(seed, n, params) for seed in range(20)]
        t = np.stack([np.asarray(a) for a, _ in nets])  # [20, 2]
        nb = np.stack([np.asarray(b) for _, b in nets])  # [20, n, 2]
        perr = error_probability(t, nb, gamma_th, params)  # [20, n]
        counts.append(float(np.asarray(select_neighbors(perr, eps)).sum(-1).mean()))
    return counts


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, kind in zip(axes, ("nakagami", "rician"), strict=True):
        for m in result["models"]:
            if m["kind"] in (kind, "rayleigh"):
                style = "k--" if m["kind"] == "rayleigh" else "-o"
                ax.plot(NEIGHBORS, m["selected"], style, label=m["label"], ms=4)
        ax.plot(NEIGHBORS, NEIGHBORS, ":", color="grey", label="all neighbors")
        ax.set(xlabel="neighbors |G_n|", title=f"{kind.capitalize()} fading")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel(f"selected |M_n| (eps={result['eps']}, gamma_th={result['gamma_th']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("docs/img/fading_study.json"))
    ap.add_argument("--draws", type=int, default=40_000)
    ap.add_argument("--eps", type=float, default=0.05)
    ap.add_argument("--gamma-th", type=float, default=5.0)
    args = ap.parse_args()
    start = time.perf_counter()
    models = []
    for kind, p in MODELS:
        params = ChannelParams(fading=Fading.of(kind, p))
        models.append(
            {
                "kind": kind,
                "param": p,
                "label": _label(kind, p),
                "approximation": approximation(params, args.draws),
                "selected": selection(params, args.eps, args.gamma_th),
            }
        )
        print(models[-1]["label"], models[-1]["selected"], flush=True)
    result = {
        "eps": args.eps,
        "gamma_th": args.gamma_th,
        "neighbors": list(NEIGHBORS),
        "models": models,
        "wall_s": time.perf_counter() - start,
        "command": "PYTHONPATH=. python scripts/fading_study.py --out " + str(args.out),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(args.out)
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')} in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
