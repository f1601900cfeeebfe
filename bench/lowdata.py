"""Little data: kernel, shared and MLP conditioners in coupling flows of the same depth (issue 42).

For each set, each training size `n` and each seed, the flows train on the same `n` points (80% to fit, 20% to
validate: the best validation checkpoint is restored), standardised by the fitting points' statistics inside the
model, with the same optimiser, batch size and step budget, and are scored by their NLL (nats, in the data's own
units) on a test set the models never see. The sets:

- the 2-D sets of `flowkit.data.toy` (`moons`, `checkerboard`, ...), test points drawn independently;
- `gmm8`: an 8-D mixture of four Gaussians with random means and covariances (fixed by a seed of its own), whose
  exact test NLL is reported beside the models' (the gap to the truth);
- the small tabular sets that ship with scikit-learn: `wine` (178 x 13), `breast-cancer` (569 x 30) and `diabetes`
  (442 x 10), each split by the seed into 70% training pool and 30% test; a size `n` larger than the pool is skipped.

The models (`--models`), all with `--transforms` affine couplings and the same masks:

- `kernel`: [`KernelCouplingFlow`][flowkit.flows.KernelCouplingFlow], kernel machines of `--inducing` points
  (squared-exponential, one lengthscale per input), inducing points started on the standardised fitting points
  ([`init_inducing`][flowkit.flows.init_inducing]);
- `mlp`: [`RealNVP`][flowkit.flows.RealNVP] with independent MLP conditioners (`--hidden`), the reference;
- `shared`: the same RealNVP with one conditioner trunk shared by the layers (NanoFlow, `shared=True`).

Reported per set and `n`: each model's mean test NLL over seeds and its parameter count, and the paired difference
`model - mlp` (negative: better than the MLP flow), seed by seed on the same points, with two standard errors: over
seeds, and over test points (the per-point differences pooled over seeds). A flow fitted to few points can put a
vanishing density on test points outside them (an MLP conditioner extrapolates its scales linearly), and a few such
points dominate the mean: the median test NLL (its paired difference over seeds) and the worst test point are
reported too. Runs interleave the models seed by seed, at `--threads` threads (1 by default).

    python bench/lowdata.py --datasets moons,checkerboard,gmm8 --sizes 100,500,2000 --seeds 3 --threads 1
    python bench/lowdata.py --datasets wine,breast-cancer,diabetes --sizes 100,300 --seeds 3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import sklearn.datasets
import torch

from flowkit.data import TOY_DATASETS, standardize, toy_splits
from flowkit.flows import KernelCouplingFlow, RealNVP, init_inducing
from flowkit.flows.registry import count_parameters, parse_hidden
from flowkit.train import MaximumLikelihood, fit

MODELS = ("kernel", "mlp", "shared")
REFERENCE = "mlp"
TABULAR = {"wine": "load_wine", "breast-cancer": "load_breast_cancer", "diabetes": "load_diabetes"}


def gaussian_mixture(dimension: int = 8, components: int = 4, seed: int = 1234) -> torch.distributions.Distribution:
    """The `gmm8` density: equal-weight Gaussians with means of scale 3 and random covariances, fixed by `seed`."""
    generator = torch.Generator().manual_seed(seed)
    means = 3 * torch.randn(components, dimension, generator=generator, dtype=torch.float64)
    factors = torch.randn(components, dimension, dimension, generator=generator, dtype=torch.float64) / dimension
    covariances = factors @ factors.mT + 0.3 * torch.eye(dimension, dtype=torch.float64)
    return torch.distributions.MixtureSameFamily(
        torch.distributions.Categorical(torch.ones(components, dtype=torch.float64)),
        torch.distributions.MultivariateNormal(means, covariances),
    )


def dataset(name: str, n: int, n_test: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, Callable | None] | None:
    """`n` training points, the test points and the exact log-density (or None) of set `name`; None if `n` too big."""
    if name in TOY_DATASETS:
        splits = toy_splits(name, n_train=n, n_val=1, n_test=n_test, seed=seed)
        return splits.train, splits.test, None
    if name == "gmm8":
        mixture = gaussian_mixture()
        torch.manual_seed(seed)
        points = mixture.sample((n + n_test,))
        return points[:n].float(), points[n:].float(), lambda x: mixture.log_prob(x.double())
    if name not in TABULAR:
        raise ValueError(f"unknown set {name!r}: a 2-D set, gmm8 or one of {', '.join(TABULAR)}")
    data = getattr(sklearn.datasets, TABULAR[name])().data
    rows = np.random.default_rng(seed).permutation(len(data))
    pool = int(0.7 * len(data))
    if n > pool:
        return None
    x = torch.as_tensor(data, dtype=torch.float32)
    return x[rows[:n]], x[rows[pool:]], None


def build(model: str, train: torch.Tensor, args: argparse.Namespace) -> torch.nn.Module:
    """The flow `model`, standardised by `train`'s statistics, its inducing points (kernel) on those points."""
    features = train.shape[1]
    if model == "kernel":
        flow = standardize(KernelCouplingFlow(features, args.transforms, inducing=args.inducing), train)
        init_inducing(flow, train)
        return flow
    hidden = parse_hidden(args.hidden)
    return standardize(RealNVP(features, args.transforms, hidden=hidden, shared=model == "shared"), train)


