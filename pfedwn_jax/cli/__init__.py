"""The `pfedwn` command line: a thin layer over the Python API.

Each subcommand lives in its own module exposing `add_parser(subparsers)`; the parser sets
`func(args) -> int`. A `ValueError` from the API becomes a one-line error and exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from pfedwn_jax.cli import data, neighbors, run
from pfedwn_jax.devices import use_cpu_devices

# the subcommand modules, in the order `pfedwn --help` lists them
SUBCOMMANDS = (neighbors, data, run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pfedwn",
        description="Personalized federated learning over D2D wireless networks (JAX).",
    )
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        metavar="N",
        help="CPU devices JAX exposes; the engine trains clients on them in parallel "
        "(default: one per core; 1 turns it off)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cpu_devices is not None and args.cpu_devices < 1:
        parser.error(f"--cpu-devices must be >= 1; got {args.cpu_devices}")
    use_cpu_devices(args.cpu_devices)  # before this process's first JAX computation
    try:
        return int(args.func(args) or 0)
    except ValueError as e:
        print(f"pfedwn {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"pfedwn {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
