"""Little data: the kernel coupling flow (Ferumal) against an MLP coupling flow of the same depth (issue 42).

For each 2-D set of `flowkit.data.toy`, each training size `n` and each seed, both flows train on the same `n`
points (80% to fit, 20% to validate: the best validation checkpoint is restored), standardised by the fitting
points' statistics inside the model, with the same optimiser, batch size and step budget, and are scored by their
NLL (nats, in the data's own units) on a large test set drawn independently. The models:

- `kernel`: [`KernelCouplingFlow`][flowkit.flows.KernelCouplingFlow], `--transforms` affine couplings with kernel
  machines of `--inducing` points (squared-exponential, one lengthscale per input), inducing points started on the
  standardised fitting points ([`init_inducing`][flowkit.flows.init_inducing]);
- `mlp`: [`RealNVP`][flowkit.flows.RealNVP] with the same couplings and masks and MLP conditioners (`--hidden`).

Reported per set and `n`: each model's mean test NLL over seeds and its parameter count, and the paired difference
`kernel - mlp` (negative: the kernel flow is better), seed by seed on the same points, with two standard errors:
over seeds, and over test points (the per-point differences pooled over seeds). A flow fitted to few points can
put a vanishing density on test points outside them (an MLP conditioner extrapolates its scales linearly), and a
few such points dominate the mean: the median test NLL (its paired difference over seeds) and the worst test
point are reported too. Runs interleave the models seed by
seed, at `--threads` threads (1 by default).

    python bench/lowdata.py --datasets moons,checkerboard --sizes 100,500,2000 --seeds 3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from flowkit.data import standardize, toy_splits
from flowkit.flows import KernelCouplingFlow, RealNVP, init_inducing
from flowkit.flows.registry import count_parameters, parse_hidden
from flowkit.train import MaximumLikelihood, fit

MODELS = ("kernel", "mlp")


def build(model: str, train: torch.Tensor, args: argparse.Namespace) -> torch.nn.Module:
    """The flow `model`, standardised by `train`'s statistics, its inducing points (kernel) on those points."""
    if model == "kernel":
        flow = standardize(KernelCouplingFlow(2, args.transforms, inducing=args.inducing), train)
        init_inducing(flow, train)
        return flow
    return standardize(RealNVP(2, args.transforms, hidden=parse_hidden(args.hidden)), train)


