"""Neural posterior estimation: flowkit's NPE against sbi's NPE with its zuko NSF, and the transit toy (issue 40).

For each task (Gaussian linear, two moons, SLCP), simulation budget and seed, both estimators train on the same
simulations, with the same architecture and the same number of epochs, in one process, interleaved (the order
alternates with the seed):

- `flowkit`: [`fit_posterior`][flowkit.inference.fit_posterior] on an autoregressive
  [`NSF`][flowkit.flows.NSF] of `--transforms` layers of `--bins`-bin splines whose MADE conditioners have the
  hidden layers sbi gives zuko (`hidden_features=50` becomes `[50] * num_transforms` in sbi's `build_zuko_flow`);
- `sbi`: `sbi.inference.NPE(prior, density_estimator=posterior_nn("zuko_nsf", ...))`, the same sizes.

Both hold out 10% for validation, use batches of 200 and Adam at a constant 5e-4 (sbi's defaults, and
`fit_posterior`'s since 5 December 2026), and run exactly `--epochs` epochs (no early stopping: sbi's
`stop_after_epochs` is set above the epochs, flowkit's `patience` is None; the weights of the best validation loss
are kept by both). What still differs: sbi clips the gradient norm at 5, drops the last partial batch of an epoch
(so takes fewer steps at 1e3: 200 against 250 at 50 epochs), z-scores with a floor on the standard deviation, and
zuko's splines and MADE start from a fresh `nn.Linear`'s last layer where flowkit's NSF starts near the identity.
`--flowkit-recipes` runs variants of flowkit's recipe on the same simulations and seeds, each paired with the
default seed by seed: `cosine` (the cosine-decayed rate, `fit_posterior`'s default before), `clip` (sbi's clipping),
`random-start` (`NSF(start="random")`, zuko's start).
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

Gaussian linear's moments (`--moments K`, issue 40's acceptance "mean and covariance within 3 SE at 1e4
simulations"): for `K` seeds, each with its own `--moments-budget` simulations, flowkit's NPE (an affine
[`MAF`][flowkit.flows.MAF], 3 layers of two 50-unit hidden layers, 30 epochs) is sampled `--moments-samples` times
at 5 observations. The errors of the posterior-sample means (in posterior SDs) are split into their spread across
seeds (estimation error: a new simulation set gives a new error) and their mean over seeds (bias), with the Monte
Carlo SE of a sample mean stated beside; the same simulations also fit the exact family, a conditional Gaussian with
a mean linear in `x` (least squares), whose error is the floor any estimator meets at that budget. The line "literal
gate" counts the seeds whose every mean lies within 3 Monte Carlo SE of 1000 samples (the acceptance read with the
Monte Carlo SE alone), for the NPE and for the exact family.

sbi is optional (the `bench` extra): without it the sbi runs are skipped and said so.

Figures of 4-5 December 2026, 1 thread, 2 shared cores with another session's runs (load 2 to 4); ratios from
runs interleaved in one process ("per step" divides by the steps each took: sbi drops the last partial batch, 200
steps against flowkit's 250 at 1e3 and 50 epochs, 2250 each at 1e4). flowkit at `fit_posterior`'s defaults
(constant rate, Adam's fused update), paired seed by seed with sbi and with the recipes named.

- `--tasks two_moons,slcp --budgets 1000 --seeds 3 --observations 5 --samples 500 --epochs 50 --no-transit
  --flowkit-recipes default,cosine,random-start`: two moons C2ST 0.854 ± 0.011 against sbi's 0.862 ± 0.020
  (paired -0.008 ± 0.013), 1.85x faster (2.31x per step); SLCP 0.912 ± 0.003 against 0.912 ± 0.002
  (+0.000 ± 0.004), 2.22x (2.77x per step). The cosine decay, paired with the default: +0.055 ± 0.006 (two moons),
  +0.029 ± 0.001 (SLCP), which is the whole former gap to sbi (+0.047, +0.030 here). `random-start`: -0.053 ±
  0.025 (two moons), +0.002 ± 0.006 (SLCP).
- `--tasks two_moons,slcp --budgets 10000 --seeds 3 --observations 5 --samples 500 --epochs 50 --no-transit
  --flowkit-recipes default,cosine`: two moons 0.557 ± 0.007 against 0.550 ± 0.023 (+0.007 ± 0.030), 2.06x; SLCP
  0.799 ± 0.002 against 0.795 ± 0.012 (+0.005 ± 0.010), 2.77x. The cosine decay: +0.021 ± 0.003 (two moons),
  -0.001 ± 0.014 (SLCP).
- `--tasks gaussian_linear --budgets 1000` and `--budgets 10000` (the same options, `--flowkit-recipes default`, one
  process each): 0.770 ± 0.016 against 0.775 ± 0.007 (-0.005 ± 0.023), 1.63x (2.03x per step) at 1e3;
  0.541 ± 0.005 against 0.535 ± 0.005 (+0.006 ± 0.004), 3.74x at 1e4.
- The linear transit variant with `regression=True` (`--tasks "" --seeds 3 --epochs 20 --transit-budget 10000
  --observations 3 --samples 1000 --transit-recipes regression --transit-parts linear`): C2ST against the analytic
  posterior 0.520, 0.525, 0.519 (seeds 0-2; mean 0.521 ± 0.002).
- The same flowkit NSF trained through sbi's NPE (`--tasks two_moons` and `--tasks slcp`, `--budgets 1000`, the
  options above, `--sbi-builder`): two moons 0.878 ± 0.013 (paired with sbi +0.016 ± 0.018, with flowkit's own
  loop +0.024 ± 0.006), 1.63x faster than sbi's zuko NSF; SLCP 0.916 ± 0.004 (+0.005 ± 0.003, +0.004 ± 0.005),
  1.81x. sbi's loop takes 200 steps to flowkit's 250 (it drops the last partial batch).
- The search for the gap (a `/tmp` script training flowkit's recipe variants on the same simulations and seeds,
  1e3 simulations, 50 epochs, 3 observations of 1000 samples; paired difference of C2ST, mean ± SE over n seeds):
  constant against cosine-decayed rate -0.049 ± 0.003 (two moons, n = 6), -0.020 ± 0.004 (SLCP, n = 5), and with
  it flowkit against sbi -0.003 ± 0.015 (n = 5) and -0.010 ± 0.007 (n = 4), against +0.047 ± 0.018 and
  +0.010 ± 0.003 with the decay; sbi's gradient clipping at 5 under the cosine rate -0.003 ± 0.002 (n = 3) and
  -0.002 ± 0.002 (n = 2), under the constant rate +0.008 ± 0.004 and +0.003 ± 0.001: no gain; sbi's dropping of
  the last partial batch (200 steps instead of 250) +0.021 ± 0.001 (two moons, n = 3) and +0.003 ± 0.006 (SLCP,
  n = 2): worse, fewer steps; zuko's start (`NSF(start="random")`) under the constant rate -0.023 ± 0.012 (two
  moons, n = 3; -0.024 ± 0.004 at 1e4, n = 4) and +0.008 ± 0.008 (SLCP, n = 3): a gain at D = 2 only, left as
  the `random-start` recipe (NSF's start is the flow's default everywhere, measured on density estimation).
- The transit coverage recipe with the constant rate (`--tasks "" --seeds 3 --epochs 20 --transit-budget 10000
  --calibration 1000 --calibration-samples 200 --observations 3 --samples 1000 --transit-recipes plain
  --transit-parts coverage`): TARP coverage error 0.017, 0.032, 0.022 and SBC 0.010, 0.018, 0.014 (seeds 0-2;
  0.016, 0.024, 0.031 and 0.011, 0.006, 0.023 with the cosine decay).
- `--no-comparison --no-transit --moments 6` (4 December, with the cosine decay): posterior-mean error 0.124
  posterior SD rms (spread over simulation sets 0.118, seed-mean 0.062, shrinkage -2.6%), variance error -0.2% (rms
  8.1%); the exact family 0.037 SD; the literal gate (3 Monte Carlo SE of 1000 samples on all 50 means) passed by 0
  of 6 sets for both.
"""

