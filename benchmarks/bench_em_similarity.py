"""pFedWN's two EM readings on full MNIST: does pi follow the neighbors' data similarity?

Paired throughout: `pi_from="received"` (the default: every E-step and the refinement
evaluate the neighbors' received models) against `"components"` (App. B's loop read
literally: M-step 2 fine-tunes every component one epoch on the target's data, and the next
E-step and the refinement evaluate the fine-tuned components). Full MNIST, the paper's
partition over 11 clients, no per-client cap, 20% of the training data held out, the MLP,
batch 32, one local epoch, pFedWN's other hyperparameters at their defaults.

- `weights`: on the network of topology seed 13 at gamma_th 10 (3 selected neighbors), every
  data client in turn as the target, after the warm-up round of local training: both
  readings' pi, each neighbor's label overlap with the target (`sum_y min(p, q) = 1 - TV`)
  and coverage (the target's share of samples in classes the neighbor holds >= 100 training
  samples of), and the mean target loss of each component before and after M-step 2. The
  summary: the pi-weighted overlap and coverage of each reading (paired per target, over the
  seeds), and how often the top-weighted neighbor is the most similar one where that is clear
  (top overlap >= 0.1 and at least twice the second).
- `accuracy`: rounds of pFedWN on the given cases (`TOPOLOGY_SEED:GAMMA:TARGET`), both
  readings at each `a`, and Local (`a = 1`); the target's test accuracy, mean of the last 5
  rounds, paired by seed.

    python benchmarks/bench_em_similarity.py weights --data-seeds 0 1 2 --seeds 0 1 --lr 0.05
    python benchmarks/bench_em_similarity.py accuracy --seeds 0 1 2 3 4 --a 0.5 0.9
    python benchmarks/bench_em_similarity.py summary benchmarks/results/bench_em_similarity_*.json

Writes `benchmarks/results/bench_em_similarity_<kind>_<UTC>.json` and prints its summary.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from pfedwn_jax.algorithms import get_algorithm, make_hparams
from pfedwn_jax.algorithms.pfedwn import em_components, estimate_pi
from pfedwn_jax.data import client_label_counts
from pfedwn_jax.engine import cross_evaluate, evaluate
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.setup import setup

HERE = Path(__file__).resolve().parent
# full MNIST: $PFEDWN_DATA_DIR, else shared/data beside the repository or its worktree folder
DATA_DIR = next(
    (
        Path(d)
        for d in (os.environ.get("PFEDWN_DATA_DIR"), HERE.parents[1] / "shared" / "data")
        if d and (Path(d) / "mnist.npz").is_file()
    ),
    HERE.parents[2] / "shared" / "data",
)
READINGS = ("received", "components")
HOLDS = 100  # a neighbor "holds" a class with at least this many training samples
#: The counts-only cases and the similarity cases on full MNIST (data seed 0).
CASES = ("13:5:0", "13:10:1", "13:15:2", "13:5:5", "13:10:6", "13:15:8")
ALG = get_algorithm("pfedwn")


def base_config(data_seed: int, lr: float, **kw) -> ExperimentConfig:
    return ExperimentConfig(
        dataset=f"npz:{DATA_DIR / 'mnist.npz'}",
        data_seed=data_seed,
        val_fraction=0.2,
        lr=lr,
        algorithms=("pfedwn",),
        **kw,
    )


# ------------------------------------------------------------------------------- weights
@jax.jit
def _warm(ctx, key):
    hp = make_hparams(ALG, {})
    state = ALG.init(jax.random.fold_in(key, 0), ctx, hp)
    return ALG.round(state, jax.random.fold_in(jax.random.fold_in(key, 1), 0), ctx, hp)


@jax.jit
def _mean_losses(comps, ctx):
    """`[K - 1]` mean loss of each of the target's (slot 0's) components on its training
    data (`comps` leaves `[S, K - 1, ...]`, `em_components`)."""
    mine = jax.tree.map(lambda a: a[0], comps)
    dc = jnp.broadcast_to(ctx.data_client[0], (ctx.neighbors.shape[1] - 1,))
    per = cross_evaluate(ctx.model, mine, ctx.train, jnp.arange(dc.shape[0]), dc)["loss"]
    mask = ctx.train.mask[dc]
    return (per * mask).sum(1) / mask.sum(1)


def _estimator(reading: str):
    hp = make_hparams(ALG, {"pi_from": reading})

    def estimate(params, key, ctx):
        pi, trace = estimate_pi(params, key, ctx, hp)
        return pi, trace, em_components(params, key, ctx, hp)

    return jax.jit(estimate)


_ESTIMATE = {r: _estimator(r) for r in READINGS}


def target_context(exp, target: int):
    """The experiment's context with `target` at the centre (same placement and selection)."""
    clients = exp.config.num_clients
    others = np.array([c for c in range(clients) if c != target])
    slots = np.concatenate([[target], others[exp.federation.selected]])
    count = np.asarray(exp.data.train.count)[slots]
    ctx = exp.ctx.replace(
        data_client=jnp.asarray(slots, jnp.int32), num_samples=jnp.asarray(count, jnp.float32)
    )
    return ctx, slots


