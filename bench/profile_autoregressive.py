"""Operator-by-operator profiles of the autoregressive NSF: flowkit against zuko (``torch.profiler``).

The workload of ``bench/speed.py``'s autoregressive rows: 5 spline layers, 8 bins on ``[-3, 3]``, masked
conditioners with 2 x 128 hidden units, batch 512, each library's matched flow (``speed.build``). Profiled:

* ``train``: one training step (log_prob of the batch, mean, backward, one Adam step) at each ``--features``;
* ``sample``: one sampling pass (the ``D`` sequential inverse steps) at the largest ``--features``.

For each (operation, D, library) the script warms the step up, times ``--steps`` calls without the
profiler (wall clock, interleaved between the libraries), then profiles ``--steps`` calls and prints the
operators sorted by their own (self) CPU time, with how many calls each made. The footer of each table
splits the step's wall time into the operators' own time and the rest: the rest is the Python between
operators (module calls, argument checks, dispatch), which the profiler's per-operator bookkeeping also
inflates a little. Tables go to stdout and, with ``--out DIR``, one text file per profile.

Run: ``python bench/profile_autoregressive.py --threads 2 --out bench/profiles``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

import speed  # noqa: E402 (bench/ on the path first)


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where it exists, else `platform.processor()`)."""
    return speed.cpu_name()


def _workload(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(
        layers=args.layers, bins=args.bins, bound=args.bound, hidden=args.hidden, batch=args.batch, device="cpu"
    )


def _wall_ms(functions: dict, steps: int) -> dict:
    """Median wall milliseconds per call of each function, interleaved (after one warm-up call each)."""
    for function in functions.values():
        function()
    times: dict = {key: [] for key in functions}
    for _ in range(steps):
        for key, function in functions.items():
            start = time.perf_counter()
            function()
            times[key].append((time.perf_counter() - start) * 1e3)
    return {key: statistics.median(t) for key, t in times.items()}


def profile_table(function, steps: int, rows: int) -> tuple[str, float, float]:
    """The profiler's table of `steps` calls of `function`, with its wall and operator-self milliseconds per call."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            function()
        wall = (time.perf_counter() - start) * 1e3 / steps
    averages = prof.key_averages()
    self_ms = sum(event.self_cpu_time_total for event in averages) / 1e3 / steps
    table = averages.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=48)
    return table, wall, self_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--features", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--libraries", nargs="+", default=["flowkit", "zuko"])
    parser.add_argument("--operations", nargs="+", default=["train", "sample"], choices=["train", "log_prob", "sample"])
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--bins", type=int, default=8)
    parser.add_argument("--bound", type=float, default=3.0)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="calls per profile (sampling: 1 at D > 8)")
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--out", default=None, help="a folder for one text file per profile")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    header = (
        f"CPU: {cpu_name()} ({os.cpu_count()} logical CPUs); torch {torch.__version__}; {torch.get_num_threads()} "
        f"threads; {platform.platform()}; load average at start {load}"
    )
    print(header)
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    workload = _workload(args)
    for op in args.operations:
        sizes = args.features if op != "sample" else [max(args.features)]
        for features in sizes:
            steps = args.steps if op != "sample" or features <= 8 else 1
            calls = {}
            for library in args.libraries:
                try:
                    calls[library] = speed.operations(library, "autoregressive", features, workload)[op]
                except ImportError:
                    print(f"{library} is not installed: skipped")
            wall = _wall_ms(calls, max(steps, 3))
            summary = ", ".join(f"{lib} {ms:.2f} ms" for lib, ms in wall.items())
            print(f"\n=== {op}, autoregressive NSF D={features}: unprofiled wall per call {summary}")
            for library, function in calls.items():
                table, profiled_wall, self_ms = profile_table(function, steps, args.rows)
                text = (
                    f"{header}\n{library}: {op}, autoregressive NSF D={features}, {args.layers} layers, "
                    f"{args.bins} bins, 2x{args.hidden} hidden, batch {args.batch}; {steps} calls profiled\n"
                    f"{table}\n"
                    f"per call: wall {profiled_wall:.2f} ms under the profiler ({wall[library]:.2f} ms without), "
                    f"operators' own time {self_ms:.2f} ms, the rest (Python, dispatch, profiler) "
                    f"{profiled_wall - self_ms:.2f} ms\n"
                )
                print(f"\n--- {library}\n{text}")
                if out is not None:
                    (out / f"{op}_D{features}_{library}.txt").write_text(text)
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
