"""`flowkit sbi TASK`: neural posterior estimation on a built-in simulator, scored against its reference posterior.

Simulates `--simulations` pairs from the task's prior, trains a conditional flow as the amortised posterior
([`fit_posterior`][flowkit.inference.fit_posterior]), and writes to `--out`: `model/` (the
[`NeuralPosterior`][flowkit.inference.NeuralPosterior], [`flowkit.io.load`][flowkit.io.load] reads it back),
`metrics.json` (C2ST against the reference posterior for each observation, TARP and SBC expected-coverage errors,
SBC uniformity p-values, training time), `history.csv`, `corner.png` (the first observation's posterior against
the reference and the true parameters), `coverage.png` (TARP and SBC expected coverage) and `sbc.png`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from .arguments import add_threads, int_at_least, positive_float, positive_int
from .fit import prepare_output

__all__ = ["add_parser", "run", "TASK_NAMES", "OUTPUTS"]

#: The tasks of `flowkit.inference.TASKS` (listed here so that `--help` needs no torch; a test checks they agree).
TASK_NAMES = ("gaussian_linear", "two_moons", "slcp", "transit", "transit_linear")

#: What `flowkit sbi` writes in its output directory (removed by `--force` before a new run).
OUTPUTS = ("model", "metrics.json", "history.csv", "corner.png", "coverage.png", "sbc.png")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `flowkit sbi` subcommand."""
    parser = subparsers.add_parser(
        "sbi",
        help="neural posterior estimation on a simulator, scored against its reference posterior",
        description="Train a conditional flow on simulations of a built-in task as its amortised posterior; write "
        "the model, metrics.json (C2ST against the reference posterior, TARP and SBC coverage errors), the "
        "training history and the corner, coverage and SBC plots.",
    )
    add = parser.add_argument
    add("task", metavar="TASK", choices=TASK_NAMES, help=", ".join(TASK_NAMES))
    add("--simulations", type=int_at_least(10), default=10_000, help="training simulations (default 10000)")
    add("--flow", default="nsf", help="a vector flow preset that takes a context (default nsf)")
    add("--transforms", type=positive_int, default=5, help="flow layers (default 5)")
    add("--hidden", default="50,50", help="hidden sizes (default 50,50)")
    add("--bins", type=positive_int, default=10, help="spline bins (default 10)")
    add("--epochs", type=positive_int, default=100, help="most epochs, with early stopping (default 100)")
    add("--batch-size", type=positive_int, default=200, help="batch size (default 200)")
    add("--lr", type=positive_float, default=5e-4, help="learning rate (default 5e-4)")
    add(
        "--regression",
        action="store_true",
        help="whiten the parameters by their linear regression on the data first (RegressionWhitening)",
    )
    add("--observations", type=positive_int, default=1, help="observations scored by C2ST (default 1)")
    add(
        "--posterior-samples",
        type=int_at_least(10),
        default=2000,
        help="posterior and reference samples per observation for C2ST and the corner plot (default 2000)",
    )
    add(
        "--calibration",
        type=int_at_least(10),
        default=300,
        help="held-out simulations for the TARP and SBC coverage (default 300)",
    )
    add("--calibration-samples", type=int_at_least(10), default=200, help="posterior samples per held-out one")
    add("--seed", type=int, default=0, help="seed (default 0)")
    add_threads(parser, "default 1", 1)
    add("--out", default=None, help="output directory (default runs/sbi-<task>)")
    add("--force", action="store_true", help="replace the run in --out")
    add("--no-plots", action="store_true", help="skip the PNG plots")
    add("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)
    return parser


def run_sbi(args: argparse.Namespace) -> dict[str, Any]:
    """Do the work of `flowkit sbi` for parsed arguments; returns the metrics written to metrics.json."""
    import torch

    from .. import inference, io
    from ..flows import parse_hidden

    task = inference.get_task(args.task)
    out = Path(args.out or Path("runs") / f"sbi-{args.task}")
    prepare_output(out, force=args.force, resume=False, steps=args.epochs, outputs=OUTPUTS)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    theta, x = task.simulations(args.simulations, generator)
    flow = inference.posterior_flow(
        task.theta_dim, task.x_dim, args.flow, transforms=args.transforms, hidden=parse_hidden(args.hidden),
        bins=args.bins,
    )  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    posterior, history = inference.fit_posterior(
        flow, theta.float(), x.float(), lower=task.lower, upper=task.upper, epochs=args.epochs,
        batch_size=args.batch_size, lr=args.lr, seed=args.seed, progress=not args.no_progress,
        regression=args.regression,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    io.save(posterior, out / "model")
    history.to_csv(out / "history.csv")

    c2sts, first = [], None
    for index in range(args.observations):
        truth, x_o = task.observation(index)
        reference = task.reference_posterior(x_o, args.posterior_samples, generator)
        estimate = posterior.sample(args.posterior_samples, x_o).double()
        c2sts.append(inference.c2st(reference, estimate, seed=args.seed))
        if first is None:
            first = (truth, reference, estimate)

    theta_cal, x_cal = task.simulations(args.calibration, generator)
    samples = posterior.sample(args.calibration_samples, x_cal).double()
    levels, tarp = inference.tarp_coverage(samples, theta_cal, seed=args.seed)
    ranks = inference.sbc_ranks(samples, theta_cal)
    _, sbc = inference.sbc_coverage(ranks, args.calibration_samples, levels)
    metrics: dict[str, Any] = {
        "task": args.task,
        "reference": task.reference,
        "simulations": args.simulations,
        "simulations_used": int(theta.shape[0]),
        "flow": args.flow,
        "regression": args.regression,
        "epochs_run": len(history.val_step),  # validated once per epoch
        "steps": history.steps_run,
        "best_val_loss": history.best_val_loss,
        "train_seconds": round(seconds, 2),
        "c2st": c2sts,
        "c2st_mean": sum(c2sts) / len(c2sts),
        "tarp_coverage_error": inference.coverage_error(levels, tarp),
        "sbc_coverage_error": inference.coverage_error(levels, sbc),
        "sbc_ks_pvalues": inference.sbc_uniformity(ranks, args.calibration_samples).tolist(),
        "calibration_simulations": args.calibration,
        "posterior_samples": args.posterior_samples,
        "seed": args.seed,
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    if not args.no_plots and first is not None:
        truth, reference, estimate = first
        names = list(task.parameter_names)
        fig = inference.plot_corner(estimate, reference, truth=truth, labels=names, title=f"{args.task}: observation 0")
        fig.savefig(out / "corner.png", dpi=100)
        curves = {"TARP": (levels, tarp), "SBC (central intervals)": (levels, sbc)}
        inference.plot_coverage(curves, n=args.calibration).savefig(out / "coverage.png", dpi=100)
        inference.plot_sbc(ranks, args.calibration_samples, labels=names).savefig(out / "sbc.png", dpi=100)
    return metrics


def run(args: argparse.Namespace) -> int:
    """Run `flowkit sbi` for parsed arguments; returns the exit code."""
    metrics = run_sbi(args)
    print(
        f"C2ST {metrics['c2st_mean']:.3f} (0.5 is perfect), TARP coverage error {metrics['tarp_coverage_error']:.3f}, "
        f"SBC coverage error {metrics['sbc_coverage_error']:.3f}; trained in {metrics['train_seconds']:.1f} s; "
        f"wrote {args.out or 'runs/sbi-' + args.task}"
    )
    return 0