def weights(data_seeds: list[int], seeds: list[int], lr: float) -> list[dict]:
    rows = []
    for ds in data_seeds:
        exp = setup(base_config(ds, lr, gamma_th=10.0, topology_seed=13))
        train_counts = client_label_counts(exp.data, "train")
        for target in range(exp.config.num_clients):
            ctx, slots = target_context(exp, target)
            for seed in seeds:
                key = jax.random.PRNGKey(seed)
                params = _warm(ctx, key).clients.params
                em_key = jax.random.fold_in(
                    jax.random.fold_in(jax.random.fold_in(key, 1), 1), 0x5EED
                )
                row = {"data_seed": ds, "target": target, "neighbors": slots[1:].tolist(),
                       "seed": seed, "lr": lr, "counts": train_counts[slots].tolist()}  # fmt: skip
                for r in READINGS:
                    pi, trace, comps = _ESTIMATE[r](params, em_key, ctx)
                    row[r] = np.asarray(pi)[0, 1:].tolist()
                    row[f"{r}_trace"] = np.asarray(trace)[:, 0, 1:].tolist()
                    row[f"loss_{r}"] = np.asarray(_mean_losses(comps, ctx))[
                        : len(slots) - 1
                    ].tolist()
                rows.append(row)
                print(ds, target, seed, row["neighbors"], *(np.round(row[r], 3) for r in READINGS),
                      flush=True)  # fmt: skip
    return rows


