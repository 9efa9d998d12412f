"""The `pfedwn` command line: a thin layer over the Python API.

Each subcommand lives in its own module exposing `add_parser(subparsers)`; the parser sets
`func(args) -> int`. `--import MODULE` (any position, repeatable; `cli.plugins`) imports the
user's modules before the flags are checked, so the models, algorithms and datasets they
register are usable by name. Errors become one line on stderr, never a traceback:

- exit status 2: a usage error from the parser (a bad flag or flag value) or a `ValueError`,
  i.e. the command line asks for something impossible (a bad value, an output path that is
  a file or not writable: checked before any work);
- exit status 2 also for a full disk: one line naming the filesystem (mount point, free
  space) and the path being written; nothing complete is removed, no temporary directory
  is left;
- exit status 1: another `OSError` during the work (a directory removed or made read-only
  meanwhile), printed with the path it concerns: the input was fine, the system failed, so
  the status differs from a usage error;
- exit status 3 (`pfedwn run`): finished and wrote its results, but a method diverged;
- exit status 143: stopped by SIGTERM, handled as a Ctrl-C (the same "checkpoint kept" line);
- exit status 130: interrupted (Ctrl-C): the first Ctrl-C stops the work cleanly (a run's or
  sweep's checkpoint keeps its last complete step; the command says how to resume), a second
  one exits at once, also with 130 (`pfedwn_jax.interrupts`). Never a traceback or a crash.

The scripts (`scripts/reproduce.py`, `scripts/robustness.py`) share the parser, the error
handling and the argument checks (`cli.common`).
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version

from pfedwn_jax.cli import data, neighbors, run, sweep
from pfedwn_jax.cli.common import OneLineParser, describe_os_error, run_command
from pfedwn_jax.cli.plugins import add_import_flag, early_options, import_modules
from pfedwn_jax.devices import use_compilation_cache, use_cpu_devices

__all__ = ["build_parser", "describe_os_error", "main"]

# the subcommand modules, in the order `pfedwn --help` lists them
SUBCOMMANDS = (neighbors, data, run, sweep)


def package_version() -> str:
    """The installed version of the package (`pfedwn --version`)."""
    try:
        return version("pfedwn-jax")
    except PackageNotFoundError:  # run from a source tree without an install
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="pfedwn",
        description="Personalized federated learning over D2D wireless networks (JAX).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        metavar="N",
        help="CPU devices JAX exposes; the engine trains clients on them in parallel "
        "(default: one per core; 1 turns it off)",
    )
    parser.add_argument(
        "--compile-cache",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="keep compiled programs on disk, so running the same study again does not "
        "compile again (DIR default: $PFEDWN_COMPILATION_CACHE, else ~/.cache/pfedwn_jax/xla)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    add_import_flag(parser)  # `pfedwn --import M run` as well as `pfedwn run --import M`
    return parser


def bare_compile_cache(argv: list[str]) -> list[str]:
    """`argv` with a `--compile-cache` followed by a subcommand's name (or by another flag)
    written `--compile-cache=`: its directory is optional, and argparse would otherwise take
    `pfedwn --compile-cache sweep ...` as the directory `sweep` and miss the subcommand."""
    names = {m.__name__.rsplit(".", 1)[1] for m in SUBCOMMANDS}  # each module is its command
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--compile-cache" and (out[i + 1] in names or out[i + 1].startswith("-")):
            out[i] = "--compile-cache="
    if out and out[-1] == "--compile-cache":
        out[-1] = "--compile-cache="
    return out


def main(argv: list[str] | None = None) -> int:
    argv = bare_compile_cache(sys.argv[1:] if argv is None else list(argv))
    early = early_options(argv)
    if early.cpu_devices is None or early.cpu_devices >= 1:
        use_cpu_devices(early.cpu_devices)  # before the first JAX computation, user code's too
    try:
        import_modules(early.imports)  # before the parser and the config checks see the names
    except ValueError as e:
        print(f"pfedwn: error: {e}", file=sys.stderr)
        return 2
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2, already printed as one line)
        return int(e.code or 0)
    if args.cpu_devices is not None and args.cpu_devices < 1:
        parser.error(f"--cpu-devices must be >= 1; got {args.cpu_devices}")
    if args.compile_cache is not None:
        try:
            use_compilation_cache(args.compile_cache or None)
        except (OSError, ValueError) as e:
            why = describe_os_error(e) if isinstance(e, OSError) else str(e)
            print(f"pfedwn: error: --compile-cache {args.compile_cache!r}: {why}", file=sys.stderr)
            return 2
    return run_command(f"pfedwn {args.command}", lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
