"""What every command line of the package shares: the `pfedwn` CLI and `scripts/*.py`.

- `OneLineParser`: a usage error is one line on stderr and exit status 2;
- `run_command`: runs a command's work and turns its exceptions into one line and an exit
  status (2: a `ValueError`, the input asks for something impossible, or a full disk, named
  with its mount point and the path; 1: another `OSError`, the system failed; 130: Ctrl-C,
  a second Ctrl-C exiting at once, `interrupts`), never a traceback;
- argument types and checks that fail before any work: `out_path` (an empty `--out` is
  refused, not read as the current directory), `check_out_dir` (writable),
  `parse_seed_list`, `parse_methods`, `as_flag` (a parser's error named by its flag),
  `check_eps_flag` / `refuse_eps_flag` (a selection threshold above the largest P_err is
  refused at the flag).

Imports nothing heavy (no JAX): a script parses and checks its arguments in milliseconds.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pfedwn_jax._checks import check_float
from pfedwn_jax.experiment.config import check_algorithms
from pfedwn_jax.experiment.grid import parse_seeds
from pfedwn_jax.interrupts import EXIT_INTERRUPTED, exit_now, interrupt_guard
from pfedwn_jax.io import DiskFullError, check_writable_dir, disk_full_error, is_disk_full
from pfedwn_jax.runner.writers import make_writers
from pfedwn_jax.wireless import ChannelParams, eps_ceiling_message

if TYPE_CHECKING:
    from pfedwn_jax.experiment.config import ExperimentConfig

EXIT_USAGE = 2  # a bad argument or value: nothing was done
EXIT_SYSTEM = 1  # the input was fine, the system failed (permissions; a full disk is 2)
T = TypeVar("T")
_Configs = TypeVar("_Configs", "ExperimentConfig", "list[ExperimentConfig]")
NO_SELECTION = "; --selection false runs without selection"


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line on stderr and exit status 2.

    Subparsers inherit the class, so a bad flag of any subcommand reads the same way.
    """

    def error(self, message: str):  # argparse's hook for usage errors
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def run_command(prog: str, work: Callable[[], int | None]) -> int:
    """`work()`'s exit status, with its errors as one line on stderr prefixed by `prog`:
    `ValueError` -> 2, `OSError` -> 1 (with the path it concerns), Ctrl-C -> 130.

    The whole command runs under `interrupts.interrupt_guard()`: a first Ctrl-C unwinds the
    work (a checkpoint's last save completes), says so and ends the process with 130 at once
    (`interrupts.exit_now`: a Ctrl-C during Python's shutdown would kill it by the signal); a
    second one exits with 130 at once wherever it lands. A `KeyboardInterrupt` raised without
    a signal (a test) returns 130."""
    with interrupt_guard() as guard:
        try:
            return _statuses(prog, work)
        except KeyboardInterrupt:  # also one landing in `_statuses`'s own handlers
            term = guard.received and guard.signum == signal.SIGTERM
            print(f"{prog}: {'terminated (SIGTERM)' if term else 'interrupted'}", file=sys.stderr)
            if guard.received:
                exit_now(128 + int(guard.signum))  # 130 for Ctrl-C, 143 for SIGTERM
            return EXIT_INTERRUPTED