def run_one(
    data: tuple[torch.Tensor, torch.Tensor, Callable | None], seed: int, model: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Train `model` on the training points of `data` (seed `seed`) and score it on the test set."""
    points, test, _ = data
    n = len(points)
    points = points[torch.randperm(n, generator=torch.Generator().manual_seed(seed))]
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
        nll = -flow.log_prob(test)
    return {
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


def _se(values: list[float]) -> float:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per set, `n` and model: the mean NLL and size, and the paired difference `model - mlp` with its SEs."""
    rows = []
    for dataset_name, n in dict.fromkeys((r["dataset"], r["n"]) for r in runs):
        here = [r for r in runs if r["dataset"] == dataset_name and r["n"] == n]
        by = {(r["model"], r["seed"]): r for r in here}
        exact = [r["exact_nll"] for r in here if r["exact_nll"] is not None]
        for model in dict.fromkeys(r["model"] for r in here):
            seeds = sorted(s for (m, s) in by if m == model and (REFERENCE, s) in by)
            if not seeds:
                continue
            row: dict[str, Any] = {"dataset": dataset_name, "n": n, "model": model, "seeds": len(seeds)}
            row["exact_nll"] = statistics.fmean(exact) if exact else None
            row["nll"] = statistics.fmean(by[(model, s)]["test_nll"] for s in seeds)
            row["median_nll"] = statistics.fmean(by[(model, s)]["median_nll"] for s in seeds)
            row["max_nll"] = max(by[(model, s)]["max_nll"] for s in seeds)
            row["parameters"] = by[(model, seeds[0])]["parameters"]
            row["parameter_ratio"] = row["parameters"] / by[(REFERENCE, seeds[0])]["parameters"]
            diffs = [by[(model, s)]["test_nll"] - by[(REFERENCE, s)]["test_nll"] for s in seeds]
            pointwise = torch.cat([by[(model, s)]["pointwise"] - by[(REFERENCE, s)]["pointwise"] for s in seeds])
            medians = [by[(model, s)]["median_nll"] - by[(REFERENCE, s)]["median_nll"] for s in seeds]
            row["difference"] = statistics.fmean(diffs)
            row["se_seeds"] = _se(diffs)
            row["se_points"] = float(pointwise.std() / math.sqrt(pointwise.numel()))
            row["median_difference"] = statistics.fmean(medians)
            row["median_se_seeds"] = _se(medians)
            rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The summary as a markdown table: NLL against parameter count, each model against the MLP flow."""
    lines = [
        "| set | n | model | NLL (exact) | model - MLP (2 SE seeds, 2 SE points) | median NLL "
        "| model - MLP, medians (2 SE seeds) | worst point | parameters |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        exact = "" if r["exact_nll"] is None else f" ({r['exact_nll']:.3f})"
        lines.append(
            f"| {r['dataset']} | {r['n']} | {r['model']} | {r['nll']:.3f}{exact} | {r['difference']:+.3f} "
            f"(+- {2 * r['se_seeds']:.3f}, +- {2 * r['se_points']:.3f}) | {r['median_nll']:.3f} | "
            f"{r['median_difference']:+.3f} (+- {2 * r['median_se_seeds']:.3f}) | {r['max_nll']:.3g} | "
            f"{r['parameters']:,} ({100 * r['parameter_ratio']:.1f}%) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="moons,checkerboard,gmm8", help="2-D sets, gmm8, wine, ...")
    parser.add_argument("--sizes", default="100,500,2000", help="training sizes n (fit and validation together)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"among {', '.join(MODELS)} (mlp always runs)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--transforms", type=int, default=8, help="coupling layers of every flow")
    parser.add_argument("--inducing", type=int, default=64, help="inducing points of each kernel machine")
    parser.add_argument("--hidden", default="128,128", help="hidden sizes of each MLP conditioner")
    parser.add_argument("--n-test", type=int, default=20_000, help="test points of the sets drawn in code")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    datasets, sizes = args.datasets.split(","), [int(n) for n in args.sizes.split(",")]
    models = list(dict.fromkeys([REFERENCE, *args.models.split(",")]))
    unknown = set(models) - set(MODELS)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; choose among {', '.join(MODELS)}")
    print(f"threads: {torch.get_num_threads()}; steps {args.steps}, lr {args.lr}, seeds {args.seeds}", flush=True)
    runs = []
    for name in datasets:
        for n in sizes:
            for seed in range(args.seeds):
                data = dataset(name, n, args.n_test, seed)
                if data is None:
                    print(f"{name}: n={n} is more than its training pool, skipped")
                    break
                exact = None if data[2] is None else float(-data[2](data[1]).mean())
                for model in models:  # interleaved: a slow spell of a shared machine falls on every model
                    run = {"dataset": name, "n": n, "exact_nll": exact, **run_one(data, seed, model, args)}
                    runs.append(run)
                    print(f"{name} n={n} seed={seed} {model}: {run['test_nll']:.4f} ({run['seconds']:.1f} s)")
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
