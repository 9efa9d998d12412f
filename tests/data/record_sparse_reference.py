"""Record `sparse_reference.json`: every method in network mode on a network with uneven
degrees, by the dense code (recorded on main at 5c75bef, before the neighbor lists).

`tests/test_sparse_neighbors.py` checks that the sparse code still gives these results. The
dense code estimated pi on the components after M-step 2, what `pi_from="components"` does
now, so the stored config names it (the default became "received" later).
`python tests/data/record_sparse_reference.py tests/data/sparse_reference.json`
"""

import json
import sys

from pfedwn_jax.devices import use_cpu_devices

use_cpu_devices(2)

from pfedwn_jax import run  # noqa: E402
from pfedwn_jax.experiment import ExperimentConfig  # noqa: E402

KEYS = ("target_accuracy", "target_loss", "client_accuracy", "client_loss", "records")


def main(path: str) -> None:
    cfg = ExperimentConfig(
        num_neighbors=7, mode="network", gamma_th=5.0, eps=0.1, topology_seed=1,
        model="logreg", rounds=3, batch_size=16, local_steps=3,
        hparams={"pfedwn": {"em_every": 1, "pi_from": "components"}},
    )  # fmt: skip
    d = run(cfg, progress=False).to_dict()
    out = {
        "config": cfg.to_dict(),
        "adjacency": d["network"]["adjacency"],
        "methods": {k: {kk: v[kk] for kk in KEYS} for k, v in d["methods"].items()},
    }
    with open(path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
