"""Neural posterior estimation: flowkit's NPE against sbi's NPE with its zuko NSF, and the transit toy (issue 40).

For each task (Gaussian linear, two moons, SLCP), simulation budget and seed, both estimators train on the same
simulations, with the same architecture and the same number of epochs, in one process, interleaved (the order
alternates with the seed):

- `flowkit`: [`fit_posterior`][flowkit.inference.fit_posterior] on an autoregressive
  [`NSF`][flowkit.flows.NSF] of `--transforms` layers of `--bins`-bin splines whose MADE conditioners have the
  hidden layers sbi gives zuko (`hidden_features=50` becomes `[50] * num_transforms` in sbi's `build_zuko_flow`);
- `sbi`: `sbi.inference.NPE(prior, density_estimator=posterior_nn("zuko_nsf", ...))`, the same sizes.

Both hold out 10% for validation, use batches of 200 and Adam at 5e-4 (sbi's defaults; flowkit's learning rate is
cosine-decayed, sbi's constant), and run exactly `--epochs` epochs (no early stopping: sbi's `stop_after_epochs`
is set above the epochs, flowkit's `patience` is None; the weights of the best validation loss are kept by both).
Each is scored by C2ST (sbibm's definition, `flowkit.inference.c2st`) between `--samples` posterior samples and as
many reference samples, for `--observations` observations, and by its training time. Samples are restricted to the
prior's box by rejection in both.

The transit toy: flowkit's NPE on [`TransitSpectrum`][flowkit.inference.TransitSpectrum] scored by the TARP and SBC
expected-coverage errors on `--calibration` held-out simulations (`--calibration-samples` posterior samples each; the
largest gap of an empirical coverage curve over N calibrated simulations is itself about 0.9 / sqrt(N), 0.05 at
N = 300, so N must be large for a 0.05 target to mean anything), and on its linear-Gaussian variant
[`LinearTransitSpectrum`][flowkit.inference.LinearTransitSpectrum] by C2ST against the analytic posterior, each
for two recipes (`--transit-recipes`): `plain` (z-scored parameters) and `regression`
(`fit_posterior(..., regression=True)`, a [`RegressionWhitening`][flowkit.bijectors.RegressionWhitening] in front of
the flow). `--transit-parts` runs the coverage part, the linear part or both; `--first-seed` lets several processes
share the seeds.

    python bench/sbi.py --tasks gaussian_linear,two_moons,slcp --budgets 1000,10000 --seeds 3 --epochs 50 --threads 1
    python bench/sbi.py --tasks "" --seeds 3 --epochs 20 --transit-budget 10000 --calibration 1000 --threads 1

sbi is optional (the `bench` extra): without it the sbi runs are skipped and said so.
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

# This script is bench/sbi.py: run as a script, its folder comes first on the path and would shadow the sbi package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from flowkit.flows import NSF  # noqa: E402
from flowkit.inference import (  # noqa: E402
    c2st,
    coverage_error,
    fit_posterior,
    get_task,
    sbc_coverage,
    sbc_ranks,
    tarp_coverage,
)


def flowkit_npe(
    task: Any, theta: torch.Tensor, x: torch.Tensor, args: argparse.Namespace, seed: int, regression: bool = False
) -> Any:
    """Train flowkit's NPE on `(theta, x)`; returns `(sampler, seconds)`, the sampler `(n, x) -> (n, D)`."""
    torch.manual_seed(seed)
    flow = NSF(task.theta_dim, transforms=args.transforms, bins=args.bins, hidden=(args.hidden,) * args.transforms,
               context=task.x_dim)  # fmt: skip
    start = time.perf_counter()
    posterior, _ = fit_posterior(
        flow, theta.float(), x.float(), lower=task.lower, upper=task.upper, epochs=args.epochs, batch_size=200,
        lr=5e-4, patience=None, seed=seed, regression=regression,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    return (lambda n, x_o: posterior.sample(n, x_o).double()), seconds


def sbi_prior(task: Any) -> Any:
    from sbi.utils import BoxUniform

    if task.lower is not None:
        return BoxUniform(task.lower.float(), task.upper.float())
    return torch.distributions.MultivariateNormal(task.prior_loc.float(), task.prior_cov.float())


def sbi_npe(task: Any, theta: torch.Tensor, x: torch.Tensor, args: argparse.Namespace, seed: int) -> Any:
    """Train sbi's NPE with its zuko NSF on `(theta, x)`; returns `(sampler, seconds)`."""
    from sbi.inference import NPE
    from sbi.neural_nets import posterior_nn

    torch.manual_seed(seed)
    estimator = posterior_nn("zuko_nsf", hidden_features=args.hidden, num_transforms=args.transforms,
                             num_bins=args.bins)  # fmt: skip
    inference = NPE(prior=sbi_prior(task), density_estimator=estimator, show_progress_bars=False)
    start = time.perf_counter()
    inference.append_simulations(theta.float(), x.float()).train(
        training_batch_size=200, learning_rate=5e-4, validation_fraction=0.1, max_num_epochs=args.epochs,
        stop_after_epochs=args.epochs + 1, show_train_summary=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    posterior = inference.build_posterior()

    def sample(n: int, x_o: torch.Tensor) -> torch.Tensor:
        return posterior.sample((n,), x=x_o.float(), show_progress_bars=False).double()

    return sample, seconds


def score(
    task: Any, sample: Any, references: list[tuple[torch.Tensor, torch.Tensor]], args: argparse.Namespace
) -> float:
    """Mean C2ST over the observations."""
    values = [c2st(reference, sample(args.samples, x_o), seed=1) for x_o, reference in references]
    return statistics.mean(values)


def mean_se(values: list[float]) -> tuple[float, float]:
    m = statistics.mean(values)
    return m, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan)


def run_comparison(args: argparse.Namespace, have_sbi: bool) -> tuple[list[dict], list[dict]]:
    runs: list[dict] = []
    for name in args.tasks:
        task = get_task(name)
        references = []
        for index in range(args.observations):
            _, x_o = task.observation(index)
            references.append((x_o, task.reference_posterior(x_o, args.samples, torch.Generator().manual_seed(index))))
        for budget in args.budgets:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                theta, x = task.simulations(budget, torch.Generator().manual_seed(1000 + seed))
                methods = [("flowkit", flowkit_npe)] + ([("sbi", sbi_npe)] if have_sbi else [])
                if seed % 2:
                    methods.reverse()
                for method, train in methods:
                    sample, seconds = train(task, theta, x, args, seed)
                    value = score(task, sample, references, args)
                    runs.append(dict(task=name, budget=budget, seed=seed, method=method, c2st=value, seconds=seconds))
                    print(f"{name} {budget} seed {seed} {method}: C2ST {value:.3f}, {seconds:.1f} s", flush=True)
    summary = []
    for name in args.tasks:
        for budget in args.budgets:
            row: dict[str, Any] = dict(task=name, budget=budget)
            for method in ("flowkit", "sbi"):
                chosen = [r for r in runs if r["task"] == name and r["budget"] == budget and r["method"] == method]
                if chosen:
                    row[f"{method}_c2st"], row[f"{method}_c2st_se"] = mean_se([r["c2st"] for r in chosen])
                    row[f"{method}_seconds"] = statistics.mean(r["seconds"] for r in chosen)
            if "sbi_c2st" in row:
                diffs = [
                    f["c2st"] - s["c2st"]
                    for f in runs
                    for s in runs
                    if f["task"] == s["task"] == name and f["budget"] == s["budget"] == budget
                    and f["seed"] == s["seed"] and f["method"] == "flowkit" and s["method"] == "sbi"
                ]  # fmt: skip
                row["c2st_difference"], row["c2st_difference_se"] = mean_se(diffs)
                row["time_ratio_sbi_over_flowkit"] = row["sbi_seconds"] / row["flowkit_seconds"]
            summary.append(row)
    return runs, summary


def run_transit(args: argparse.Namespace) -> list[dict]:
    """Per seed and recipe: TARP and SBC coverage errors on the transit toy, C2ST on its linear-Gaussian variant."""
    out = []
    task, linear = get_task("transit"), get_task("transit_linear")
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        theta, x = task.simulations(args.transit_budget, torch.Generator().manual_seed(2000 + seed))
        theta_cal, x_cal = task.simulations(args.calibration, torch.Generator().manual_seed(3000 + seed))
        theta_l, x_l = linear.simulations(args.transit_budget, torch.Generator().manual_seed(4000 + seed))
        for recipe in args.transit_recipes:
            row: dict[str, Any] = dict(seed=seed, recipe=recipe, budget=args.transit_budget, epochs=args.epochs)
            regression = recipe == "regression"
            if "coverage" in args.transit_parts:
                sample, seconds = flowkit_npe(task, theta, x, args, seed, regression)
                samples = sample(args.calibration_samples, x_cal)  # (L, N, D)
                levels, tarp = tarp_coverage(samples, theta_cal, seed=seed)
                _, sbc = sbc_coverage(sbc_ranks(samples, theta_cal), args.calibration_samples, levels)
                row.update(tarp_coverage_error=coverage_error(levels, tarp),
                           sbc_coverage_error=coverage_error(levels, sbc), transit_seconds=seconds)  # fmt: skip
            if "linear" in args.transit_parts:
                sample, seconds = flowkit_npe(linear, theta_l, x_l, args, seed, regression)
                values = []
                for index in range(args.observations):
                    _, x_o = linear.observation(index)
                    reference = linear.reference_posterior(x_o, args.samples, torch.Generator().manual_seed(index))
                    values.append(c2st(reference, sample(args.samples, x_o), seed=1))
                row.update(linear_c2st=statistics.mean(values), linear_seconds=seconds)
            print(f"transit seed {seed}: {row}", flush=True)
            out.append(row)
    return out


def transit_table(rows: list[dict]) -> str:
    lines = ["| recipe | TARP coverage error | SBC coverage error | linear-variant C2ST |", "|---|---|---|---|"]
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        chosen = [r for r in rows if r["recipe"] == recipe]
        cells = []
        for key in ("tarp_coverage_error", "sbc_coverage_error", "linear_c2st"):
            if not all(key in r for r in chosen):
                cells.append("-")
                continue
            m, se = mean_se([r[key] for r in chosen])
            cells.append(f"{m:.3f} ± {se:.3f} (max {max(r[key] for r in chosen):.3f})")
        lines.append(f"| {recipe} | {' | '.join(cells)} |")
    return "\n".join(lines)


def table(summary: list[dict]) -> str:
    lines = ["| task | budget | flowkit C2ST | sbi C2ST | difference (paired) | flowkit s | sbi s | sbi/flowkit time |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in summary:
        sbi = f"{r['sbi_c2st']:.3f} ± {r['sbi_c2st_se']:.3f}" if "sbi_c2st" in r else "-"
        diff = f"{r['c2st_difference']:+.3f} ± {r['c2st_difference_se']:.3f}" if "c2st_difference" in r else "-"
        ratio = f"{r['time_ratio_sbi_over_flowkit']:.2f}" if "time_ratio_sbi_over_flowkit" in r else "-"
        sbi_s = f"{r['sbi_seconds']:.1f}" if "sbi_seconds" in r else "-"
        lines.append(f"| {r['task']} | {r['budget']} | {r['flowkit_c2st']:.3f} ± {r['flowkit_c2st_se']:.3f} | {sbi} | "
                     f"{diff} | {r['flowkit_seconds']:.1f} | {sbi_s} | {ratio} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default="gaussian_linear,two_moons,slcp")
    parser.add_argument("--budgets", default="1000,10000")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    parser.add_argument("--observations", type=int, default=5)
    parser.add_argument("--samples", type=int, default=1000, help="posterior and reference samples for C2ST")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--transforms", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=50)
    parser.add_argument("--bins", type=int, default=10)
    parser.add_argument("--transit-budget", type=int, default=10000)
    parser.add_argument("--calibration", type=int, default=2000, help="held-out transit simulations for coverage")
    parser.add_argument(
        "--transit-recipes",
        default="plain,regression",
        help="plain: z-scored parameters; regression: fit_posterior(regression=True)",
    )
    parser.add_argument("--calibration-samples", type=int, default=200)
    parser.add_argument(
        "--transit-parts",
        default="coverage,linear",
        help="coverage: TARP and SBC on the transit toy; linear: C2ST on its linear-Gaussian variant",
    )
    parser.add_argument("--no-transit", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="bench/results/sbi.json")
    args = parser.parse_args(argv)
    args.tasks = [t for t in args.tasks.split(",") if t]
    args.budgets = [int(b) for b in args.budgets.split(",") if b]
    args.transit_recipes = [r for r in args.transit_recipes.split(",") if r]
    args.transit_parts = [p for p in args.transit_parts.split(",") if p]
    if not set(args.transit_parts) <= {"coverage", "linear"}:
        parser.error(f"--transit-parts: choose from coverage, linear; got {args.transit_parts}")
    if not set(args.transit_recipes) <= {"plain", "regression"}:
        parser.error(f"--transit-recipes: choose from plain, regression; got {args.transit_recipes}")
    torch.set_num_threads(args.threads)
    try:
        import sbi  # noqa: F401

        have_sbi = True
    except ImportError:
        have_sbi = False
        print("sbi is not installed (pip install flowkit[bench]): flowkit alone", file=sys.stderr)
    # The first spline evaluation builds flowkit's native kernel (seconds, once per process): not training time.
    NSF(2, transforms=1, hidden=(4,), context=1).log_prob(torch.zeros(3, 2), torch.zeros(3, 1))
    runs, summary = run_comparison(args, have_sbi)
    transit = [] if args.no_transit else run_transit(args)
    if summary:
        print(table(summary))
    if transit:
        print(transit_table(transit))
    result = dict(
        threads=args.threads, epochs=args.epochs, samples=args.samples, observations=args.observations,
        seeds=args.seeds, runs=runs, summary=summary, transit=transit,
    )  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