from __future__ import annotations

import argparse
import functools
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

#: flowkit's training recipes (`--flowkit-recipes`), each a variant of `fit_posterior`'s defaults, for paired
#: comparisons on the same simulations and seeds: `(NSF arguments, fit_posterior arguments)`.
RECIPES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "default": ({}, {}),
    "cosine": ({}, {"schedule": "cosine"}),  # fit_posterior's default before 5 December 2026
    "clip": ({}, {"clip": 5.0}),  # sbi's gradient clipping
    "random-start": ({"start": "random"}, {}),  # last layers as fresh nn.Linear's, as zuko's
}


def recipe_method(recipe: str) -> str:
    """The name of a flowkit recipe's runs: `flowkit` for the default, `flowkit:RECIPE` otherwise."""
    return "flowkit" if recipe == "default" else f"flowkit:{recipe}"


def flowkit_npe(
    task: Any,
    theta: torch.Tensor,
    x: torch.Tensor,
    args: argparse.Namespace,
    seed: int,
    regression: bool = False,
    recipe: str = "default",
) -> Any:
    """Train flowkit's NPE on `(theta, x)`; returns `(sampler, seconds, steps)`, the sampler `(n, x) -> (n, D)`."""
    flow_options, fit_options = RECIPES[recipe]
    torch.manual_seed(seed)
    flow = NSF(task.theta_dim, transforms=args.transforms, bins=args.bins, hidden=(args.hidden,) * args.transforms,
               context=task.x_dim, **flow_options)  # fmt: skip
    start = time.perf_counter()
    posterior, history = fit_posterior(
        flow, theta.float(), x.float(), lower=task.lower, upper=task.upper, epochs=args.epochs, batch_size=200,
        lr=5e-4, patience=None, seed=seed, regression=regression, **fit_options,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    return (lambda n, x_o: posterior.sample(n, x_o).double()), seconds, history.steps_run


def sbi_prior(task: Any) -> Any:
    from sbi.utils import BoxUniform

    if task.lower is not None:
        return BoxUniform(task.lower.float(), task.upper.float())
    return torch.distributions.MultivariateNormal(task.prior_loc.float(), task.prior_cov.float())


def sbi_npe(
    task: Any, theta: torch.Tensor, x: torch.Tensor, args: argparse.Namespace, seed: int, builder: bool = False
) -> Any:
    """Train sbi's NPE with its zuko NSF on `(theta, x)`; returns `(sampler, seconds, steps)`.

    With `builder`, sbi's NPE trains flowkit's NSF of the same sizes instead, through
    [`sbi_builder`][flowkit.inference.sbi_builder] (sbi's loop, z-scoring and clipping, flowkit's flow).

    sbi runs `max_num_epochs + 1` epochs (its loop runs while `epoch <= max_num_epochs`), so it is given
    `--epochs - 1` (at least 1: sbi refuses 0, so `--epochs 1` gives it 2); its training loader drops the last
    partial batch, which gives its number of steps.
    """
    from sbi.inference import NPE
    from sbi.neural_nets import posterior_nn

    from flowkit.inference import sbi_builder

    torch.manual_seed(seed)
    if builder:
        estimator = sbi_builder("nsf", transforms=args.transforms, hidden=(args.hidden,) * args.transforms,
                                bins=args.bins)  # fmt: skip
    else:
        estimator = posterior_nn("zuko_nsf", hidden_features=args.hidden, num_transforms=args.transforms,
                                 num_bins=args.bins)  # fmt: skip
    inference = NPE(prior=sbi_prior(task), density_estimator=estimator, show_progress_bars=False)
    start = time.perf_counter()
    inference.append_simulations(theta.float(), x.float()).train(
        training_batch_size=200, learning_rate=5e-4, validation_fraction=0.1, max_num_epochs=max(1, args.epochs - 1),
        stop_after_epochs=args.epochs + 1, show_train_summary=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    epochs = inference.epoch  # the epochs sbi ran
    n_train = int(0.9 * theta.shape[0])
    steps = epochs * (n_train // min(200, n_train))  # batches of min(200, n_train), the last partial one dropped
    posterior = inference.build_posterior()

    def sample(n: int, x_o: torch.Tensor) -> torch.Tensor:
        return posterior.sample((n,), x=x_o.float(), show_progress_bars=False).double()

    return sample, seconds, steps


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
                methods: list[tuple[str, Any]] = [
                    (recipe_method(recipe), functools.partial(flowkit_npe, recipe=recipe))
                    for recipe in args.flowkit_recipes
                ]
                methods += [("sbi", sbi_npe)] if have_sbi else []
                if have_sbi and args.sbi_builder:
                    methods.append(("flowkit-in-sbi", functools.partial(sbi_npe, builder=True)))
                if seed % 2:
                    methods.reverse()
                for method, train in methods:
                    sample, seconds, steps = train(task, theta, x, args, seed)
                    value = score(task, sample, references, args)
                    runs.append(dict(task=name, budget=budget, seed=seed, method=method, c2st=value, seconds=seconds,
                                     steps=steps))  # fmt: skip
                    print(f"{name} {budget} seed {seed} {method}: C2ST {value:.3f}, {seconds:.1f} s, {steps} steps",
                          flush=True)  # fmt: skip
    return runs, summarise(runs)


def paired(runs: list[dict], task: str, budget: int, first: str, second: str) -> list[float]:
    """C2ST of `first` minus that of `second`, seed by seed (the seeds both ran)."""
    by_seed = {r["seed"]: r["c2st"] for r in runs if (r["task"], r["budget"], r["method"]) == (task, budget, second)}
    return [
        r["c2st"] - by_seed[r["seed"]]
        for r in runs
        if (r["task"], r["budget"], r["method"]) == (task, budget, first) and r["seed"] in by_seed
    ]


def summarise(runs: list[dict]) -> list[dict]:
    """One row per task, budget and flowkit recipe: C2STs, paired differences and time ratios.

    The differences are to sbi and, for a recipe other than the default, to flowkit's default.
    """
    summary = []
    for name, budget in dict.fromkeys((r["task"], r["budget"]) for r in runs):
        here = [r for r in runs if r["task"] == name and r["budget"] == budget]
        sbi = [r for r in here if r["method"] == "sbi"]
        for method in dict.fromkeys(r["method"] for r in here if r["method"] != "sbi"):
            row: dict[str, Any] = dict(task=name, budget=budget, method=method)
            for key, chosen in (("flowkit", [r for r in here if r["method"] == method]), ("sbi", sbi)):
                if chosen:
                    row[f"{key}_c2st"], row[f"{key}_c2st_se"] = mean_se([r["c2st"] for r in chosen])
                    row[f"{key}_seconds"] = statistics.mean(r["seconds"] for r in chosen)
                    row[f"{key}_ms_per_step"] = 1e3 * statistics.mean(r["seconds"] / r["steps"] for r in chosen)
            if sbi:
                row["c2st_difference"], row["c2st_difference_se"] = mean_se(paired(runs, name, budget, method, "sbi"))
                row["time_ratio_sbi_over_flowkit"] = row["sbi_seconds"] / row["flowkit_seconds"]
                row["step_time_ratio_sbi_over_flowkit"] = row["sbi_ms_per_step"] / row["flowkit_ms_per_step"]
            if method != "flowkit" and any(r["method"] == "flowkit" for r in here):
                diffs = paired(runs, name, budget, method, "flowkit")
                row["c2st_difference_to_default"], row["c2st_difference_to_default_se"] = mean_se(diffs)
            summary.append(row)
    return summary


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
                sample, seconds, _ = flowkit_npe(task, theta, x, args, seed, regression)
                samples = sample(args.calibration_samples, x_cal)  # (L, N, D)
                levels, tarp = tarp_coverage(samples, theta_cal, seed=seed)
                _, sbc = sbc_coverage(sbc_ranks(samples, theta_cal), args.calibration_samples, levels)
                row.update(tarp_coverage_error=coverage_error(levels, tarp),
                           sbc_coverage_error=coverage_error(levels, sbc), transit_seconds=seconds)  # fmt: skip
            if "linear" in args.transit_parts:
                sample, seconds, _ = flowkit_npe(linear, theta_l, x_l, args, seed, regression)
                values = []
                for index in range(args.observations):
                    _, x_o = linear.observation(index)
                    reference = linear.reference_posterior(x_o, args.samples, torch.Generator().manual_seed(index))
                    values.append(c2st(reference, sample(args.samples, x_o), seed=1))
                row.update(linear_c2st=statistics.mean(values), linear_seconds=seconds)
            print(f"transit seed {seed}: {row}", flush=True)
            out.append(row)
    return out


def run_moments(args: argparse.Namespace) -> dict[str, Any]:
    """Gaussian linear at `--moments-budget` simulations: the errors of the posterior mean and variance over seeds."""
    from flowkit.inference import GaussianLinear, posterior_flow

    task = GaussianLinear()
    observations = [task.observation(index)[1] for index in range(5)]
    mean_errors, variance_errors, exact_errors, literal = [], [], [], {"npe": 0, "exact": 0}
    sd = task.posterior(observations[0])[1].diagonal().sqrt()
    mc_se = 1 / math.sqrt(args.moments_samples)  # of a sample mean, in posterior SDs
    mc_se_1000 = 1 / math.sqrt(1000)
    for seed in range(args.moments):
        theta, x = task.simulations(args.moments_budget, torch.Generator().manual_seed(5000 + seed))
        torch.manual_seed(seed)
        flow = posterior_flow(task.theta_dim, task.x_dim, "maf", transforms=3, hidden=(50, 50))
        start = time.perf_counter()
        posterior, _ = fit_posterior(flow, theta, x, epochs=30, lr=1e-3, batch_size=256, seed=seed)
        seconds = time.perf_counter() - start
        train = torch.randperm(theta.shape[0], generator=torch.Generator().manual_seed(seed))[theta.shape[0] // 10 :]
        design = torch.cat([x[train], torch.ones(len(train), 1, dtype=x.dtype)], 1)
        coefficients = torch.linalg.lstsq(design, theta[train]).solution
        errors, variances, exact = [], [], []
        for x_o in observations:
            mean, cov = task.posterior(x_o)
            draws = posterior.sample(args.moments_samples, x_o).double()
            errors.append((draws.mean(0) - mean) / sd)
            variances.append(draws.var(0) / cov.diagonal() - 1)
            exact.append((torch.cat([x_o, x_o.new_ones(1)]) @ coefficients - mean) / sd)
        errors_, exact_ = torch.stack(errors), torch.stack(exact)
        mean_errors.append(errors_)
        variance_errors.append(torch.stack(variances))
        exact_errors.append(exact_)
        # the literal gate with 1000 samples: the estimator's error plus the Monte Carlo error of 1000 draws
        gate = torch.Generator().manual_seed(seed)
        for key, error in (("npe", errors_), ("exact", exact_)):
            draws_error = error + mc_se_1000 * torch.randn(error.shape, generator=gate, dtype=error.dtype)
            literal[key] += int(draws_error.abs().max() < 3 * mc_se_1000)
        print(f"moments seed {seed}: rms mean error {errors_.pow(2).mean().sqrt():.3f} SD (exact family "
              f"{exact_.pow(2).mean().sqrt():.3f}), {seconds:.1f} s", flush=True)  # fmt: skip
    k = len(mean_errors)
    e, v, exact = torch.stack(mean_errors), torch.stack(variance_errors), torch.stack(exact_errors)
    spread = ((e - e.mean(0)).pow(2).sum() / (e[0].numel() * (k - 1))).sqrt()  # pooled SD over seeds
    t = e.mean(0) / (spread / math.sqrt(k))
    v_spread = ((v - v.mean(0)).pow(2).sum() / (v[0].numel() * (k - 1))).sqrt()
    truth = torch.stack([task.posterior(x_o)[0] for x_o in observations]) / sd
    shrinkage = float((e.mean(0) * truth).sum() / truth.pow(2).sum())
    out = dict(
        seeds=k, budget=args.moments_budget, samples=args.moments_samples, mc_se=mc_se,
        rms_mean_error=float(e.pow(2).mean().sqrt()), seed_spread=float(spread),
        rms_of_seed_mean=float(e.mean(0).pow(2).mean().sqrt()), bias_t_max=float(t.abs().max()),
        bias_t_over_3=int((t.abs() > 3).sum()), shrinkage_slope=shrinkage,
        variance_error_mean=float(v.mean()), variance_error_rms=float(v.pow(2).mean().sqrt()),
        variance_bias_t_max=float((v.mean(0) / (v_spread / math.sqrt(k))).abs().max()),
        exact_family_rms_mean_error=float(exact.pow(2).mean().sqrt()),
        literal_gate_npe=literal["npe"], literal_gate_exact=literal["exact"],
    )  # fmt: skip
    print(
        f"Gaussian linear at {args.moments_budget} simulations, {k} seeds, {args.moments_samples} samples "
        f"(Monte Carlo SE of a mean {mc_se:.4f} SD): posterior-mean error rms {out['rms_mean_error']:.3f} SD; "
        f"spread over seeds {spread:.3f} SD; rms of the seed-mean {out['rms_of_seed_mean']:.3f} SD; bias |t| max "
        f"{out['bias_t_max']:.2f} ({out['bias_t_over_3']} of {e[0].numel()} above 3); shrinkage slope "
        f"{shrinkage:+.4f}; "
        f"variance error mean {out['variance_error_mean']:+.3f}, rms {out['variance_error_rms']:.3f}; exact family "
        f"rms {out['exact_family_rms_mean_error']:.3f} SD; literal gate (3 MC SE of 1000 samples, all 50 means): "
        f"NPE {literal['npe']}/{k}, exact family {literal['exact']}/{k}",
        flush=True,
    )
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
    lines = ["| task | budget | flowkit recipe | flowkit C2ST | sbi C2ST | difference (paired) | flowkit s | sbi s "
             "| sbi/flowkit time | sbi/flowkit time per step | difference to the default recipe (paired) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in summary:
        to_default = "-"
        if "c2st_difference_to_default" in r:
            to_default = f"{r['c2st_difference_to_default']:+.3f} ± {r['c2st_difference_to_default_se']:.3f}"
        sbi = f"{r['sbi_c2st']:.3f} ± {r['sbi_c2st_se']:.3f}" if "sbi_c2st" in r else "-"
        diff = f"{r['c2st_difference']:+.3f} ± {r['c2st_difference_se']:.3f}" if "c2st_difference" in r else "-"
        ratio = f"{r['time_ratio_sbi_over_flowkit']:.2f}" if "time_ratio_sbi_over_flowkit" in r else "-"
        step = f"{r['step_time_ratio_sbi_over_flowkit']:.2f}" if "step_time_ratio_sbi_over_flowkit" in r else "-"
        sbi_s = f"{r['sbi_seconds']:.1f}" if "sbi_seconds" in r else "-"
        lines.append(f"| {r['task']} | {r['budget']} | {r['method']} | {r['flowkit_c2st']:.3f} ± "
                     f"{r['flowkit_c2st_se']:.3f} | {sbi} | {diff} | {r['flowkit_seconds']:.1f} | {sbi_s} | {ratio} | "
                     f"{step} | {to_default} |")  # fmt: skip
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
    parser.add_argument(
        "--flowkit-recipes",
        default="default",
        help=f"flowkit's training recipes, each run on the same simulations and seeds: {', '.join(RECIPES)}",
    )
    parser.add_argument(
        "--sbi-builder",
        action="store_true",
        help="also train flowkit's NSF through sbi's NPE (flowkit.inference.sbi_builder), side by side",
    )
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
    parser.add_argument("--no-comparison", action="store_true", help="skip flowkit against sbi")
    parser.add_argument("--moments", type=int, default=0, help="seeds of the Gaussian-linear moments (0: skip)")
    parser.add_argument("--moments-budget", type=int, default=10000)
    parser.add_argument("--moments-samples", type=int, default=100000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="bench/results/sbi.json")
    args = parser.parse_args(argv)
    args.tasks = [t for t in args.tasks.split(",") if t]
    args.budgets = [int(b) for b in args.budgets.split(",") if b]
    args.transit_recipes = [r for r in args.transit_recipes.split(",") if r]
    args.transit_parts = [p for p in args.transit_parts.split(",") if p]
    args.flowkit_recipes = [r for r in args.flowkit_recipes.split(",") if r]
    if not args.flowkit_recipes or not set(args.flowkit_recipes) <= set(RECIPES):
        parser.error(f"--flowkit-recipes: choose from {', '.join(RECIPES)}; got {args.flowkit_recipes}")
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
    runs, summary = ([], []) if args.no_comparison else run_comparison(args, have_sbi)
    transit = [] if args.no_transit else run_transit(args)
    moments = run_moments(args) if args.moments > 1 else {}
    if summary:
        print(table(summary))
    if transit:
        print(transit_table(transit))
    result = dict(
        threads=args.threads, epochs=args.epochs, samples=args.samples, observations=args.observations,
        seeds=args.seeds, runs=runs, summary=summary, transit=transit, moments=moments,
    )  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
