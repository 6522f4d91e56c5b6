"""The ``pycuda-heads`` command: check, identity, restamp, validate, tune, sweep, export, prune,
efficiency, bench, smoke, report."""
from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn, Sequence

from .core.device import GpuUnavailableError
from .records import VERSION


class _Parser(argparse.ArgumentParser):
    """A malformed argument ends in one line and exit status 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class _NoTuner:
    """The tuning commands where the tuner cannot be imported (Optuna missing, or a checkout
    run without installing): each says so in one line and exits 2."""

    COMMANDS = ("tune", "sweep", "export", "prune", "efficiency")

    def __init__(self, why: str) -> None:
        self.why = why

    def register(self, sub: "argparse._SubParsersAction") -> None:
        for name in self.COMMANDS:
            p = sub.add_parser(name, help=f"(unavailable: {self.why})", add_help=False)
            p.set_defaults(func=self._refuse, name=name, any_arguments=True)

    def _refuse(self, args: argparse.Namespace) -> int:
        print(f"pycuda-heads {args.name}: the tuner is unavailable ({self.why}); install it "
              f"with pip install -e '.[tune]' from a checkout", file=sys.stderr)
        return 2


# The tune extra: the tuner imports Optuna at its first command, too late for one line.
_TUNE_EXTRA = ("optuna", "scipy", "tqdm")


def _tuner() -> object:
    missing = [name for name in _TUNE_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        return _NoTuner(f"{', '.join(missing)} not installed")
    try:
        from .tuning import cli as tuning_cli
    except ImportError as exc:
        return _NoTuner(f"{type(exc).__name__}: {exc}")
    return tuning_cli


def _folder_error(args: argparse.Namespace) -> str | None:
    """Why the results folder ``--out`` cannot serve, or None: a command that writes results
    creates it when missing, one that only reads them (``reads_out``) needs it to exist."""
    value = getattr(args, "out", None)
    if value is not None:
        path, must_exist = Path(value), getattr(args, "reads_out", False)
        option = f"--out {path}"
        if must_exist and not path.exists():
            return f"{option} does not exist"
        existing = next(p for p in (path, *path.parents) if p.exists())
        if not existing.is_dir():
            return f"{option}: {existing} is a file, not a folder"
        if not must_exist and not os.access(existing, os.W_OK | os.X_OK):
            return f"{option}: {existing} is not writable"
    return None


def parser() -> argparse.ArgumentParser:
    """The ``pycuda-heads`` command line, every subcommand registered."""
    out = _Parser(prog="pycuda-heads", description=__doc__)
    out.add_argument("-v", "--verbose", action="store_true", help="debug log lines")
    out.add_argument("--version", action="version", version=f"pycuda-heads {VERSION}")
    sub = out.add_subparsers(dest="command", required=True)
    from . import smoke
    from .perf import bench
    from .report import build
    from .verify import identity, static_check, validation
    for module in (static_check, identity, validation, _tuner(), bench, smoke, build):
        module.register(sub)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser_ = parser()
    args, unknown = parser_.parse_known_args(argv)
    if unknown and not getattr(args, "any_arguments", False):
        parser_.error(f"unrecognized arguments: {' '.join(unknown)}")
    why = _folder_error(args)
    if why:  # before any GPU work, and before a command creates the folder
        print(f"pycuda-heads {args.command}: {why}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except GpuUnavailableError as exc:  # PyCUDA, a device or cuda-bindings missing: one line
        print(f"pycuda-heads {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
