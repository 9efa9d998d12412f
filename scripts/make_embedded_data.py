"""Derive the package's embedded MNIST default from `../shared/data/mnist.npz`.

Deterministic: the first 6,000 training and the first 1,000 test images of the canonical
MNIST order (natural class proportions, no resampling), stored as uint8 with
`np.savez_compressed` in `pfedwn_jax/data/embedded/mnist_embedded.npz` (about 1.2 MB).
The source file's SHA-256 is checked against `SHA256SUMS` and recorded in the output.

Usage: python scripts/make_embedded_data.py [--source ../shared/data/mnist.npz] [--out PATH]
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np

from pfedwn_jax.io import atomic_write_with

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / ".." / "shared" / "data" / "mnist.npz"
OUT = ROOT / "pfedwn_jax" / "data" / "embedded" / "mnist_embedded.npz"
NUM_TRAIN = 6000
NUM_TEST = 1000


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def expected_sha256(path: Path) -> str | None:
    sums = path.parent / "SHA256SUMS"
    if not sums.exists():
        return None
    for line in sums.read_text().splitlines():
        digest, _, name = line.partition("  ")
        if name.strip() == path.name:
            return digest
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=SOURCE)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    digest = sha256(args.source)
    expected = expected_sha256(args.source)
    if expected is not None and expected != digest:
        raise SystemExit(f"{args.source}: SHA-256 {digest} does not match SHA256SUMS ({expected})")
    with np.load(args.source, allow_pickle=False) as src:
        arrays = {
            "x_train": np.asarray(src["x_train"][:NUM_TRAIN], dtype=np.uint8),
            "y_train": np.asarray(src["y_train"][:NUM_TRAIN], dtype=np.uint8),
            "x_test": np.asarray(src["x_test"][:NUM_TEST], dtype=np.uint8),
            "y_test": np.asarray(src["y_test"][:NUM_TEST], dtype=np.uint8),
        }
    arrays["num_classes"] = np.asarray(10, dtype=np.int32)
    arrays["source"] = np.asarray(
        f"MNIST (Y. LeCun, C. Cortes, C. Burges): first {NUM_TRAIN} train and first "
        f"{NUM_TEST} test images of mnist.npz (sha256 {digest})"
    )
    atomic_write_with(args.out, lambda f: np.savez_compressed(f, **arrays))
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")
    for split in ("train", "test"):
        print(split, np.bincount(arrays[f"y_{split}"], minlength=10).tolist())


if __name__ == "__main__":
    main()
