"""``flowkit bench NAME``: run one of flowkit's benchmarks (the logic lives in :mod:`flowkit.bench`)."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

__all__ = ["add_parser", "BENCHMARKS"]

#: Benchmark name -> module with ``add_arguments(parser)`` and ``run(args)``.
BENCHMARKS = {"likelihood": "flowkit.bench.likelihood"}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("bench", help="run a benchmark", description="Run one of flowkit's benchmarks.")
    sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, module_name in BENCHMARKS.items():
        module = importlib.import_module(module_name)
        summary = (module.__doc__ or name).strip().splitlines()[0]
        child = sub.add_parser(name, help=summary, description=summary)
        module.add_arguments(child)
        child.set_defaults(func=module.run)
    return parser
