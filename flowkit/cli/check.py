"""`flowkit check MODEL`: run flowkit's correctness checks on a saved model and print the report.

A chain is checked layer by layer (see [`check_bijector`][flowkit.testing.check_bijector]);
the report ends with the failing layers, by index and class, and the checks each one fails.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `flowkit check` subcommand."""
    parser = subparsers.add_parser(
        "check",
        help="run the correctness checks on a saved model",
        description="Run flowkit.testing.check_flow (or check_bijector) on a saved model, in float64; "
        "a chain is checked layer by layer, and the report names each failing layer (index and class) "
        "with the checks it fails; exit code 1 on failure.",
    )
    parser.add_argument("model", metavar="MODEL", help="model directory (e.g. runs/moons/model)")
    parser.add_argument("-n", type=int, default=2000, help="samples for the flow checks (default 2000)")
    parser.add_argument(
        "--atol", type=float, default=1e-6, help="tolerance of the pointwise comparisons (default 1e-6)"
    )
    parser.add_argument(
        "--mass-tol", type=float, default=1e-2, help="tolerance on the total mass in 1-D/2-D (default 0.01)"
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run `flowkit check` for parsed arguments; returns the exit code."""
    from .. import io
    from ..bijectors import Bijector
    from ..flows import Flow
    from ..testing import CheckReport, check_bijector, check_flow

    if args.n < 1:
        raise ValueError(f"-n must be a positive integer, got {args.n}")
    for name in ("atol", "mass_tol"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    model = io.load(args.model)
    if not isinstance(model, (Flow, Bijector)):
        raise ValueError(f"{args.model} holds a {type(model).__name__}, neither a flow nor a bijector")
    try:
        if isinstance(model, Flow):
            report = check_flow(model, n=args.n, atol=args.atol, mass_tol=args.mass_tol, raise_on_failure=False)
        else:
            report = check_bijector(model, atol=args.atol, raise_on_failure=False)
    except (ValueError, RuntimeError, ArithmeticError) as error:  # e.g. NaN weights trip the input checks
        report = CheckReport(type(model).__name__)
        report.add("checks ran to the end", False, f"{type(error).__name__}: {error}")
    print(report)
    return 0 if report.passed else 1
