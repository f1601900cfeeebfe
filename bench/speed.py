"""Speed of neural spline flows: flowkit against zuko, nflows and normflows at matched architecture.

For each configuration (NSF with coupling or autoregressive layers, D features)
every library builds the same flow: ``layers`` spline layers with ``bins``
bins on ``[-bound, bound]`` and linear tails, conditioners with two hidden
layers of ``hidden`` ReLU units (a plain MLP for coupling on the D/2
conditioning features, a masked MLP for autoregressive layers), permutations
between layers, a standard normal base. Three operations are timed:

* ``train``: log_prob of a batch, mean, backward, one Adam step;
* ``log_prob``: log_prob of a batch without gradients;
* ``sample``: drawing a batch without gradients.

Libraries are interleaved within each repeat (so drifts in machine speed hit
them alike) and the median over repeats is reported, with the ratio
``peer time / flowkit time`` (above 1: flowkit is faster). The peak memory of
the training step is measured in a fresh subprocess per (configuration,
library): the growth of the process's resident-set high-water mark
(``ru_maxrss``) over its size just before the first step, after building the
model and the batch. That counts every allocation torch makes on the CPU
(activations saved for backward, gradients, Adam state), but also the code
pages of the kernels a library touches for the first time. A second column,
``saved MiB``, counts only the bytes of the distinct tensor storages autograd
saves for backward during one training step (through
``torch.autograd.graph.saved_tensors_hooks``): the activation memory, which
is what grows with batch size and depth.

Run: ``python bench/speed.py`` (default workload D=8 and D=64, 5 layers,
K=8, B=3, 2x128, batch 512, 2 threads). Results go to
``bench/results/speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import peers
import torch

LIBRARIES = ["flowkit", *peers.LIBRARIES]


def build(library: str, kind: str, features: int, layers: int, bins: int, bound: float, hidden: int):
    """Return ``(module, log_prob(x), sample(n))`` for one library's NSF (the peers' from ``peers.nsf``)."""
    coupling = kind == "coupling"
    if library == "flowkit":
        import flowkit

        flow = flowkit.flows.NSF(
            features, transforms=layers, bins=bins, hidden=(hidden, hidden), coupling=coupling, bound=bound
        )
        return flow, flow.log_prob, lambda n: flow.sample((n,))
    model = peers.nsf(
        library, features, transforms=layers, bins=bins, hidden=(hidden, hidden), bound=bound, coupling=coupling
    )
    return (model, *peers.interface(library, model))


def operations(library, kind, features, args):
    torch.manual_seed(0)
    module, log_prob, sample = build(library, kind, features, args.layers, args.bins, args.bound, args.hidden)
    x = torch.randn(args.batch, features)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-4)

    def train():
        optimizer.zero_grad()
        loss = -log_prob(x).mean()
        loss.backward()
        optimizer.step()

    def log_prob_no_grad():
        with torch.no_grad():
            log_prob(x)

    def draw():
        with torch.no_grad():
            sample(args.batch)

    return {"train": train, "log_prob": log_prob_no_grad, "sample": draw}


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def peak_memory_child(library: str, kind: str, features: int, args) -> None:
    """Print the resident-set growth (MiB) over a few training steps, in this (fresh) process."""
    torch.set_num_threads(args.threads)
    ops = operations(library, kind, features, args)
    before = _rss_kib()
    for _ in range(5):
        ops["train"]()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_mib": (peak - before) / 1024}))


def saved_for_backward_mib(library: str, kind: str, features: int, args) -> float:
    """MiB of distinct tensor storages saved for backward during one training step."""
    ops = operations(library, kind, features, args)
    storages: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        ops["train"]()
    return sum(storages.values()) / 2**20


def peak_memory(library, kind, features, args) -> float:
    command = [sys.executable, __file__, "--child", library, kind, str(features)] + _forward_args(args)
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mib"]


def _forward_args(args) -> list[str]:
    return [
        f"--layers={args.layers}",
        f"--bins={args.bins}",
        f"--bound={args.bound}",
        f"--hidden={args.hidden}",
        f"--batch={args.batch}",
        f"--threads={args.threads}",
    ]


def time_config(kind: str, features: int, args) -> dict:
    libraries = args.libraries
    ops = {lib: operations(lib, kind, features, args) for lib in libraries}
    results: dict = {}
    for op in ("train", "log_prob", "sample"):
        if op == "sample" and kind == "autoregressive" and features > 8:
            iters = 1
        else:
            iters = args.iters
        slowest = 0.0
        for lib in libraries:  # warm-up, and the time of one call
            for _ in range(2):
                start = time.perf_counter()
                ops[lib][op]()
                slowest = max(slowest, time.perf_counter() - start)
        # Seconds-long calls (autoregressive sampling at large D) get fewer repeats.
        repeats = args.repeats if slowest < 1.0 else min(args.repeats, 3)
        times: dict[str, list[float]] = {lib: [] for lib in libraries}
        for r in range(repeats):
            order = libraries[r % len(libraries) :] + libraries[: r % len(libraries)]
            for lib in order:
                start = time.perf_counter()
                for _ in range(iters):
                    ops[lib][op]()
                times[lib].append((time.perf_counter() - start) / iters)
        results[op] = {lib: statistics.median(t) * 1e3 for lib, t in times.items()}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--features", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--kinds", nargs="+", default=["coupling", "autoregressive"])
    parser.add_argument("--libraries", nargs="+", default=LIBRARIES)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--bins", type=int, default=8)
    parser.add_argument("--bound", type=float, default=3.0)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "speed.json"))
    args = parser.parse_args()
    if args.child:
        peak_memory_child(args.child[0], args.child[1], int(args.child[2]), args)
        return
    torch.set_num_threads(args.threads)

    report = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("child", "out")},
        "torch": torch.__version__,
        "configs": [],
    }
    header = f"{'config':<20}{'op':<10}" + "".join(f"{lib:>12}" for lib in args.libraries) + f"{'best peer/fk':>14}"
    print(f"times in ms (median of {args.repeats} repeats), ratio = fastest peer time / flowkit time")
    print(header)
    for features in args.features:
        for kind in args.kinds:
            res = time_config(kind, features, args)
            memory = {} if args.no_memory else {lib: peak_memory(lib, kind, features, args) for lib in args.libraries}
            saved = {lib: saved_for_backward_mib(lib, kind, features, args) for lib in args.libraries}
            entry = {
                "kind": kind,
                "features": features,
                "ms": res,
                "peak_train_mib": memory,
                "saved_for_backward_mib": saved,
                "ratio": {},
            }
            rows = list(res.items()) + ([("mem MiB", memory)] if memory else []) + [("saved MiB", saved)]
            for op, row in rows:
                peers = {lib: t for lib, t in row.items() if lib != "flowkit"}
                best = min(peers.values()) if peers else float("nan")
                ratio = best / row["flowkit"] if "flowkit" in row else float("nan")
                if op not in ("mem MiB", "saved MiB"):
                    entry["ratio"][op] = {lib: t / row["flowkit"] for lib, t in peers.items()}
                name = f"{kind[:4]} D={features}"
                print(
                    f"{name:<20}{op:<10}" + "".join(f"{row[lib]:>12.2f}" for lib in args.libraries) + f"{ratio:>14.2f}"
                )
            report["configs"].append(entry)
            sys.stdout.flush()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
