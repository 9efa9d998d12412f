"""Record results of the dense code (main 5c75bef) on a network with uneven degrees."""
import json, sys
from pfedwn_jax.devices import use_cpu_devices
use_cpu_devices(2)
from pfedwn_jax.experiment import ExperimentConfig, run
cfg = ExperimentConfig(num_neighbors=7, mode="network", gamma_th=5.0, eps=0.1, topology_seed=1,
    model="logreg", rounds=3, batch_size=16, local_steps=3,
    hparams={"pfedwn": {"em_every": 1}})
d = run(cfg, progress=False).to_dict()
keys = ("target_accuracy", "target_loss", "client_accuracy", "client_loss", "records")
out = {"config": cfg.to_dict(), "adjacency": d["network"]["adjacency"],
       "methods": {k: {kk: v[kk] for kk in keys} for k, v in d["methods"].items()}}
json.dump(out, open(sys.argv[1], "w"))
