"""The `flowkit` command (also `python -m flowkit`).

Each subcommand lives in its own module of this package and defines
`add_parser(subparsers)`, which registers the subcommand and sets
`func` (a callable taking the parsed arguments and returning an exit code).
Errors a user can fix (missing file, bad CSV, unknown flow) are printed as one
line and give exit code 2; library warnings print as one line too
(`flowkit fit: warning: ...`), and an unknown option gets the usage of the
subcommand it was given to.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import warnings
from collections.abc import Iterator as _Iterator
from typing import Any as _Any

__all__ = ["main", "build_parser", "COMMANDS"]

#: Subcommand modules, in the order ``flowkit --help`` lists them.
COMMANDS = ["fit", "sample", "check", "bench", "boltzmann", "events", "index", "sbi"]

#: One-line summaries for `flowkit --help`, which lists the subcommands without importing them (nor torch).
_SUMMARIES = {
    "fit": "fit a flow to data (built-in name or CSV/TSV/NPY file)",
    "sample": "draw samples from a saved model",
    "check": "run the correctness checks on a saved model",
    "bench": "run a benchmark",
    "boltzmann": "train a Boltzmann generator on a target energy",
    "events": "fit temporal point processes to event sequences",
    "index": "build a flow-based learned index of sorted keys",
    "sbi": "neural posterior estimation on a simulator, scored against its reference posterior",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `flowkit` argument parser, with every subcommand that imports.

    Arguments:
        command: build only this subcommand's parser in full, and list the others by name and
            summary (what `main` does, so that `flowkit --help` and `flowkit --version` import
            no subcommand, and torch not at all); None builds them all.
    """
    from .. import __version__

    parser = argparse.ArgumentParser(prog="flowkit", description="Normalizing flows: fit, sample, check, benchmark.")
    parser.add_argument("--version", action="version", version=f"flowkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        if command is not None and name != command and name in _SUMMARIES:
            sub.add_parser(name, help=_SUMMARIES[name], add_help=False)
            continue
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name == f"{__name__}.{name}":
                continue
            raise
        module.add_parser(sub)
    return parser


def _innermost_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)subcommand that `args` ran, e.g. that of `flowkit bench likelihood`."""
    while True:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, actions[0].dest, None) if actions else None
        if name not in (actions[0].choices if actions else {}):
            return parser
        parser = actions[0].choices[name]


def _one_line_warnings(command: str) -> _Any:
    """A `warnings.showwarning` that prints `flowkit COMMAND: warning: message` on one line, without source."""

    def show(message: _Any, category: type, filename: str, lineno: int, file: _Any = None, line: _Any = None) -> None:
        text = " ".join(str(message).split())
        print(f"flowkit {command}: warning: {text}", file=sys.stderr if file is None else file)

    return show


@contextlib.contextmanager
def _chosen_threads(threads: int | None) -> _Iterator[None]:
    """Inside the block, `fit` uses the `--threads` a user gave (None: nothing chosen; torch is not imported)."""
    if threads is None:
        yield
        return
    from ..train.loop import chosen_threads

    with chosen_threads(threads):
        yield


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    named = next((a for a in argv if not a.startswith("-")), None)  # the subcommand, if any
    parser = build_parser(named if named in COMMANDS else "")
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # a typo in a subcommand's option: that subcommand's usage, not the top level's
        _innermost_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    with warnings.catch_warnings(), _chosen_threads(getattr(args, "threads", None)):
        warnings.showwarning = _one_line_warnings(args.command)
        try:
            return int(args.func(args) or 0)
        except (ValueError, OSError) as error:  # bad arguments and data; files that cannot be read or written
            print(f"flowkit {args.command}: error: {error}", file=sys.stderr)
            return 2
