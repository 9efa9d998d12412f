"""`pfedwn data`: show a federated partition, list datasets, prepare a TFDS dataset."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from pfedwn_jax.data import (
    DEFAULT_DATASET,
    DEFAULT_MIN_SAMPLES,
    POOLS,
    SCHEMES,
    available_datasets,
    bucketize,
    client_label_counts,
    format_bytes,
    label_skew,
    make_federated,
    memory_bytes,
    memory_report,
    prepare_tfds,
)
from pfedwn_jax.data.plot import plot_label_heatmap
from pfedwn_jax.io import check_writable_file
from pfedwn_jax.plotting import MISSING


def format_table(counts: np.ndarray, train: np.ndarray, test: np.ndarray) -> str:
    """Class counts per client as a fixed-width text table with totals."""
    clients, classes = counts.shape
    header = ["client", "train", "test", *[f"L{k}" for k in range(classes)]]
    rows = [[str(n), str(train[n]), str(test[n]), *map(str, counts[n])] for n in range(clients)]
    rows.append(["total", str(train.sum()), str(test.sum()), *map(str, counts.sum(0))])
    width = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, width, strict=True))
    return "\n".join([line(header), *(line(r) for r in rows)])


def cmd_show(args: argparse.Namespace) -> int:
    if args.plot:
        check_writable_file(args.plot, "--plot")
    fed = make_federated(
        args.dataset,
        args.clients,
        args.scheme,
        seed=args.seed,
        alpha=args.alpha,
        train_frac=args.train_frac,
        min_samples=args.min_samples,
        pool=args.pool,
        classes_per_client=args.classes_per_client,
        data_dir=args.data_dir,
        device=False,
    )
    counts = client_label_counts(fed)
    print(
        f"{fed.name}: {args.clients} clients, scheme={args.scheme}, alpha={args.alpha}, "
        f"seed={args.seed}, pool={args.pool}, train_frac={args.train_frac}"
    )
    print(format_table(counts, np.asarray(fed.train.count), np.asarray(fed.test.count)))
    print(f"label skew (mean total variation to the pool): {label_skew(counts):.3f}")
    for label, cd in (("train", fed.train), ("test", fed.test)):
        print("memory " + memory_report(cd, label))
        if args.buckets > 1:
            buckets = bucketize(cd, args.buckets)
            total = sum(memory_bytes(b) for _, b in buckets)
            sizes = ", ".join(f"{len(ids)}x{b.max_samples}" for ids, b in buckets)
            print(f"  with {len(buckets)} buckets ({sizes}): {format_bytes(total)}")
    if args.plot:
        title = f"{fed.name}, {args.scheme} (alpha={args.alpha}), seed {args.seed}"
        png = plot_label_heatmap(counts, args.plot, title=title)
        if png is None:
            print(MISSING, file=sys.stderr)
        else:
            print(f"wrote {png}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    del args
    for name in available_datasets():
        note = " (embedded default, no download)" if name == DEFAULT_DATASET else ""
        print(f"{name}{note}")
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    where = prepare_tfds(args.name, data_dir=args.data_dir, manual_dir=args.manual_dir)
    print(f"prepared {args.name} in {where}; load it with --dataset {args.name} --data-dir {where}")
    return 0


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("data", help="datasets and federated partitions")
    sub = parser.add_subparsers(dest="data_command", required=True)

    show = sub.add_parser("show", help="class counts per client (table, optional heatmap)")
    show.add_argument("--dataset", default=DEFAULT_DATASET, help="name or npz:PATH")
    show.add_argument("--clients", type=int, default=11)
    show.add_argument("--scheme", choices=SCHEMES, default="paper")
    show.add_argument("--seed", type=int, default=0)
    show.add_argument("--alpha", type=float, default=0.1, help="Dirichlet concentration")
    show.add_argument("--min-samples", type=int, default=DEFAULT_MIN_SAMPLES)
    show.add_argument("--classes-per-client", type=int, default=2, help="pathological scheme")
    show.add_argument("--train-frac", type=float, default=0.75)
    show.add_argument("--pool", choices=POOLS, default="union")
    show.add_argument("--data-dir", default=None, help="TFDS data directory")
    show.add_argument("--buckets", type=int, default=1, help="also report bucketed memory")
    show.add_argument("--plot", default=None, help="write a clients x labels heatmap here")
    show.set_defaults(func=cmd_show)

    lst = sub.add_parser("list", help="dataset names")
    lst.set_defaults(func=cmd_list)

    prep = sub.add_parser("prepare", help="download and prepare a TFDS dataset (needs TensorFlow)")
    prep.add_argument("name")
    prep.add_argument("--data-dir", default=None, help="TFDS data directory")
    prep.add_argument("--manual-dir", default=None, help="folder with the original archives")
    prep.set_defaults(func=cmd_prepare)
