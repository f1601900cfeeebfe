"""`flowkit sample MODEL -n N --out FILE`: draw samples from a saved flow into a .npy or .csv file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]

_SUFFIXES = (".npy", ".csv")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `flowkit sample` subcommand."""
    parser = subparsers.add_parser(
        "sample",
        help="draw samples from a saved model",
        description="Draw N samples from a model saved by flowkit (flowkit.io.save) into a .npy or .csv file, "
        "one row per sample (events with several dimensions, such as lattices, are flattened row-major).",
    )
    parser.add_argument("model", metavar="MODEL", help="model directory (e.g. runs/moons/model)")
    parser.add_argument("-n", type=int, default=1000, help="number of samples (default 1000)")
    parser.add_argument("--out", required=True, help="output file, .npy or .csv")
    parser.add_argument("--seed", type=int, default=None, help="seed of the draw")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run `flowkit sample` for parsed arguments; returns the exit code."""
    import numpy as np
    import torch

    from .. import io

    out = Path(args.out)
    if out.suffix.lower() not in _SUFFIXES:
        raise ValueError(f"--out must end in .npy or .csv, got {out.name!r}")
    if args.n < 1:
        raise ValueError(f"-n must be a positive integer, got {args.n}")
    model = io.load(args.model)
    if not hasattr(model, "sample"):
        raise ValueError(f"{args.model} holds a {type(model).__name__}, which cannot be sampled (not a flow)")
    if getattr(model, "context_features", 0):
        raise ValueError(
            f"{args.model} is a conditional flow ({model.context_features} context features); sample it from Python"
        )
    if args.seed is not None:
        torch.manual_seed(args.seed)
    model.eval()
    with torch.no_grad():
        samples = model.sample((args.n,)).reshape(args.n, -1).cpu().double().numpy()
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".npy":
        np.save(out, samples)
    else:
        header = ",".join(f"x{i + 1}" for i in range(samples.shape[1]))
        np.savetxt(out, samples, delimiter=",", header=header, comments="", fmt="%.9g")
    print(f"wrote {args.n} samples of dimension {samples.shape[1]} to {out}")
    return 0
