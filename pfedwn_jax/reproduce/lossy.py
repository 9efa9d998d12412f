"""pFedWN's weights under lossy links: one target, exactly one similar neighbor, Bernoulli failures.

The case (real MNIST images, disjoint between clients): the target is 94% sevens; neighbor 1
is the only one holding sevens in numbers (60, a minority of its 760); neighbor 2 is small
(mostly sixes), neighbor 3 large (eights and nines). With ideal links the default EM gives
neighbor 1 a weight above 0.8 (tests/test_pfedwn_similarity.py). Every link fails
independently with probability ``failure`` each round; the study runs pFedWN's ways of
keeping pi (``VARIANTS``) over several seeds and reports neighbor 1's weight at the end
and the target's test accuracy. ``python -m pfedwn_jax.reproduce.lossy OUT.json``.

The rounds are driven as the runner drives them (``runner.links.begin_round`` /
``end_round`` around the algorithm's round), on a small context (4 slots, the MLP).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pfedwn_jax.algorithms import RoundContext, get_algorithm, make_hparams, neighbor_lists
from pfedwn_jax.data.stacking import stack_clients
from pfedwn_jax.engine import evaluate
from pfedwn_jax.experiment import ExperimentConfig
from pfedwn_jax.experiment.federation import channel_params
from pfedwn_jax.experiment.link_setup import Links
from pfedwn_jax.models import get_model
from pfedwn_jax.runner.links import begin_round, end_round, init_track

#: class -> training samples of each client (slot 0 the target).
CLIENTS = (
    {7: 470, 0: 25, 4: 5},
    {5: 700, 7: 60},
    {6: 140, 0: 6, 7: 3},
    {8: 700, 9: 800, 4: 30, 7: 1},
)
#: The target's test samples (its training mix, from the test split).
TARGET_TEST = {7: 180, 0: 10, 4: 2}
#: The similar neighbor (the only one holding the target's main class in numbers).
HOLDER = 1
#: name -> (pFedWN overrides, stale links).
VARIANTS: dict[str, tuple[dict[str, Any], bool]] = {
    "schedule": ({"refresh": "schedule"}, False),
    "schedule, em_every=1": ({"refresh": "schedule", "em_every": 1}, False),
    "schedule, stale": ({"refresh": "schedule"}, True),
    "arrival": ({"refresh": "arrival"}, False),
    "arrival, stale": ({"refresh": "arrival"}, True),
}


#: The small-neighbor case: no neighbor holds sevens in numbers; neighbor 2 has 15 samples
#: (one local step a round at batch 32: it stays near the shared initial model).
SMALL_CLIENTS = (
    {7: 470, 0: 25, 4: 5},
    {5: 700, 3: 60},
    {6: 12, 0: 2, 7: 1},
    {8: 700, 9: 800, 4: 30, 7: 1},
)
TINY = 2


def case_context(
    data_file: str | Path,
    failure: float | None,
    stale: bool = False,
    clients: Sequence[Mapping[int, int]] = CLIENTS,
) -> tuple:
    """``(ctx, test)``: the case's context (``clients``' class counts, slot 0 the target;
    ``Links`` of a fixed ``failure``, or ideal links for None) and the target's test
    ``ClientData`` (one client)."""
    with np.load(data_file) as f:
        x, y = f["x_train"][..., None], f["y_train"].astype(np.int32)
        xt, yt = f["x_test"][..., None], f["y_test"].astype(np.int32)
    rng = np.random.default_rng(0)
    pools = {c: list(rng.permutation(np.flatnonzero(y == c))) for c in range(10)}
    parts = [np.array([pools[c].pop() for c, k in sp.items() for _ in range(k)]) for sp in clients]
    data = jax.tree.map(jnp.asarray, stack_clients(x, y, parts))
    test_idx = np.concatenate([np.flatnonzero(yt == c)[:k] for c, k in TARGET_TEST.items()])
    test = jax.tree.map(jnp.asarray, stack_clients(xt, yt, [test_idx]))
    neighbors, mask = neighbor_lists(np.ones((4, 4), bool))
    links = None
    if failure is not None:
        links = Links(
            perr=jnp.zeros((4, 4), jnp.float32),
            positions=jnp.zeros((4, 2), jnp.float32),
            active=jnp.ones((4,), bool),
            gamma_th=jnp.float32(1.0),
            failure=jnp.float32(failure),
            params=channel_params(ExperimentConfig()),
            model="bernoulli",
            stale=stale,
        )
    ctx = RoundContext(
        model=get_model("mlp", 10, (28, 28, 1)),
        optimizer=optax.sgd(0.05),
        train=data,
        data_client=jnp.arange(4, dtype=jnp.int32),
        neighbors=jnp.asarray(neighbors),
        neighbor_mask=jnp.asarray(mask),
        is_target=jnp.arange(4) == 0,
        num_samples=jnp.asarray(data.count, jnp.float32),
        batch_size=32,
        local_epochs=1,
        links=links,
    )
    return ctx, test


def run_case(
    case: tuple, overrides: dict, seeds: Sequence[int], rounds: int
) -> list[dict[str, Any]]:
    """Runs of pFedWN on ``case`` (``case_context``'s pair), one per seed, compiled once:
    ``{"pi": [rounds, K] the target's pi after each round, "accuracy": its final test
    accuracy}`` each."""
    ctx, test = case
    alg = get_algorithm("pfedwn")
    hp = make_hparams(alg, overrides)

    @jax.jit
    def step(state: Any, track: Any, key: jax.Array) -> tuple[Any, Any]:
        if ctx.links is None:
            return alg.round(state, key, ctx, hp)[0], track
        rctx, _, drawn = begin_round(ctx, track, key)
        state, sent = alg.round(state, key, rctx, hp)
        if track is not None:
            track, _ = end_round(rctx, track, drawn, sent, key)
        return state, track

    out = []
    for seed in seeds:
        state = alg.init(jax.random.key(seed), ctx, hp)
        track = None
        if ctx.links is not None and ctx.links.stale:
            track = init_track(jax.random.key(seed), ctx, state.clients.params)
        pis = []
        for r in range(rounds):
            state, track = step(state, track, jax.random.key(1000 * seed + r))
            pis.append(np.asarray(state.pi[0]))
        params = jax.tree.map(lambda a: a[:1], state.clients.params)
        acc = evaluate(ctx.model, params, test, np.zeros(1, np.int32))["accuracy"]
        out.append({"pi": np.stack(pis), "accuracy": float(acc[0])})
    return out


def study(
    data_file: str | Path, seeds: Sequence[int], rounds: int, failure: float = 0.5
) -> dict[str, Any]:
    """Every variant (and ideal links, the reference) over ``seeds``: per seed the holder's
    final pi, its mean over the rounds after warm-up, and the final target accuracy."""
    out: dict[str, Any] = {"failure": failure, "rounds": rounds, "seeds": list(seeds)}
    cases = {"ideal links": ({"refresh": "schedule"}, None), **VARIANTS}
    rows = {}
    for name, (over, stale) in cases.items():
        ctx = case_context(data_file, None if stale is None else failure, bool(stale))
        t0, runs = time.perf_counter(), run_case(ctx, over, seeds, rounds)
        rows[name] = {
            "overrides": over,
            "stale": stale,
            "final_pi": [float(r["pi"][-1, HOLDER]) for r in runs],
            "mean_pi": [float(r["pi"][1:, HOLDER].mean()) for r in runs],
            "accuracy": [r["accuracy"] for r in runs],
            "seconds": round(time.perf_counter() - t0, 1),
        }
    out["variants"] = rows
    return out


def small_study(data_file: str | Path, seeds: Sequence[int], rounds: int) -> dict[str, Any]:
    """The small-neighbor case (``SMALL_CLIENTS``, ideal links): the tiny neighbor's final
    pi and the target's accuracy with the guard off and on, and Local (``a = 1``)."""
    case = case_context(data_file, None, clients=SMALL_CLIENTS)
    cases = {
        "guard off": {"uniform_guard": 0.0},
        "guard 0.1": {"uniform_guard": 0.1},
        "Local (a=1, pi unused)": {"a": 1.0},
    }
    out: dict[str, Any] = {"rounds": rounds, "seeds": list(seeds), "variants": {}}
    for name, over in cases.items():
        runs = run_case(case, over, seeds, rounds)
        out["variants"][name] = {
            "overrides": over,
            "tiny_final_pi": [float(r["pi"][-1, TINY]) for r in runs],
            "accuracy": [r["accuracy"] for r in runs],
        }
    return out


def summary(res: dict[str, Any]) -> dict[str, Any]:
    """Per variant: seeds whose holder ends with pi < 0.05, mean final pi, mean accuracy."""
    return {
        name: {
            "holder_pi_below_0.05": int(sum(p < 0.05 for p in v["final_pi"])),
            "final_pi_mean": round(float(np.mean(v["final_pi"])), 3),
            "mean_pi_mean": round(float(np.mean(v["mean_pi"])), 3),
            "accuracy_mean": round(100 * float(np.mean(v["accuracy"])), 2),
        }
        for name, v in res["variants"].items()
    }


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    data = Path(args[1]) if len(args) > 1 else Path("/work/shared/data/mnist_10k_2k.npz")
    t0 = time.perf_counter()
    if len(args) > 2 and args[2] == "small":
        res = small_study(data, seeds=range(4), rounds=8)
        res["command"] = "python -m pfedwn_jax.reproduce.lossy " + " ".join(args)
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        Path(args[0]).write_text(json.dumps(res, indent=1) + "\n")
        return
    res = study(data, seeds=range(6), rounds=8)
    res["command"] = "python -m pfedwn_jax.reproduce.lossy " + " ".join(args)
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    Path(args[0]).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(summary(res), indent=1))


if __name__ == "__main__":
    main()
