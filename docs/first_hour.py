"""A new user's first hour with pfedwn-jax, as one script (run by tests/test_first_hour.py).

    python docs/first_hour.py --out runs/first_hour

1. Your own code lives in your own module, `docs/first_hour/my_fl.py`: a flax model
   (`link_mlp`), an FL algorithm (`uniform_mix`) and a dataset of float features held in
   memory (`links`: channel-state vectors of wireless links, labelled by their strongest
   subchannel), each registered by name at import.
2. The command line imports it (`--import`) and runs your algorithm beside a built-in one on
   your data with your model, logging every round to TensorBoard and keeping the models:

       pfedwn --import docs/first_hour/my_fl.py run --dataset links --model link_mlp \
           --algorithms local,uniform_mix --hparams uniform_mix.self_weight=0.7 \
           --num-neighbors 3 --gamma-th 1 --eps 0.12 --rounds 3 --batch-size 16 --lr 0.1 \
           --log-to tensorboard --save-models --out runs/first_hour

   (this script calls the same entry point, `pfedwn_jax.cli.main`, with those arguments).
   Then `tensorboard --logdir runs/first_hour/logs/tensorboard` shows the curves (each method
   of each run its own line: target and mean client accuracy, losses, client accuracy
   histograms; pFedWN adds its neighbor weights `pi/client_<c>`).
3. Back in Python, the same module imported again (so `links` and `link_mlp` exist in this
   process), `pfedwn_jax.load_models` reads the saved models: evaluated on the run's test
   split they give the accuracy the run recorded for its last round.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MODULE = HERE / "first_hour" / "my_fl.py"


def cli_args(out: Path) -> list[str]:
    """The `pfedwn` command line of step 2."""
    return [
        "--import", str(MODULE), "run",
        "--dataset", "links", "--model", "link_mlp",
        "--algorithms", "local,uniform_mix", "--hparams", "uniform_mix.self_weight=0.7",
        "--num-neighbors", "3", "--gamma-th", "1", "--eps", "0.12",
        "--rounds", "3", "--batch-size", "16", "--lr", "0.1",
        "--log-to", "tensorboard", "--save-models", "--quiet", "--no-plot",
        "--out", str(out),
    ]  # fmt: skip


def train(out: Path) -> None:
    """Step 2: the command line, with your module imported."""
    from pfedwn_jax.cli import main

    status = main(cli_args(out))
    if status != 0:
        raise SystemExit(f"pfedwn run failed with status {status}")
    events = sorted((out / "logs" / "tensorboard").rglob("events.out.tfevents.*"))
    print(f"TensorBoard event files: {len(events)} under {out / 'logs' / 'tensorboard'}")


def evaluate(out: Path) -> dict[str, float]:
    """Step 3: load the saved models and evaluate them; returns each method's target
    accuracy, checked against the run's recorded last round."""
    sys.path.insert(0, str(MODULE.parent))
    import my_fl  # noqa: F401  (registers link_mlp, uniform_mix and links in this process)

    import pfedwn_jax

    result = pfedwn_jax.Result.load(out / "results.json")
    models = pfedwn_jax.load_models(out / "models")
    model = models.model()  # the registered flax module, as the run built it
    print(f"saved models: {models.methods}, {model.name} on inputs {model.input_shape}")
    print(f"slot -> data client: {models.slot_client().tolist()}")
    accuracy = {}
    for method in models.methods:
        ours = models.evaluate(method)["accuracy"]  # [S] on each slot's own test split
        recorded = np.asarray(result.methods[method]["client_accuracy"][-1])
        np.testing.assert_allclose(ours, recorded, atol=1e-6)
        accuracy[method] = float(ours[models.is_target()].mean())
        print(f"{method:12s} target accuracy {accuracy[method]:.3f} (recorded: the same)")
    return accuracy


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/first_hour"))
    args = parser.parse_args(argv)
    train(args.out)
    return evaluate(args.out)


if __name__ == "__main__":
    main()
