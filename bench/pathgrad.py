"""Time per training step of the reverse-KL gradient estimators: fast path, standard path, reparameterised.

For each flow (RealNVP with affine couplings, NSF with rational-quadratic
spline couplings) and dimension D, a flow of ``transforms`` coupling layers
with ``hidden`` conditioners is trained against the many-well target of
dimension D (the 2-D double well at D = 2). One step is: draw z from the base,
the estimator's loss, backward, one Adam step. The three estimators are
interleaved within each repeat (machine-speed drifts hit them alike) on the
same z, and the median step time over repeats is reported, with the ratios
fast/standard (the speed-up of Vaitl et al.'s recursion, target <= 0.8) and
fast/reparam (the overhead of a path gradient, target <= 1.5).

Run: ``python bench/pathgrad.py`` (D = 2, 32, 64; 6 couplings of 2 x 128;
batch 256; 1 thread). Results go to ``bench/results/pathgrad.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import flowkit
from flowkit.targets import ManyWell
from flowkit.train import PathGradientVI

ESTIMATORS = ("fast", "standard", "reparam")


def build(kind: str, dim: int, transforms: int, hidden: tuple[int, ...]) -> flowkit.Flow:
    if kind == "realnvp":
        return flowkit.flows.RealNVP(dim, transforms=transforms, hidden=hidden)
    return flowkit.flows.NSF(dim, transforms=transforms, hidden=hidden, coupling=True)


def time_steps(kind: str, dim: int, args: argparse.Namespace) -> dict[str, float]:
    torch.manual_seed(0)
    flow = build(kind, dim, args.transforms, tuple(args.hidden))
    target = ManyWell(dim)
    objectives = {name: PathGradientVI(target, name) for name in ESTIMATORS}
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-4)
    times: dict[str, list[float]] = {name: [] for name in ESTIMATORS}
    for repeat in range(args.warmup + args.repeats):
        z = flow.base.sample((args.batch_size,))
        for name in ESTIMATORS:
            start = time.perf_counter()
            for _ in range(args.steps):
                optimizer.zero_grad(set_to_none=True)
                objectives[name].loss(flow, z).backward()
                optimizer.step()
            if repeat >= args.warmup:
                times[name].append((time.perf_counter() - start) / args.steps)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 32, 64])
    parser.add_argument("--flows", nargs="+", default=["realnvp", "nsf"], choices=["realnvp", "nsf"])
    parser.add_argument("--transforms", type=int, default=6)
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 128])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5, help="steps per timing")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "pathgrad.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    flowkit.set_validation(False)

    rows = []
    print(f"{'flow':8s} {'D':>4s} {'fast ms':>9s} {'standard ms':>12s} {'reparam ms':>11s} {'fast/std':>9s} {'fast/rep':>9s}")
    for kind in args.flows:
        for dim in args.dims:
            t = time_steps(kind, dim, args)
            row = {
                "flow": kind,
                "dim": dim,
                **{f"{name}_ms": 1e3 * t[name] for name in ESTIMATORS},
                "fast_over_standard": t["fast"] / t["standard"],
                "fast_over_reparam": t["fast"] / t["reparam"],
            }
            rows.append(row)
            print(
                f"{kind:8s} {dim:4d} {row['fast_ms']:9.2f} {row['standard_ms']:12.2f} {row['reparam_ms']:11.2f} "
                f"{row['fast_over_standard']:9.2f} {row['fast_over_reparam']:9.2f}",
                flush=True,
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(args), "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