def similarity(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each neighbor's label overlap and coverage with the target (row 0 of `counts`)."""
    c = np.asarray(counts, float)
    p = c / c.sum(1, keepdims=True)
    return np.minimum(p[0], p[1:]).sum(1), (p[0] * (c[1:] >= HOLDS)).sum(1)


def _paired(groups: dict, label: str) -> str:
    g = np.array([np.mean(v) for v in groups.values()])
    half = stats.t.ppf(0.975, len(g) - 1) * g.std(ddof=1) / np.sqrt(len(g))
    p = stats.wilcoxon(g).pvalue if np.any(g != 0) else 1.0
    up, down = int((g > 1e-3).sum()), int((g < -1e-3).sum())
    return (
        f"{label}: {g.mean():+.3f} +- {half:.3f} ({len(g)} targets; {up} up, {down} down; "
        f"Wilcoxon p {p:.2g})"
    )


def weights_summary(rows: list[dict]) -> list[str]:
    out, diff = [], {m: {} for m in ("overlap", "coverage")}
    clear, agree = [], {r: [] for r in READINGS}
    mean = {(r, m): [] for r in READINGS for m in diff}
    for row in rows:
        ov, cov = similarity(row["counts"])
        top = np.sort(ov)[::-1]
        clear.append(top[0] >= 0.1 and top[0] >= 2 * top[1])
        for r in READINGS:
            pi = np.asarray(row[r])
            mean[r, "overlap"].append(pi @ ov)
            mean[r, "coverage"].append(pi @ cov)
            agree[r].append(np.argmax(pi) == np.argmax(ov))
        for m, v in (("overlap", ov), ("coverage", cov)):
            d = (np.asarray(row["received"]) - np.asarray(row["components"])) @ v
            diff[m].setdefault((row["data_seed"], row["target"]), []).append(d)
    clear = np.array(clear)
    best = np.mean([similarity(r["counts"])[0].max() for r in rows])
    out.append(f"{len(rows)} rows; the most similar neighbor's overlap, mean: {best:.3f}")
    for r in READINGS:
        out.append(
            f"{r:10s}: pi-weighted overlap {np.mean(mean[r, 'overlap']):.3f}, coverage "
            f"{np.mean(mean[r, 'coverage']):.3f}; top weight on the most similar neighbor in "
            f"{int(np.sum(np.array(agree[r])[clear]))}/{int(clear.sum())} clear rows"
        )
    for m in diff:
        out.append(_paired(diff[m], f"received - components, pi-weighted {m}"))
    return out


# ------------------------------------------------------------------------------ accuracy
def _run_fn(rounds: int):
    @jax.jit
    def run(key, h, ctx, test, val):
        state = ALG.init(jax.random.fold_in(key, 0), ctx, h)
        root = jax.random.fold_in(key, 1)

        def body(state, r):
            state, _ = ALG.round(state, jax.random.fold_in(root, r), ctx, h)
            params = ALG.eval_params(state, ctx, h)
            acc = [
                evaluate(ctx.model, params, d, ctx.data_client)["accuracy"][0] for d in (test, val)
            ]
            return state, tuple(acc)

        state, (acc, val_acc) = jax.lax.scan(body, state, jnp.arange(rounds))
        return acc, val_acc, state.pi[0]

    return run


def accuracy(cases: list[str], seeds: list[int], a_values: list[float], rounds: int, lr: float):
    run = _run_fn(rounds)
    rows = []
    for case in cases:
        topo, gamma, target = (float(v) for v in case.split(":"))
        cfg = base_config(0, lr, gamma_th=gamma, topology_seed=int(topo), target=int(target))
        exp = setup(cfg)
        for seed, a in ((s, a) for s in seeds for a in [*a_values, 1.0]):
            for r in READINGS if a < 1 else READINGS[:1]:  # a = 1 is Local (bit for bit)
                hp = make_hparams(ALG, {"pi_from": r, "a": a})
                acc, val, pi = run(jax.random.PRNGKey(seed), hp, exp.ctx, exp.test, exp.val)
                rows.append({"case": case, "clients": exp.federation.data_client.tolist(),
                             "seed": seed, "a": a, "reading": r if a < 1 else "local",
                             "acc": (np.asarray(acc) * 100).tolist(),
                             "val": (np.asarray(val) * 100).tolist(),
                             "pi": np.asarray(pi)[1:].tolist()})  # fmt: skip
                print(case, seed, a, rows[-1]["reading"], f"{np.mean(rows[-1]['acc'][-5:]):.2f}",
                      np.round(rows[-1]["pi"], 3), flush=True)  # fmt: skip
    return rows


def accuracy_summary(rows: list[dict], window: int = 5) -> list[str]:
    last = {(r["case"], r["a"], r["reading"], r["seed"]): np.mean(r["acc"][-window:]) for r in rows}
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        seeds = sorted({r["seed"] for r in rows if r["case"] == case})
        local = np.array([last[case, 1.0, "local", s] for s in seeds])
        out.append(f"{case}: Local {local.mean():.2f}")
        for a in sorted({r["a"] for r in rows if r["case"] == case and r["a"] < 1}):
            x = {r: np.array([last[case, a, r, s] for s in seeds]) for r in READINGS}
            d = x["received"] - x["components"]
            half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
            out.append(
                f"  a={a}: received {x['received'].mean():.2f}, components "
                f"{x['components'].mean():.2f}; received - components {d.mean():+.2f} +- "
                f"{half:.2f}; received - Local {(x['received'] - local).mean():+.2f}"
            )
    for a in sorted({r["a"] for r in rows if r["a"] < 1}):  # every case and seed, paired
        keys = sorted({(r["case"], r["seed"]) for r in rows if r["a"] == a})
        d = np.array([last[c, a, "received", s] - last[c, a, "components", s] for c, s in keys])
        half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
        out.append(f"pooled, a={a}: received - components {d.mean():+.2f} +- {half:.2f}")
    return out


# --------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("weights", "accuracy", "summary"))
    ap.add_argument("files", nargs="*", help="summary: result files to summarise")
    ap.add_argument("--data-seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--a", type=float, nargs="+", default=[0.5, 0.9])
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args(argv)
    if args.kind == "summary":
        for f in args.files:
            rec = json.loads(Path(f).read_text())
            fn = weights_summary if rec["kind"] == "weights" else accuracy_summary
            print(f"{f} ({rec['date']}, {rec['machine']}):", *fn(rec["rows"]), sep="\n")
        return
    t0 = time.perf_counter()
    if args.kind == "weights":
        rows = weights(args.data_seeds, args.seeds, args.lr)
    else:
        rows = accuracy(args.cases, args.seeds, args.a, args.rounds, args.lr)
    stamp = dt.datetime.now(dt.UTC)
    rec = {"kind": args.kind, "args": vars(args), "date": stamp.isoformat(timespec="seconds"),
           "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
           "wall_s": time.perf_counter() - t0, "rows": rows}  # fmt: skip
    out = HERE / "results" / f"bench_em_similarity_{args.kind}_{stamp:%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(rec))
    summary = weights_summary(rows) if args.kind == "weights" else accuracy_summary(rows)
    print(f"wrote {out}", *summary, sep="\n")


if __name__ == "__main__":
    main(sys.argv[1:])
