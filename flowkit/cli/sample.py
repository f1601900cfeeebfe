"""`flowkit sample MODEL -n N [--out FILE]`: draw samples from a saved flow into a .npy, .csv or .tsv file, or stdout.

MODEL is a model directory or the run directory of `flowkit fit` that holds it (`RUN_DIR/model`).
CSV and TSV output (and stdout, which gets CSV) is headed by the column names of the data
the run was fitted to, when its CSV had a header (`metrics.json`'s `columns`), else `x1, x2, ...`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .arguments import add_threads, positive_int

__all__ = ["add_parser", "add_model_options", "run", "model_directory", "column_names", "threads_for"]

_SUFFIXES = (".npy", ".csv", ".tsv")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `flowkit sample` subcommand."""
    parser = subparsers.add_parser(
        "sample",
        help="draw samples from a saved model",
        description="Draw N samples from a model saved by flowkit (flowkit.io.save) into a .npy, .csv or .tsv "
        "file, or as CSV on stdout, one row per sample (events with several dimensions, such as lattices, are "
        "flattened row-major). CSV columns are named as in the data the run was fitted to.",
    )
    add_model_options(parser, "number of samples", 1000)
    parser.add_argument("--out", default="-", help="output file, .npy, .csv or .tsv (default -: CSV on stdout)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the draw")
    add_threads(parser, "default 1 for events of at most 16 numbers")
    parser.set_defaults(func=run)
    return parser


def add_model_options(parser: argparse.ArgumentParser, what_n: str, n: int) -> None:
    """The arguments of the commands on a saved model: MODEL and `-n` (`what_n`, default `n`)."""
    help_model = "model directory, or the run directory holding it (runs/moons/model or runs/moons)"
    parser.add_argument("model", metavar="MODEL", help=help_model)
    parser.add_argument("-n", type=positive_int, default=n, help=f"{what_n} (default {n})")


@contextlib.contextmanager
def threads_for(threads: int | None, features: int) -> Iterator[None]:
    """Inside the block, torch uses `threads` (`--threads`), else `default_threads(features)`; restored after."""
    import torch

    from ..train import default_threads

    threads, previous = threads or default_threads(features), torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        yield
    finally:
        torch.set_num_threads(previous)


def model_directory(path: str | Path) -> Path:
    """The model directory `path`, or `path/model` when `path` is the run directory of `flowkit fit`."""
    path = Path(path)
    if not (path / "config.json").exists() and (path / "model" / "config.json").exists():
        return path / "model"
    return path


def column_names(model_dir: Path, features: int) -> list[str]:
    """The names of the data's columns recorded by `flowkit fit` next to the model, else `x1`, ..., `xD`."""
    metrics = model_dir.parent / "metrics.json"
    try:
        names = json.loads(metrics.read_text()).get("columns") if metrics.exists() else None
    except (ValueError, OSError, AttributeError):
        names = None
    if isinstance(names, list) and len(names) == features and all(isinstance(n, str) for n in names):
        return names
    return [f"x{i + 1}" for i in range(features)]


def run(args: argparse.Namespace) -> int:
    """Run `flowkit sample` for parsed arguments; returns the exit code."""
    import numpy as np
    import torch

    from .. import io

    to_stdout = args.out == "-"
    out = Path(args.out)
    if not to_stdout and out.suffix.lower() not in _SUFFIXES:
        raise ValueError(f"--out must end in .npy or .csv (or .tsv; - for stdout), got {out.name!r}")
    directory = model_directory(args.model)
    model = io.load(directory)
    if not hasattr(model, "sample"):
        raise ValueError(f"{args.model} holds a {type(model).__name__}, which cannot be sampled (not a flow)")
    if getattr(model, "context_features", 0):
        raise ValueError(
            f"{args.model} is a conditional flow ({model.context_features} context features); sample it from Python"
        )
    if args.seed is not None:
        torch.manual_seed(args.seed)
    model.eval()
    with threads_for(args.threads, int(np.prod(tuple(getattr(model, "event_shape", []))))), torch.no_grad():
        samples = model.sample((args.n,)).reshape(args.n, -1).cpu().double().numpy()
    header = column_names(directory, samples.shape[1])
    if to_stdout:
        np.savetxt(sys.stdout, samples, delimiter=",", header=",".join(header), comments="", fmt="%.9g")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".npy":
        np.save(out, samples)
    else:
        delimiter = "\t" if out.suffix.lower() == ".tsv" else ","
        np.savetxt(out, samples, delimiter=delimiter, header=delimiter.join(header), comments="", fmt="%.9g")
    print(f"wrote {args.n} samples of dimension {samples.shape[1]} to {out}")
    return 0
