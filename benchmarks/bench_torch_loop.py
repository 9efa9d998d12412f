"""The PyTorch per-client loop: one FedAvg round (1 local epoch, batch 32), for comparison.

The same case as `bench_engine.py` (N clients with 64..600 real MNIST samples drawn with seed 0,
the same MLP / CNN, plain SGD lr 0.05, sample-weighted average), executed the way PyTorch FL
code runs it: a Python loop over clients, each copying the global model, training one epoch and
adding its weighted parameters to the average. Needs only `torch` and `numpy`, so it can run in
an interpreter of its own (PyTorch is not a dependency of pfedwn-jax):

    python benchmarks/bench_torch_loop.py --model cnn --clients 100      # prints one JSON object
    python benchmarks/bench_engine.py --model cnn --clients 100 --torch-python /path/to/python
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

DATA_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
BATCH = 32


def client_data(num_clients: int) -> tuple[np.ndarray, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per-client tensors, the same samples as `bench_engine.make_data`."""
    counts = np.random.default_rng(0).integers(64, 601, num_clients)
    for name in ("mnist.npz", "mnist_10k_2k.npz"):
        if (DATA_DIR / name).exists():
            raw = np.load(DATA_DIR / name)
            images, labels = raw["x_train"], raw["y_train"].astype(np.int64)
            break
    else:
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, (10000, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, 10000).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    out = []
    for o, c in zip(offsets, counts, strict=True):
        pos = (o + np.arange(c)) % len(images)
        x = torch.tensor(images[pos][:, None] / 255.0, dtype=torch.float32)
        out.append((x, torch.tensor(labels[pos])))
    return counts, out


class CNN(nn.Module):
    """conv5x5(32)-ReLU-pool2-conv5x5(64)-ReLU-pool2-fc512-ReLU-fc10 (VALID convs)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(1, 32, 5), nn.Conv2d(32, 64, 5)
        self.f1, self.f2 = nn.Linear(1024, 512), nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.f2(F.relu(self.f1(x.flatten(1))))


class MLP(nn.Module):
    """784-200-200-10."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(784, 200), nn.Linear(200, 200), nn.Linear(200, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(F.relu(self.b(F.relu(self.a(x.flatten(1))))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="cnn", choices=["mlp", "cnn"])
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up")
    args = p.parse_args()
    torch.manual_seed(0)
    counts, data = client_data(args.clients)
    net = CNN if args.model == "cnn" else MLP
    glob, local = net(), net()
    weights = (counts / counts.sum()).tolist()
    gen = torch.Generator().manual_seed(0)

    def fedavg_round() -> None:
        acc = [torch.zeros_like(q) for q in glob.parameters()]
        for (x, y), w in zip(data, weights, strict=True):
            with torch.no_grad():
                for q, g in zip(local.parameters(), glob.parameters(), strict=True):
                    q.copy_(g)
            opt = torch.optim.SGD(local.parameters(), lr=0.05)
            perm = torch.randperm(len(y), generator=gen)
            for i in range(0, len(y), BATCH):
                idx = perm[i : i + BATCH]
                opt.zero_grad()
                F.cross_entropy(local(x[idx]), y[idx]).backward()
                opt.step()
            with torch.no_grad():
                for a, q in zip(acc, local.parameters(), strict=True):
                    a.add_(q, alpha=w)
        with torch.no_grad():
            for g, a in zip(glob.parameters(), acc, strict=True):
                g.copy_(a)

    times = []
    for _ in range(args.repeats + 1):
        t0 = time.perf_counter()
        fedavg_round()
        times.append(time.perf_counter() - t0)
    steady = sorted(times[1:])
    round_s = steady[len(steady) // 2]
    print(
        json.dumps(
            {
                "samples": int(counts.sum()),
                "round_s": round_s,
                "rounds_s": times,
                "samples_per_s": int(counts.sum()) / round_s,
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "cores": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
