"""The ``pycuda-heads`` command: check, validate, tune, sweep, export, efficiency, bench,
smoke, report."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn, Sequence


class _Parser(argparse.ArgumentParser):
    """A malformed argument ends in one line and exit status 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="pycuda-heads", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug log lines")
    sub = parser.add_subparsers(dest="command", required=True)
    from . import smoke
    from .perf import bench
    from .report import build
    from .tuning import cli as tuning_cli
    from .verify import static_check, validation
    for module in (static_check, validation, tuning_cli, bench, smoke, build):
        module.register(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
