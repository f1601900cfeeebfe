"""`flowkit index build KEYS.npy`: a flow-based learned index (NFL) of sorted keys, with its conflicts and speed.

The keys (a 1-D .npy array of numbers, sorted; `--sort` sorts them) get a `KeyFlow` fitted to a 10% sample and a
`LearnedIndex` on the transformed keys (`flowkit.applications.learned_index`). The command prints, as JSON, the
position errors ("conflicts") of the index with the flow and of the same index on the raw keys, the index's memory,
and lookups per second of both and of NumPy's binary search on `--queries` keys drawn from the array (every
answer checked against `searchsorted`). `--out DIR` saves the flow (`DIR/flow`, `flowkit.io.save`) and the
index's models (`DIR/index.npz`). `bench/index.py` adds pygm's PGM-index to the comparison.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from .arguments import add_threads, positive_int

__all__ = ["add_parser", "run", "timed_lookups"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `flowkit index` and its subcommand `build`."""
    parser = subparsers.add_parser(
        "index",
        help="build a flow-based learned index of sorted keys",
        description="Learned indexes of sorted keys (NFL: a monotone flow, then piecewise-linear models).",
    )
    sub = parser.add_subparsers(dest="index_command", required=True, metavar="SUBCOMMAND")
    build = sub.add_parser(
        "build",
        help="fit the key flow, build the index, report conflicts, memory and lookups/s",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    build.add_argument("keys", metavar="KEYS", help="a .npy file of a 1-D array of keys")
    build.add_argument("--sort", action="store_true", help="sort unsorted keys instead of stopping with an error")
    build.add_argument("--slices", type=positive_int, default=None, help="linear models (default: keys / 64)")
    build.add_argument("--components", type=positive_int, default=16, help="mixture components per flow layer")
    build.add_argument("--layers", type=positive_int, default=2, help="flow layers (default 2)")
    build.add_argument("--steps", type=positive_int, default=500, help="fit steps of the flow (default 500)")
    build.add_argument("--queries", type=positive_int, default=100_000, help="lookups timed (default 100000)")
    build.add_argument("--seed", type=int, default=0, help="seed of the flow's sample, fit and queries")
    build.add_argument("--out", default=None, help="directory to save the flow and the index in")
    add_threads(build, "default: torch's")
    build.set_defaults(func=run)
    return parser


def timed_lookups(lookup: Any, queries: Any, repeats: int = 3) -> float:
    """Lookups per second of `lookup(queries)` (a batch call), the best of `repeats` runs."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        lookup(queries)
        best = min(best, time.perf_counter() - start)
    return len(queries) / best


def run(args: argparse.Namespace) -> int:
    """Fit, build, check and time; print the JSON summary (and save with `--out`)."""
    import numpy as np

    from ..applications.learned_index import KeyFlow, LearnedIndex, check_keys
    from ..io import save

    path = Path(args.keys)
    if path.suffix != ".npy":
        raise ValueError(f"KEYS must be a .npy file, got {path.name}")
    keys = check_keys(np.load(path, allow_pickle=False), "flowkit index build", sort=args.sort)
    flow = KeyFlow(args.components, args.layers).fit_keys(keys, steps=args.steps, seed=args.seed)
    start = time.perf_counter()
    learned = LearnedIndex(keys, args.slices, flow=flow)
    build_seconds = time.perf_counter() - start
    raw = LearnedIndex(keys, args.slices)
    queries = keys[np.random.default_rng(args.seed).integers(0, keys.size, args.queries)]
    expected = np.searchsorted(keys, queries, side="left")
    for index in (learned, raw):
        if not (index.lookup(queries) == expected).all():
            raise RuntimeError("a lookup differs from searchsorted: please report this bug")
    summary = {
        "keys": int(keys.size),
        "distinct": int(np.unique(keys).size),
        "slices": learned.slices,
        "conflicts_flow": learned.conflicts(),
        "conflicts_raw": raw.conflicts(),
        "index_bytes": learned.nbytes,
        "build_seconds": build_seconds,
        "lookups_per_second": {
            "flow_index": timed_lookups(learned.lookup, queries),
            "raw_index": timed_lookups(raw.lookup, queries),
            "searchsorted": timed_lookups(lambda q: np.searchsorted(keys, q, side="left"), queries),
        },
        "fallbacks": learned.fallbacks,
    }
    if args.out:
        out = Path(args.out)
        save(flow, out / "flow")
        arrays = {"slope": learned.slope, "intercept": learned.intercept, "below": learned.below}
        np.savez(out / "index.npz", above=learned.above, bounds=np.array([learned.low, learned.high]), **arrays)
    print(json.dumps(summary, indent=1))
    return 0
