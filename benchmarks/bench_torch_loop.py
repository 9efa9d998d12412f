"""The PyTorch per-client loop: one FedAvg round (1 local epoch, batch 32), for comparison.

The same case as `bench_engine.py` (N clients with 64..600 real MNIST samples drawn with seed 0,
the same MLP / CNN, plain SGD lr 0.05, sample-weighted average), executed the way PyTorch FL
code runs it: a Python loop over clients, each copying the global model, training one epoch and
adding its weighted parameters to the average. Needs only `torch` and `numpy`, so it can run in
an interpreter of its own (PyTorch is not a dependency of pfedwn-jax):

    python benchmarks/bench_torch_loop.py --model cnn --clients 100      # prints one JSON object
    python benchmarks/bench_engine.py --model cnn --clients 100 --torch-python /path/to/python

With `--serve` it is the timing worker `bench_engine.py` starts once per case and asks for
rounds between its JAX timings, so every ratio comes from measurements taken side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
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


def make_round(model: str, num_clients: int) -> tuple[Callable[[], None], int]:
    """A FedAvg round closure over fresh models and the case's data; returns it and its
    sample count."""
    torch.manual_seed(0)
    counts, data = client_data(num_clients)
    net = CNN if model == "cnn" else MLP
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

    return fedavg_round, int(counts.sum())


def prime(model: str, num_clients: int) -> None:
    """One round over the first few clients on throwaway models: pays torch's one-off costs
    (thread pools, kernel choice per batch shape) before any timed round."""
    make_round(model, min(num_clients, 10))[0]()


def info(samples: int) -> dict:
    """What the timings depend on: sample count, torch version, threads, cores."""
    return {
        "samples": samples,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cores": os.cpu_count(),
    }


def time_rounds(fedavg_round: Callable[[], None], rounds: int) -> float:
    """Seconds for `rounds` consecutive rounds."""
    t0 = time.perf_counter()
    for _ in range(rounds):
        fedavg_round()
    return time.perf_counter() - t0


def one_shot(model: str, num_clients: int, repeats: int) -> dict:
    """One warm-up round then `repeats` timed rounds; samples/s from the median round."""
    fedavg_round, samples = make_round(model, num_clients)
    times = [time_rounds(fedavg_round, 1) for _ in range(repeats + 1)]
    steady = sorted(times[1:])
    round_s = steady[len(steady) // 2]
    return {
        **info(samples),
        "round_s": round_s,
        "rounds_s": times,
        "samples_per_s": samples / round_s,
    }


def serve(model: str, num_clients: int) -> None:
    """Timing worker for `bench_engine.py`: prints one JSON line of `info`, then for each line
    `K` read from stdin runs K rounds and prints `{"seconds": s}`; exits at end of input.

    Between requests it only waits on stdin, so it costs the JAX timings nothing.
    """
    fedavg_round, samples = make_round(model, num_clients)
    t0 = time.perf_counter()
    prime(model, num_clients)
    print(json.dumps({**info(samples), "prime_s": time.perf_counter() - t0}), flush=True)
    for line in sys.stdin:
        seconds = time_rounds(fedavg_round, int(line))
        print(json.dumps({"seconds": seconds}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="cnn", choices=["mlp", "cnn"])
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up")
    p.add_argument("--serve", action="store_true", help="timing worker for bench_engine.py")
    args = p.parse_args()
    if args.serve:
        serve(args.model, args.clients)
    else:
        print(json.dumps(one_shot(args.model, args.clients, args.repeats)))


if __name__ == "__main__":
    main()
