"""`flowkit boltzmann TARGET`: train a Boltzmann generator on a built-in target and write model, metrics and plots.

The flow (a `--flow` preset that samples in one pass; rigid bodies a [`RigidBodyFlow`][flowkit.flows.RigidBodyFlow],
alanine dipeptide an internal-coordinate flow) is trained by [`BoltzmannGenerator`][flowkit.train.BoltzmannGenerator]
(`--objective kl`: reverse KL with the chosen gradient estimator, plus maximum likelihood on `--samples` exact
samples or the molecule's MD frames) or by [`FAB`][flowkit.train.FAB] (`--objective fab`, the energy alone). The
output directory receives `model/` ([`flowkit.io.save`][flowkit.io.save]), `metrics.json` (ESS, log Z with its
standard error and the exact value when known, IMH acceptance, and the target's own metrics), `history.csv` and
the target's plots and files. What each target brings (its flow, ML samples, metrics, plots and files) is its
entry in `flowkit.cli.targets.TARGET_SPECS`, described in the CLI guide; this module parses the options, trains
and writes the common outputs.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from pathlib import Path
from typing import Any

from .arguments import add_threads, int_at_least, non_negative_float, non_negative_int, positive_float, positive_int
from .fit import prepare_output
from .presets import presets_help
from .targets import FLOWS, RENAMED_FLOWS, TARGET_SPECS, Evaluation

__all__ = ["add_parser", "run", "TARGETS", "OUTPUTS", "DEFAULTS"]

#: What `flowkit boltzmann` writes in its output directory (removed by `--force` before a new run).
OUTPUTS = (
    "model",
    "metrics.json",
    "history.csv",
    "orientations.png",
    "ramachandran.png",
    "free_energy.png",
    "free_energy.csv",
    "samples.pdb",
    "samples.dcd",
    "density.png",
    "target.png",
    "configurations.png",
    "magnetization.png",
    "autocorrelation.png",
)

#: The command's defaults of the options a target may change (`TargetSpec.defaults`; the parser's default is None).
DEFAULTS = {"steps": 2000, "w_kl": 1.0, "eval_samples": 20_000}

#: Built-in target names (what each brings: `flowkit.cli.targets.TARGET_SPECS`).
TARGETS = tuple(TARGET_SPECS)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `flowkit boltzmann` subcommand."""
    flows = [name for name in FLOWS if name not in RENAMED_FLOWS]
    parser = subparsers.add_parser(
        "boltzmann",
        help="train a Boltzmann generator on a target energy",
        description="Train a flow on a target energy (reverse KL, optionally with ML on exact samples); "
        "write the model, metrics.json (ESS, log Z, IMH acceptance), history and plots.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"flows (--flow NAME; --transforms and --hidden size them):\n{presets_help(flows, arguments=False)}",
    )
    add = parser.add_argument
    add("target", metavar="TARGET", choices=TARGETS, help=", ".join(TARGETS))
    add(
        "--estimator",
        default="fast",
        choices=["fast", "standard", "reparam"],
        help="reverse-KL gradient estimator (default fast)",
    )
    add("--steps", type=positive_int, default=None, help="optimisation steps (default 2000; alanine-dipeptide 3000)")
    add("--batch-size", type=positive_int, default=256, help="batch size (default 256)")
    add("--lr", type=positive_float, default=1e-3, help="initial learning rate, cosine-decayed (default 1e-3)")
    add(
        "--clip",
        type=non_negative_float,
        default=None,
        help="gradient norm clip (default: the objective's, 10 for BoltzmannGenerator; 0 for none)",
    )
    add(
        "--flow",
        default="realnvp",
        choices=list(FLOWS),
        metavar="NAME",
        help="a flow that samples in one pass (the list below; default realnvp); "
        + ", ".join(f"{old}: deprecated, the old name of {new}" for old, new in RENAMED_FLOWS.items()),
    )
    add("--transforms", type=positive_int, default=6, help="coupling layers (default 6)")
    add("--hidden", default="64,64", help="hidden sizes (default 64,64)")
    add(
        "--samples",
        type=non_negative_int,
        default=0,
        help="exact target samples for the maximum-likelihood term (default 0: energy only)",
    )
    add(
        "--objective",
        default="kl",
        choices=["kl", "fab"],
        help="kl: BoltzmannGenerator (reverse KL, plus ML on --samples / MD frames); fab: FAB (alpha-2 divergence by "
        "AIS towards p^2/q, from the energy alone: no samples or MD frames are used). Default kl",
    )
    add("--ais-steps", type=positive_int, default=8, help="fab: AIS intermediate distributions (default 8)")
    add(
        "--transition",
        default=None,
        choices=["hmc", "metropolis"],
        help="fab: AIS kernel (default hmc; metropolis on the rigid bodies' manifolds)",
    )
    add("--ais-step-size", type=float, default=None, help="fab: initial AIS step size, adapted (default: the target's)")
    add(
        "--replay-buffer",
        type=non_negative_int,
        default=0,
        help="fab: prioritised replay buffer capacity (default 0: none)",
    )
    add("--w-ml", type=float, default=1.0, help="weight of the ML term (default 1)")
    add(
        "--w-kl",
        type=float,
        default=None,
        help="weight of the reverse-KL term (default 1; alanine-dipeptide 0.1: more drains the minor phi basin)",
    )
    add("--dim", type=int, default=32, help="many-well dimension (default 32)")
    add("--L", type=int, default=8, help="phi4 lattice size (default 8)")
    add("--m2", type=float, default=-4.0, help="phi4 mass squared (default -4)")
    add("--lam", type=float, default=8.0, help="phi4 coupling (default 8)")
    add("--z2", action="store_true", help="phi4 with --flow lattice: Z2-symmetric conditioners")
    add("--g", type=float, default=0.6, help="yukawa: Yukawa coupling of the staggered fermions (default 0.6)")
    add("--kappa", type=float, default=8.0, help="octupole field strength (default 8)")
    add("--bodies", type=int, default=3, help="dipoles: number of rigid dipoles (default 3)")
    add(
        "--aux",
        type=non_negative_int,
        default=4,
        help="matrix-fisher, octupole: auxiliary coordinates of the body (default 4; 0: maps of S^3 alone)",
    )
    add(
        "--heads",
        type=positive_int,
        default=2,
        help="rigid targets: Moebius maps applied in turn per layer (default 2)",
    )
    add(
        "--components",
        type=positive_int,
        default=None,
        help="rigid targets: convex combinations of this many Moebius maps in every layer (default: single maps)",
    )
    add(
        "--hmc-steps", type=int, default=2000, help="phi4: HMC reference trajectories per chain (default 2000; 0: none)"
    )
    add("--temperature", type=float, default=1000.0, help="alanine-dipeptide temperature in K (default 1000)")
    add("--solvent", default="vacuum", choices=["vacuum", "obc"], help="alanine-dipeptide solvent")
    add(
        "--md-ns",
        type=float,
        default=5.0,
        help="alanine-dipeptide: ns of cached Langevin MD for the ML term (default 5; 0: energy only)",
    )
    add(
        "--trajectory-frames",
        type=positive_int,
        default=1000,
        help="alanine-dipeptide: reweighted configurations resampled into samples.dcd (default 1000)",
    )
    add(
        "--eval-samples",
        type=positive_int,
        default=None,
        help="flow samples for ESS, log Z and the target's metrics (default 20000; alanine-dipeptide 100000)",
    )
    add("--imh-steps", type=int_at_least(2), default=10_000, help="length of the IMH chain (default 10000)")
    add("--seed", type=int, default=0, help="seed (default 0; also the GMM means)")
    add_threads(parser, "default 1: more threads make these small flows slower on a busy machine", 1)
    add("--out", default=None, help="output directory (default runs/boltzmann-<target>)")
    add("--force", action="store_true", help="replace the run in --out (its model, metrics, history and plots)")
    add("--no-plots", action="store_true", help="skip the PNG plots")
    add("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)
    return parser


def _objective(args: argparse.Namespace, spec: Any, target: Any, samples: Any) -> Any:
    """`--objective`: BoltzmannGenerator (reverse KL and ML on the samples) or FAB (the energy alone)."""
    from ..train import FAB, BoltzmannGenerator

    if args.objective == "kl":
        return BoltzmannGenerator(target, samples=samples, w_ml=args.w_ml, w_kl=args.w_kl, estimator=args.estimator)
    segments = getattr(target, "segments", None)  # rigid bodies: random walks on their manifold
    domain = None
    if segments:
        from ..distributions import rigid_domain

        domain = rigid_domain(segments)
    transition = args.transition or ("metropolis" if segments else "hmc")
    step_size = spec.ais_step_size if args.ais_step_size is None else args.ais_step_size
    return FAB(
        target,
        ais_steps=args.ais_steps,
        transition=transition,
        replay_buffer=args.replay_buffer or None,
        step_size=step_size,
        domain=domain,
    )


def _train_evaluations(objective: Any, steps: int, batch_size: int) -> int:
    """Configurations at which training evaluated the target: FAB counts its own; the reverse KL one batch a step."""
    counted = getattr(objective, "target_evaluations", None)
    if counted is not None:
        return int(counted)
    return steps * batch_size if objective.w_kl > 0 else 0


def train_boltzmann(args: argparse.Namespace) -> dict[str, Any]:
    """Do the work of `flowkit boltzmann` for parsed arguments; returns the metrics written to metrics.json."""
    import torch

    from .. import io, sampling
    from ..train import fit

    spec = TARGET_SPECS[args.target]
    if args.flow in RENAMED_FLOWS:  # the name of another flow in flowkit fit
        args.flow, old = RENAMED_FLOWS[args.flow], args.flow
        warnings.warn(f"--flow {old} is {args.flow}; it will mean the {old} of flowkit fit", FutureWarning, 2)
    for name, value in {**DEFAULTS, **spec.defaults}.items():  # the options the user left out
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    target = spec.build_target(args)
    samples = None if args.objective == "fab" else spec.samples(args, target)  # FAB: the energy alone
    held_out = None
    if samples is not None and spec.validation > 0:  # the last frames: the least correlated with the training ones
        n_val = max(1, int(spec.validation * samples.shape[0]))
        samples, held_out = samples[:-n_val], samples[-n_val:]
    flow = spec.build_flow(args, target, samples)
    objective = _objective(args, spec, target, samples)
    out = Path(args.out or Path("runs") / f"boltzmann-{args.target}")
    prepare_output(out, force=args.force, resume=False, steps=args.steps, outputs=OUTPUTS)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    history = fit(
        flow,
        objective,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        clip=None if args.clip is None else (args.clip or math.inf),  # None: the objective's default_clip
        progress=not args.no_progress,
        seed=args.seed,
        val_data=held_out,
    )
    seconds = time.perf_counter() - start
    flow.eval()
    io.save(flow, out / "model")
    x, log_w = sampling.importance_sample(flow, target, args.eval_samples)
    log_Z, log_Z_error = sampling.log_Z(log_w)
    generator = torch.Generator().manual_seed(args.seed)
    imh = sampling.independent_metropolis(flow, target, args.imh_steps, generator=generator)
    chain, acceptance = imh.samples[:, 0], imh.mean_acceptance
    metrics: dict[str, Any] = {
        "target": args.target,
        "event_shape": list(target.event_shape),
        "flow": args.flow,
        "estimator": args.estimator,
        "objective": args.objective,
        "train_target_evaluations": _train_evaluations(objective, len(history), args.batch_size),
        "steps": len(history),
        "skipped_steps": len(history.skipped),
        "train_seconds": round(seconds, 2),
        "ess": sampling.ess(log_w),
        "log_Z": log_Z,
        "log_Z_error": log_Z_error,
        "log_Z_exact": target.log_Z,
        "log_Z_abs_error": None if target.log_Z is None else abs(log_Z - target.log_Z),
        "imh_acceptance": acceptance,
        **(
            {}
            if held_out is None
            else {
                "validation_samples": held_out.shape[0],
                "best_step": history.best_step,
                "best_val_nll": history.best_val_loss,
            }
        ),
        "eval_samples": args.eval_samples,
        "ml_samples": args.samples,
        "seed": args.seed,
    }
    evaluation = Evaluation(flow, target, x, log_w, chain)
    metrics.update(spec.metrics(args, evaluation))
    metrics = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    history.to_csv(out / "history.csv")
    spec.write(args, evaluation, out)
    if not args.no_plots:
        spec.plots(evaluation, out)
    return metrics


def run(args: argparse.Namespace) -> int:
    """Run `flowkit boltzmann` for parsed arguments; returns the exit code."""
    metrics = train_boltzmann(args)
    exact = "" if metrics["log_Z_exact"] is None else f" (exact {metrics['log_Z_exact']:.4f})"
    print(
        f"ESS {100 * metrics['ess']:.1f}%, log Z {metrics['log_Z']:.4f} +- {metrics['log_Z_error']:.4f}{exact}, "
        f"IMH acceptance {100 * metrics['imh_acceptance']:.1f}%; wrote {args.out or 'runs/boltzmann-' + args.target}"
    )
    return 0
