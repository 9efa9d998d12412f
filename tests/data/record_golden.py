"""Record `golden_results.json`: a small run of every method in both modes.

The numbers were recorded before the code-health refactor; `tests/test_golden.py` checks that
the code still gives them. Re-record only for an intended change of results:
`python tests/data/record_golden.py tests/data/golden_results.json`.
"""

import json
import sys

from pfedwn_jax.devices import use_cpu_devices

use_cpu_devices(2)

from pfedwn_jax import run  # noqa: E402
from pfedwn_jax.experiment import ExperimentConfig  # noqa: E402

KEYS = ("target_accuracy", "target_loss", "client_accuracy", "client_loss", "records")


def main(path: str) -> None:
    out = {}
    for mode in ("single", "network"):
        cfg = ExperimentConfig(
            num_neighbors=4, rounds=2, batch_size=16, local_steps=3, mode=mode,
            gamma_th=2.0, eps=0.3, topology_seed=1,
        )  # fmt: skip
        d = run(cfg, progress=False).to_dict()
        methods = {k: {kk: v[kk] for kk in KEYS} for k, v in d["methods"].items()}
        out[mode] = {"config": cfg.to_dict(), "network": d["network"], "methods": methods}
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
