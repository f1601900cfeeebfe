"""Learned index (NFL) against NumPy's binary search and pygm's PGM-index: lookups per second, memory, conflicts.

For each key generator of `flowkit.applications.learned_index` and each size, the script fits a `KeyFlow` to a
10% sample, builds the `LearnedIndex` on the transformed keys and the same index on the raw keys, checks every
answer against `numpy.searchsorted`, and times `--queries` lookups of keys drawn from the array:

- the learned indexes and `searchsorted` answer the whole batch in one vectorised call;
- pygm's `SortedList` (a PGM-index, `pip install pygm`, in the `bench` extra) answers one `bisect_left` per
  Python call; skipped with a note when pygm is missing.

Memory is what each structure holds beyond the keys: the models, error bounds and flow parameters of the learned
index, pygm's `index size`, none for binary search.

    python bench/index.py --sizes 1000000,10000000 --threads 1

(the defaults: 16 components and 2 layers per flow, 300 fit steps, one model per 64 keys; a few minutes at one
thread). Prints a Markdown table and writes JSON with `--out`. The four structures are timed in interleaved rounds
(best of 3); "flow's share" is the fraction of a flow-index lookup spent in the flow's transform.

Measured with the defaults (one thread, 2-core machine under a load of about 14, so rates are low and noisy):
conflicts max/mean raw -> flow: log-normal 72295/13362 -> 31/1.7 at 1e6 keys, Zipf 988456/7291 -> 869/50,
clustered 36009/699 -> 39019/509 (`--components 128 --steps 600`: 5404/76, and 988/18 at 1e7 keys
against 494972/2673 raw, at 1.5e4-6.2e4 lookups/s); lookups/s at 1e6 keys, flow index /
searchsorted / PGM: log-normal 1.1e5 / 2.4e5 / 1.3e5, Zipf 1.1e5 / 1.1e6 / 1.7e5, clustered 7.3e4 / 2.1e5 / 1.0e5;
at 1e7: 9.5e4 / 1.0e5 / 1.8e5, 8.4e4 / 4.8e5 / 2.1e5, 1.2e5 / 1.5e5 / 1.5e5; the flow's transform is 56-86% of a
lookup; bytes: 500784 (5000784 at 1e7) against PGM's 2692-26860 (`--keys-per-slice 1024`: 32016 at 1e6).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
import torch

from flowkit.applications.learned_index import KeyFlow, LearnedIndex, clustered_keys, lognormal_keys, zipf_keys
from flowkit.cli.index import timed_lookups

GENERATORS = {"lognormal": lognormal_keys, "zipf": zipf_keys, "clustered": clustered_keys}


def pgm_index(keys: np.ndarray, queries: np.ndarray, expected: np.ndarray) -> tuple[Any, dict[str, Any]] | None:
    """The PGM-index of pygm, checked, as `(lookup, row)` (one `bisect_left` per query), or None without pygm."""
    try:
        import pygm
    except ImportError:
        return None
    start = time.perf_counter()
    pgm = pygm.SortedList(keys)
    build = time.perf_counter() - start
    bisect = pgm.bisect_left
    answers = np.fromiter((bisect(q) for q in queries), dtype=np.int64, count=queries.size)
    if not (answers == expected).all():
        raise RuntimeError("pygm's answers differ from searchsorted")
    return (lambda qs: [bisect(q) for q in qs]), {"bytes": int(pgm.stats()["index size"]), "build_seconds": build}


def interleaved_lookups(lookups: dict[str, Any], queries: np.ndarray, rounds: int = 3) -> dict[str, float]:
    """Lookups per second of each batch `lookup(queries)`, the best of `rounds` rounds that visit all in turn."""
    best = dict.fromkeys(lookups, 0.0)
    for _ in range(rounds):
        for name, lookup in lookups.items():
            best[name] = max(best[name], timed_lookups(lookup, queries, repeats=1))
    return best


def row(name: str, size: int, args: argparse.Namespace) -> dict[str, Any]:
    keys = GENERATORS[name](size, seed=args.seed)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    flow = KeyFlow(args.components, args.layers).fit_keys(keys, steps=args.steps, seed=args.seed)
    fit_seconds = time.perf_counter() - start
    slices = max(1, size // args.keys_per_slice)
    start = time.perf_counter()
    learned = LearnedIndex(keys, slices, flow=flow)
    build_seconds = time.perf_counter() - start
    raw = LearnedIndex(keys, slices)
    queries = keys[np.random.default_rng(args.seed).integers(0, keys.size, args.queries)]
    expected = np.searchsorted(keys, queries, side="left")
    for index in (learned, raw):
        if not (index.lookup(queries) == expected).all():
            raise RuntimeError("a learned index's answer differs from searchsorted")
    lookups = {
        "flow_index": learned.lookup,
        "raw_index": raw.lookup,
        "searchsorted": lambda q: np.searchsorted(keys, q, side="left"),
    }
    pgm = pgm_index(keys, queries, expected)
    if pgm is not None:
        lookups["pgm"] = pgm[0]
    speed = interleaved_lookups(lookups, queries)
    start = time.perf_counter()
    learned.transform(queries)
    transform_share = (time.perf_counter() - start) * speed["flow_index"] / queries.size
    return {
        "keys": name,
        "size": size,
        "distinct": int(np.unique(keys).size),
        "slices": slices,
        "flow_conflicts": learned.conflicts(),
        "raw_conflicts": raw.conflicts(),
        "flow_index": {
            "lookups_per_second": speed["flow_index"],
            "bytes": learned.nbytes,
            "build_seconds": build_seconds,
            "fit_seconds": fit_seconds,
            "transform_share": transform_share,
        },
        "raw_index": {"lookups_per_second": speed["raw_index"], "bytes": raw.nbytes},
        "searchsorted": {"lookups_per_second": speed["searchsorted"], "bytes": 0},
        "pgm": None if pgm is None else {"lookups_per_second": speed["pgm"], **pgm[1]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=lambda s: [int(t) for t in s.split(",")], default=[1_000_000, 10_000_000])
    parser.add_argument("--keys", type=lambda s: s.split(","), default=list(GENERATORS))
    parser.add_argument("--queries", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=300, help="fit steps of each key flow")
    parser.add_argument("--components", type=int, default=16, help="mixture components per flow layer")
    parser.add_argument("--layers", type=int, default=2, help="flow layers")
    parser.add_argument("--keys-per-slice", type=int, default=64, help="keys per linear model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [row(name, size, args) for size in args.sizes for name in args.keys]
    if any(r["pgm"] is None for r in rows):
        print("pygm is not installed (pip install pygm, or the bench extra): its column is empty")
    print(
        "| keys | n | conflicts max/mean raw | conflicts max/mean flow | lookups/s flow idx | raw idx | "
        "searchsorted | PGM | flow's share | bytes flow idx | PGM |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        pgm = r["pgm"] or {"lookups_per_second": float("nan"), "bytes": "-"}
        print(
            f"| {r['keys']} | {r['size']:.0e} | {r['raw_conflicts']['max']:.0f}/{r['raw_conflicts']['mean']:.1f} | "
            f"{r['flow_conflicts']['max']:.0f}/{r['flow_conflicts']['mean']:.1f} | "
            f"{r['flow_index']['lookups_per_second']:.3g} | {r['raw_index']['lookups_per_second']:.3g} | "
            f"{r['searchsorted']['lookups_per_second']:.3g} | {pgm['lookups_per_second']:.3g} | "
            f"{r['flow_index']['transform_share']:.0%} | {r['flow_index']['bytes']} | {pgm['bytes']} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"threads": args.threads, "args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
