"""`pfedwn --import MODULE`: the user's own code, imported before the flags are checked.

A module that calls `register_model`, `register_algorithm` or `register_dataset` at import
time makes its names usable on the command line (`--model`, `--algorithms`, `--dataset`,
`--grid`) exactly as in Python. The flag is read first, by a small parser that ignores every
other flag, so the modules are imported before the real parser and the config checks see the
names; `--cpu-devices` is read the same way and applied before the imports, since a user module
may start JAX.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path

IMPORT_HELP = (
    "import MODULE (a dotted name found from the current directory or sys.path, or a path to "
    "a .py file) before anything else, so the models, algorithms and datasets it registers "
    "are usable by name; repeat for more"
)


class EarlyOptions(argparse.Namespace):
    cpu_devices: int | None
    imports: list[str]


def add_import_flag(parser: argparse.ArgumentParser) -> None:
    """`--import MODULE` (repeatable) on `parser` and every subcommand below it, so it may stand
    anywhere; read by `early_options`, not from the parsed arguments."""
    for action in parser._actions:  # argparse keeps subcommands only there
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                add_import_flag(command)
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        metavar="MODULE",
        default=argparse.SUPPRESS,
        help=IMPORT_HELP,
    )


def early_options(argv: list[str]) -> EarlyOptions:
    """`--cpu-devices` and every `--import` of `argv`, wherever they stand; anything malformed
    is left for the real parser to report (its one-line usage error)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("--cpu-devices", default=None)
    parser.add_argument("--import", dest="imports", action="append", default=[])
    out = EarlyOptions(cpu_devices=None, imports=[])
    try:
        known, _ = parser.parse_known_args(argv)
    except (argparse.ArgumentError, SystemExit):
        return out
    out.imports = list(known.imports)
    text = known.cpu_devices
    out.cpu_devices = int(text) if text is not None and text.strip().isdigit() else None
    return out


def import_modules(names: list[str]) -> None:
    """Import each module (a dotted name or a `.py` path), in order; `ValueError` naming the
    module and what went wrong."""
    if names and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: modules beside the user's files
    for name in names:
        if name.endswith(".py") and not Path(name).expanduser().is_file():
            raise ValueError(f"--import {name}: no such file")
        try:
            _import(name)
        except ModuleNotFoundError as e:
            if e.name is None or not (name == e.name or name.startswith(f"{e.name}.")):
                raise ValueError(f"--import {name}: {type(e).__name__}: {e}") from e
            raise ValueError(
                f"--import {name}: no module named {e.name!r} in the current directory or on "
                "sys.path (give a file as --import path/to/module.py, or set PYTHONPATH)"
            ) from None
        except SystemExit as e:  # e.g. a script's `sys.exit(main())` without a __main__ guard
            raise ValueError(
                f"--import {name}: the module called sys.exit({e.code!r}) while being imported "
                '(put its script code under `if __name__ == "__main__":`)'
            ) from None
        except Exception as e:  # the user's module failed while importing
            raise ValueError(f"--import {name} failed: {type(e).__name__}: {e}") from e


def _import(name: str) -> None:
    if not name.endswith(".py"):
        importlib.import_module(name)
        return
    path = Path(name).expanduser().resolve()
    module_name = path.stem
    if getattr(sys.modules.get(module_name), "__file__", None) == str(path):
        return  # already imported from this file
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {str(path)!r} as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
