"""``python -m pycuda_heads.tuning <tune|sweep|export|efficiency> ...``: the tuning commands on
their own (the same as ``pycuda-heads <command>``), for machines where only they are needed."""
from __future__ import annotations

import argparse
import logging
import sys

from . import cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pycuda_heads.tuning", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug log lines")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
