"""The `flowkit` command (also `python -m flowkit`).

Each subcommand lives in its own module of this package and defines
`add_parser(subparsers)`, which registers the subcommand and sets
`func` (a callable taking the parsed arguments and returning an exit code).
Errors a user can fix (missing file, bad CSV, unknown flow) are printed as one
line and give exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["main", "build_parser", "COMMANDS"]

#: Subcommand modules, in the order ``flowkit --help`` lists them.
COMMANDS = ["fit", "sample", "check", "bench", "boltzmann"]


def build_parser() -> argparse.ArgumentParser:
    """The `flowkit` argument parser, with every subcommand that imports."""
    from .. import __version__

    parser = argparse.ArgumentParser(prog="flowkit", description="Normalizing flows: fit, sample, check, benchmark.")
    parser.add_argument("--version", action="version", version=f"flowkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name == f"{__name__}.{name}":
                continue
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as error:  # bad arguments and data; files that cannot be read or written
        print(f"flowkit {args.command}: error: {error}", file=sys.stderr)
        return 2
