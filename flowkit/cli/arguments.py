"""Argument types of the `flowkit` command: values checked by the parser, before torch is imported.

An option given a value it cannot take (`flowkit fit moons --steps -5`) is refused while the command line is
parsed, in well under a second, with the subcommand's usage and one error line naming the option, e.g.
`flowkit fit: error: argument --steps: must be a positive integer, got '-5'` (exit code 2).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["positive_int", "non_negative_int", "int_at_least", "positive_float", "non_negative_float", "add_threads"]


def _checked(convert: Callable[[str], T], allowed: Callable[[T], bool], rule: str) -> Callable[[str], T]:
    """An argparse `type=`: `convert` the text, refuse it unless `allowed`; `rule` says what it must be."""

    def parse(text: str) -> T:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not allowed(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        return value

    parse.__name__ = rule.replace(" ", "_")
    return parse


def _integer(low: int, rule: str) -> Callable[[str], int]:
    """An argparse `type=` for integers `>= low`."""
    return _checked(int, lambda value: value >= low, rule)


def _real(strict: bool, rule: str) -> Callable[[str], float]:
    """An argparse `type=` for finite numbers `> 0` (`strict`) or `>= 0`."""
    return _checked(float, lambda value: math.isfinite(value) and (value > 0 if strict else value >= 0), rule)


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse `type=` for integers of at least `low` (`int_at_least(2)` for a chain that needs two states)."""
    return _integer(low, f"an integer of at least {low}")


#: Integers >= 1 (steps, batch sizes, layers, threads, sample counts).
positive_int = _integer(1, "a positive integer")
#: Integers >= 0 (optional counts: 0 for none).
non_negative_int = _integer(0, "a non-negative integer")
#: Finite numbers > 0 (learning rates, tolerances).
positive_float = _real(True, "a positive number")
#: Finite numbers >= 0 (0 for off, e.g. `--clip 0`).
non_negative_float = _real(False, "a non-negative number")


def add_threads(parser: argparse.ArgumentParser, default_help: str, default: int | None = None) -> None:
    """Add the option `--threads` (torch CPU threads) with its `default`, which `default_help` explains."""
    parser.add_argument("--threads", type=positive_int, default=default, help=f"torch CPU threads ({default_help})")
