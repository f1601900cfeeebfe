"""`flowkit check MODEL`: run flowkit's correctness checks on a saved model and print the report.

A chain is checked layer by layer (see [`check_bijector`][flowkit.testing.check_bijector]);
the report ends with the failing layers, by index and class, and the checks each one fails.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from .arguments import add_threads, positive_float
from .sample import add_model_options

__all__ = ["add_parser", "run", "progress"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `flowkit check` subcommand."""
    parser = subparsers.add_parser(
        "check",
        help="run the correctness checks on a saved model",
        description="Run flowkit.testing.check_flow (or check_bijector) on a saved model, in float64; "
        "a chain is checked layer by layer, and the report names each failing layer (index and class) "
        "with the checks it fails; exit code 1 on failure.",
    )
    add_model_options(parser, "samples for the flow checks", 2000)
    add = parser.add_argument
    add("--atol", type=positive_float, default=1e-6, help="tolerance of the pointwise comparisons (default 1e-6)")
    add("--mass-tol", type=positive_float, default=1e-2, help="tolerance on the total mass in 1-D/2-D (default 0.01)")
    add_threads(parser, "default 1 for events of at most 16 numbers")
    parser.set_defaults(func=run)
    return parser


@contextmanager
def progress(what: str, stream: TextIO | None = None, every: float = 1.0) -> Iterator[None]:
    """Show `flowkit check: checking WHAT ... N s` on a terminal while the block runs (nothing elsewhere).

    Arguments:
        what: what is being checked.
        stream: where to write (default stderr); nothing is written unless it is a terminal.
        every: seconds between updates of the elapsed time.
    """
    stream = sys.stderr if stream is None else stream
    if not stream.isatty():
        yield
        return
    start, done = time.perf_counter(), threading.Event()

    def show(end: str = "") -> None:
        stream.write(f"\rflowkit check: checking {what} ... {time.perf_counter() - start:.0f} s{end}")
        stream.flush()

    def beat() -> None:
        while not done.wait(every):
            show()

    show()
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        show(" (done)\n")


def run(args: argparse.Namespace) -> int:
    """Run `flowkit check` for parsed arguments; returns the exit code."""
    from .. import io
    from ..bijectors import Bijector
    from ..testing import CheckReport, check_bijector, check_flow
    from .sample import model_directory, threads_for

    model = io.load(model_directory(args.model))
    flow = getattr(model, "bijective", False)  # a flow that check_flow checks, through its bijector
    if not (flow or isinstance(model, Bijector)):
        raise ValueError(f"{args.model} holds a {type(model).__name__}, neither a flow nor a bijector")
    what = f"{type(model).__name__} (float64" + (f", {args.n} samples)" if flow else ")")
    try:
        with threads_for(args.threads, math.prod(model.event_shape)), progress(what):
            if flow:
                report = check_flow(model, n=args.n, atol=args.atol, mass_tol=args.mass_tol, raise_on_failure=False)
            else:
                report = check_bijector(model, atol=args.atol, raise_on_failure=False)
    except (ValueError, RuntimeError, ArithmeticError) as error:  # e.g. NaN weights trip the input checks
        report = CheckReport(type(model).__name__)
        report.add("checks ran to the end", False, f"{type(error).__name__}: {error}")
    print(report)
    return 0 if report.passed else 1