def run_one(dataset: str, n: int, seed: int, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Train `model` on `n` points of `dataset` (seed `seed`) and score it on the test set."""
    splits = toy_splits(dataset, n_train=n, n_val=1, n_test=args.n_test, seed=seed)
    points = splits.train[torch.randperm(n, generator=torch.Generator().manual_seed(seed))]
    n_val = max(1, n // 5)
    train, val = points[n_val:], points[:n_val]
    torch.manual_seed(seed)
    flow = build(model, train, args)
    start = time.perf_counter()
    history = fit(
        flow,
        MaximumLikelihood(),
        train,
        steps=args.steps,
        batch_size=min(args.batch_size, len(train)),
        lr=args.lr,
        val_data=val,
        restore_best=True,
        progress=False,
        seed=seed,
        threads=args.threads,
    )
    seconds = time.perf_counter() - start
    flow.eval()
    with torch.no_grad():
        nll = -flow.log_prob(splits.test)
    return {
        "dataset": dataset,
        "n": n,
        "seed": seed,
        "model": model,
        "parameters": count_parameters(flow),
        "test_nll": float(nll.mean()),
        "median_nll": float(nll.median()),
        "max_nll": float(nll.max()),
        "best_step": history.best_step,
        "seconds": seconds,
        "pointwise": nll,
    }


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per dataset and `n`: the models' mean NLLs and sizes, and the paired difference `kernel - mlp` with its SEs."""
    rows = []
    for dataset, n in dict.fromkeys((r["dataset"], r["n"]) for r in runs):
        by = {(r["model"], r["seed"]): r for r in runs if r["dataset"] == dataset and r["n"] == n}
        seeds = sorted(s for (m, s) in by if m == "kernel" and ("mlp", s) in by)
        if not seeds:
            continue
        diffs = [by[("kernel", s)]["test_nll"] - by[("mlp", s)]["test_nll"] for s in seeds]
        pointwise = torch.cat([by[("kernel", s)]["pointwise"] - by[("mlp", s)]["pointwise"] for s in seeds])
        row: dict[str, Any] = {"dataset": dataset, "n": n, "seeds": len(seeds)}
        for model in MODELS:
            row[f"{model}_nll"] = statistics.fmean(by[(model, s)]["test_nll"] for s in seeds)
            row[f"{model}_median_nll"] = statistics.fmean(by[(model, s)]["median_nll"] for s in seeds)
            row[f"{model}_max_nll"] = max(by[(model, s)]["max_nll"] for s in seeds)
            row[f"{model}_parameters"] = by[(model, seeds[0])]["parameters"]
        row["difference"] = statistics.fmean(diffs)
        row["se_seeds"] = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
        row["se_points"] = float(pointwise.std() / math.sqrt(pointwise.numel()))
        medians = [by[("kernel", s)]["median_nll"] - by[("mlp", s)]["median_nll"] for s in seeds]
        row["median_difference"] = statistics.fmean(medians)
        row["median_se_seeds"] = statistics.stdev(medians) / math.sqrt(len(medians)) if len(medians) > 1 else math.nan
        row["parameter_ratio"] = row["kernel_parameters"] / row["mlp_parameters"]
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The summary as a markdown table."""
    lines = [
        "| set | n | NLL kernel | NLL MLP | kernel - MLP (2 SE seeds, 2 SE points) | median NLL kernel / MLP "
        "| kernel - MLP, medians (2 SE seeds) | worst point kernel / MLP | params kernel | params MLP |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['n']} | {r['kernel_nll']:.3f} | {r['mlp_nll']:.3f} | {r['difference']:+.3f} "
            f"(+- {2 * r['se_seeds']:.3f}, +- {2 * r['se_points']:.3f}) | {r['kernel_median_nll']:.3f} / "
            f"{r['mlp_median_nll']:.3f} | {r['median_difference']:+.3f} (+- {2 * r['median_se_seeds']:.3f}) | "
            f"{r['kernel_max_nll']:.3g} / {r['mlp_max_nll']:.3g} | {r['kernel_parameters']:,} "
            f"({100 * r['parameter_ratio']:.1f}%) | {r['mlp_parameters']:,} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="moons,checkerboard", help="2-D sets of flowkit.data.toy")
    parser.add_argument("--sizes", default="100,500,2000", help="training sizes n (fit and validation together)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--transforms", type=int, default=8, help="coupling layers of both flows")
    parser.add_argument("--inducing", type=int, default=64, help="inducing points of each kernel machine")
    parser.add_argument("--hidden", default="128,128", help="hidden sizes of each MLP conditioner")
    parser.add_argument("--n-test", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    datasets, sizes = args.datasets.split(","), [int(n) for n in args.sizes.split(",")]
    print(f"threads: {torch.get_num_threads()}; steps {args.steps}, lr {args.lr}, seeds {args.seeds}", flush=True)
    runs = []
    for dataset in datasets:
        for n in sizes:
            for seed in range(args.seeds):
                for model in MODELS:  # interleaved: a slow spell of a shared machine falls on both
                    run = run_one(dataset, n, seed, model, args)
                    runs.append(run)
                    print(f"{dataset} n={n} seed={seed} {model}: {run['test_nll']:.4f} ({run['seconds']:.1f} s)")
    rows = summarise(runs)
    print(table(rows))
    result = {
        "command": " ".join(["python", "bench/lowdata.py", *(sys.argv[1:] if argv is None else argv)]),
        "threads": torch.get_num_threads(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "summary": rows,
        "runs": [{k: v for k, v in r.items() if k != "pointwise"} for r in runs],
    }
    text = json.dumps(result, indent=1)
    print(text if args.out is None else f"wrote {args.out}")
    if args.out is not None:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