def _statuses(prog: str, work: Callable[[], int | None]) -> int:
    try:
        return int(work() or 0)
    except Exception as e:
        if is_disk_full(e):  # also inside a library's own error type (tensorstore's)
            full = e if isinstance(e, DiskFullError) else disk_full_error(_path_of(e))
            print(f"{prog}: error: {full}", file=sys.stderr)
            return EXIT_USAGE
        if isinstance(e, ValueError):
            print(f"{prog}: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        if isinstance(e, OSError):
            print(f"{prog}: error: {describe_os_error(e)}", file=sys.stderr)
            return EXIT_SYSTEM
        raise


def _path_of(e: BaseException | None) -> str:
    """The file an error concerns (its `filename`, also inside its chain), else `.`."""
    while e is not None:
        if isinstance(e, OSError) and e.filename is not None:
            return str(e.filename)
        e = e.__cause__ or e.__context__
    return "."


def describe_os_error(e: OSError) -> str:
    """One line: what failed and the path(s) it concerns (`[Errno 28] ...` without the code)."""
    what = " ".join((e.strerror or str(e) or type(e).__name__).split())
    paths = [str(p) for p in (e.filename, e.filename2) if p is not None]
    return f"{what}: {' -> '.join(paths)}" if paths else what


def out_path(text: str) -> Path:
    """argparse `type` of an output path: an empty one (an unset shell variable, `--out ''`)
    is refused instead of meaning the current directory; `.` says that explicitly."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"an output path must not be empty; got {text!r} (use . for the current directory)"
        )
    return Path(text)


def check_out_dir(path: str | Path, flag: str = "--out") -> Path:
    """`path` as a Path if it is, or can be created as, a writable directory; `ValueError`
    naming `flag` otherwise (empty, a file, under a file, read-only). Nothing is created."""
    if not str(path).strip():
        raise ValueError(f"{flag} must not be empty; got {str(path)!r}")
    return check_writable_dir(path, flag)


def parse_seed_list(text: str, flag: str = "--seeds") -> list[int]:
    """`"0,1,2"` or a range `"0-4"` as seeds (each >= 0, none repeated); `ValueError` naming
    `flag`, the bad item and the allowed form."""

    return list(as_flag(flag, "seeds", parse_seeds, text))


def parse_methods(text: str, flag: str = "--methods") -> tuple[str, ...]:
    """`"local,pfedwn"` as registered algorithm names; `ValueError` naming `flag`, the
    unknown name and the registered ones."""

    return as_flag(flag, "algorithms", check_algorithms, text)


def as_flag(flag: str, name: str, parse: Callable[..., T], *args: Any) -> T:
    """`parse(*args)`, its `ValueError` naming `flag` where it named the field `name`
    ("seeds: ..." from `--seeds` reads "--seeds: ...")."""
    try:
        return parse(*args)
    except ValueError as e:
        text = str(e)
        renamed = flag + text[len(name) :] if text.startswith(name) else f"{flag}: {text}"
        raise ValueError(renamed) from None


# --------------------------------------------------------------------------- eps
def check_eps_flag(
    eps: float | None, params: Any = None, moments: str = "paper", hint: str = ""
) -> None:
    """`ValueError` when a selection threshold given as `--eps` lies above the largest P_err
    of the formula (`wireless.perr_ceiling` of `params`): it would select every neighbor.
    `hint` ends the message (e.g. the command's way to turn selection off)."""
    if eps is None:
        return

    eps = check_float("eps", eps, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    message = eps_ceiling_message(eps, params, moments)
    if message is not None:
        raise ValueError(f"--{message}{hint}")


def refuse_eps_flag(eps: float | None, build: Callable[[], _Configs]) -> _Configs:
    """`build()`'s configs (one `ExperimentConfig` or a list), refusing an explicit `--eps`
    above the P_err ceiling of any config that selects (`check_eps_flag`, one line).

    The configs' own warning about such an eps (logged on construction, for the Python API)
    is held back while they are built and shown only when nothing is refused, so a refusal
    is one line.
    """
    if eps is None:
        return build()

    held: list[logging.LogRecord] = []
    logger = logging.getLogger("pfedwn_jax")

    def hold(record: logging.LogRecord) -> bool:  # kept in `held` instead of emitted
        held.append(record)
        return False

    logger.addFilter(hold)
    try:
        built = build()
    finally:
        logger.removeFilter(hold)
    for config in built if isinstance(built, list | tuple) else [built]:
        if config.selection:
            params = ChannelParams(**config.channel)
            check_eps_flag(config.eps, params, config.moments, NO_SELECTION)
    for record in held:
        logger.handle(record)
    return built


# --------------------------------------------------------------------------- models and logs
MODELS = "models"  # OUT/models/: the saved final models (`--save-models`)
LOGS = "logs"  # OUT/logs/: the metric writers' files (`--log-to`)


def add_output_flags(p: argparse.ArgumentParser) -> None:
    """`--save-models`, `--log-to`, `--log-dir`, `--wandb-project`, `--wandb-mode`."""
    p.add_argument(
        "--save-models",
        action="store_true",
        help="keep every slot's final personalised models in DIR/models/ (orbax; read them "
        "with pfedwn_jax.load_models); they stay when the checkpoint is removed",
    )
    p.add_argument(
        "--log-to",
        metavar="KINDS",
        help="metric writers, comma-separated: tensorboard (extra [tensorboard]), wandb "
        "(extra [wandb]), csv; each round is logged once, after its checkpoint step",
    )
    p.add_argument(
        "--log-dir",
        type=out_path,
        metavar="DIR",
        help="where the writers write: tensorboard/, metrics.csv, wandb/ (default: OUT/logs)",
    )
    p.add_argument("--wandb-project", default="pfedwn", help="W&B project (default: pfedwn)")
    p.add_argument(
        "--wandb-mode",
        choices=("offline", "online"),
        default="offline",
        help="offline (default: files under the log dir, `wandb sync` uploads them) or online",
    )


def writers_from_args(args: argparse.Namespace, out: Path) -> list[Any]:
    """The metric writers of `--log-to` (none without it), writing under `--log-dir` (default
    `OUT/logs`); a resumed job (`--resume`) appends to the CSV. A missing extra or an unknown
    kind is a `ValueError` before any work."""
    if not getattr(args, "log_to", None):
        if getattr(args, "log_dir", None) is not None:
            raise ValueError("--log-dir needs --log-to (tensorboard, wandb and/or csv)")
        return []

    logdir = check_out_dir(args.log_dir if args.log_dir is not None else out / LOGS, "--log-dir")
    return make_writers(
        args.log_to,
        logdir,
        append=bool(getattr(args, "resume", False)),
        wandb_project=args.wandb_project,
        wandb_mode=args.wandb_mode,
    )


def models_dir(args: argparse.Namespace, out: Path) -> Path | None:
    """`OUT/models` with `--save-models`, else None."""
    return out / MODELS if getattr(args, "save_models", False) else None
