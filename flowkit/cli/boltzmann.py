"""`flowkit boltzmann TARGET`: train a Boltzmann generator on a built-in target and write model, metrics and plots.

TARGET is `double-well`, `many-well`, `gmm`, `phi4` or `alanine-dipeptide` (OpenMM, the `md`
extra: an internal-coordinate flow, maximum likelihood on cached Langevin MD frames of
`--md-ns` ns at `--temperature`, Ramachandran plot), or a rigid-body target on unit quaternions:
`matrix-fisher`, `octupole` (`--kappa`; both with `--aux` auxiliary coordinates) or `dipoles`
(`--bodies` rigid dipoles in a periodic box; `--samples` are Metropolis states for targets without exact
samples), with a
[`RigidBodyFlow`][flowkit.flows.RigidBodyFlow] of `--transforms` blocks and an orientation plot. The flow is
trained by [`BoltzmannGenerator`][flowkit.train.BoltzmannGenerator] (reverse KL with the
chosen gradient estimator, plus maximum likelihood on `--samples` exact
samples when the target can draw them). The output directory receives
`model/` ([`flowkit.io.save`][flowkit.io.save]), `metrics.json` (ESS, log Z estimate
with its standard error and the exact value when known, IMH acceptance),
`history.csv` and PNG plots (2-D: flow density next to the target density;
lattice: sample configurations and the magnetisation histogram; none for
many-well). For `phi4`, `--flow lattice` trains a
[`LatticeFlow`][flowkit.flows.LatticeFlow] (the tutorial's: `--transforms 16 --hidden 8,8`,
`--z2` for Z2-symmetric conditioners), a jittered-HMC reference chain of `--hmc-steps`
trajectories runs next to the IMH chain, `metrics.json` gets `observables` (magnetisation,
|M|, chi_2, pole mass, with blocked-jackknife errors, and tau_int of |M| and chi_2, for
IMH and HMC), and the magnetisation histogram and `autocorrelation.png` compare the two chains.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from .fit import prepare_output

__all__ = ["add_parser", "run", "TARGETS", "OUTPUTS"]

#: What `flowkit boltzmann` writes in its output directory (removed by `--force` before a new run).
OUTPUTS = (
    "model",
    "metrics.json",
    "history.csv",
    "orientations.png",
    "ramachandran.png",
    "density.png",
    "target.png",
    "configurations.png",
    "magnetization.png",
    "autocorrelation.png",
)

#: Built-in target names.
TARGETS = ("double-well", "many-well", "gmm", "phi4", "alanine-dipeptide", "matrix-fisher", "octupole", "dipoles")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `flowkit boltzmann` subcommand."""
    parser = subparsers.add_parser(
        "boltzmann",
        help="train a Boltzmann generator on a target energy",
        description="Train a flow on a target energy (reverse KL, optionally with ML on exact samples); "
        "write the model, metrics.json (ESS, log Z, IMH acceptance), history and plots.",
    )
    parser.add_argument("target", metavar="TARGET", choices=TARGETS, help=", ".join(TARGETS))
    parser.add_argument(
        "--estimator",
        default="fast",
        choices=["fast", "standard", "reparam"],
        help="reverse-KL gradient estimator (default fast)",
    )
    parser.add_argument("--steps", type=int, default=2000, help="optimisation steps (default 2000)")
    parser.add_argument("--batch-size", type=int, default=256, help="batch size (default 256)")
    parser.add_argument("--lr", type=float, default=1e-3, help="initial learning rate, cosine-decayed (default 1e-3)")
    parser.add_argument(
        "--clip",
        type=float,
        default=None,
        help="gradient norm clip (default: the objective's, 10 for BoltzmannGenerator; 0 for none)",
    )
    parser.add_argument(
        "--flow",
        default="realnvp",
        choices=["realnvp", "nsf", "lattice"],
        help="realnvp, nsf (coupling) or lattice (phi4: checkerboard conv couplings); default realnvp",
    )
    parser.add_argument("--transforms", type=int, default=6, help="coupling layers (default 6)")
    parser.add_argument("--hidden", default="64,64", help="hidden sizes (default 64,64)")
    parser.add_argument(
        "--samples",
        type=int,
        default=0,
        help="exact target samples for the maximum-likelihood term (default 0: energy only)",
    )
    parser.add_argument("--w-ml", type=float, default=1.0, help="weight of the ML term (default 1)")
    parser.add_argument("--w-kl", type=float, default=1.0, help="weight of the reverse-KL term (default 1)")
    parser.add_argument("--dim", type=int, default=32, help="many-well dimension (default 32)")
    parser.add_argument("--L", type=int, default=8, help="phi4 lattice size (default 8)")
    parser.add_argument("--m2", type=float, default=-4.0, help="phi4 mass squared (default -4)")
    parser.add_argument("--lam", type=float, default=8.0, help="phi4 coupling (default 8)")
    parser.add_argument("--z2", action="store_true", help="phi4 with --flow lattice: Z2-symmetric conditioners")
    parser.add_argument("--kappa", type=float, default=8.0, help="octupole field strength (default 8)")
    parser.add_argument("--bodies", type=int, default=3, help="dipoles: number of rigid dipoles (default 3)")
    parser.add_argument(
        "--aux",
        type=int,
        default=4,
        help="matrix-fisher, octupole: auxiliary coordinates of the body (default 4; 0: maps of S^3 alone)",
    )
    parser.add_argument(
        "--heads", type=int, default=2, help="rigid targets: Moebius maps applied in turn per layer (default 2)"
    )
    parser.add_argument(
        "--components",
        type=int,
        default=None,
        help="rigid targets: convex combinations of this many Moebius maps in every layer (default: single maps)",
    )
    parser.add_argument(
        "--hmc-steps", type=int, default=2000, help="phi4: HMC reference trajectories per chain (default 2000; 0: none)"
    )
    parser.add_argument(
        "--temperature", type=float, default=1000.0, help="alanine-dipeptide temperature in K (default 1000)"
    )
    parser.add_argument("--solvent", default="vacuum", choices=["vacuum", "obc"], help="alanine-dipeptide solvent")
    parser.add_argument(
        "--md-ns",
        type=float,
        default=1.0,
        help="alanine-dipeptide: ns of cached Langevin MD for the ML term (default 1; 0: energy only)",
    )
    parser.add_argument(
        "--eval-samples", type=int, default=20_000, help="flow samples for ESS and log Z (default 20000)"
    )
    parser.add_argument("--imh-steps", type=int, default=10_000, help="length of the IMH chain (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0; also the GMM means)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: these flows are small, and more threads make them many times slower "
        "on a busy machine)",
    )
    parser.add_argument("--out", default=None, help="output directory (default runs/boltzmann-<target>)")
    parser.add_argument(
        "--force", action="store_true", help="replace the run in --out (its model, metrics, history and plots)"
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)
    return parser


def build_target(args: argparse.Namespace) -> Any:
    """The target named by the parsed arguments."""
    from .. import targets

    if args.target == "double-well":
        return targets.DoubleWell()
    if args.target == "many-well":
        return targets.ManyWell(args.dim)
    if args.target == "gmm":
        return targets.GaussianMixture(seed=args.seed)
    if args.target in ("matrix-fisher", "octupole"):
        # matrix-Fisher: singular values 11, 10, 9 in fixed random frames (bench/rigid.py)
        if args.target == "matrix-fisher":
            body = targets.MatrixFisher(_matrix_fisher_parameter())
        else:
            body = targets.Octupole(args.kappa)
        return targets.WithAuxiliaries(body, args.aux) if args.aux else body
    if args.target == "dipoles":
        return targets.RigidDipoles(args.bodies)
    if args.target == "alanine-dipeptide":
        return targets.AlanineDipeptide(args.temperature, solvent=None if args.solvent == "vacuum" else args.solvent)
    return targets.Phi4(args.L, args.m2, args.lam)


def _metropolis_samples(target: Any, n: int, seed: int) -> Any:
    """`n` states of random-walk Metropolis chains on a rigid target's manifold (the first fifth dropped)."""
    import torch

    from ..distributions import rigid_domain
    from ..sampling import metropolis

    domain = rigid_domain(target.segments)
    generator = torch.Generator().manual_seed(seed)
    chains = min(n, 512)
    per_chain = -(-n // chains)
    x0 = domain.sample((chains, *target.event_shape), generator=generator).to(target.dtype)
    states, _ = metropolis(target, x0, 10 * (per_chain + -(-per_chain // 4)), 0.3, domain, thin=10, generator=generator)
    return states[-per_chain:].reshape(-1, *target.event_shape)[:n].float()


def _matrix_fisher_parameter() -> list[list[float]]:
    """F = U diag(10, 9, 11) V^T with U, V two fixed random rotations (the matrix-Fisher target of bench/rigid.py)."""
    import numpy as np
    from scipy.spatial.transform import Rotation

    u, v = Rotation.random(2, random_state=3).as_matrix()
    return (u @ np.diag([10.0, 9.0, 11.0]) @ v.T).tolist()


def build_flow(args: argparse.Namespace, target: Any, samples: Any) -> Any:
    """A coupling flow for the target: vectors directly (standardised by the samples when given), lattices flattened."""
    from ..bijectors import Chain, Reshape
    from ..data import standardize
    from ..distributions import StandardNormal
    from ..flows import Flow, parse_hidden
    from ..flows import build_flow as preset

    shape = tuple(target.event_shape)
    features = math.prod(shape)
    hidden = parse_hidden(args.hidden)
    if getattr(target, "segments", None):  # rigid bodies: double Moebius couplings (--transforms blocks)
        from ..flows import RigidBodyFlow

        return RigidBodyFlow(
            target.segments,
            blocks=args.transforms,
            hidden=hidden,
            heads=args.heads,
            components=args.components,
        )
    if args.target == "alanine-dipeptide":
        from ..flows import internal_coordinate_flow
        from ..targets.alanine import alanine_internal_coordinates

        internal = alanine_internal_coordinates(target.minimum())
        return internal_coordinate_flow(internal, max(1, args.transforms // 2), hidden, seed=args.seed)
    if args.flow == "lattice":
        if len(shape) != 2:
            raise ValueError(f"--flow lattice needs a lattice target (phi4), got {args.target}")
        from ..flows import LatticeFlow

        return LatticeFlow(shape, transforms=args.transforms, hidden=hidden, z2=bool(getattr(args, "z2", False)))
    name = "nsf-coupling" if args.flow == "nsf" else args.flow
    flow = preset(name, features, transforms=args.transforms, hidden=hidden)
    if samples is not None:
        flow = standardize(flow, samples.reshape(samples.shape[0], -1))
    if len(shape) == 1:
        return flow
    bijector = Chain(Reshape(shape, (features,)), flow.bijector, Reshape((features,), shape))
    return Flow(bijector, StandardNormal(shape))


def train_boltzmann(args: argparse.Namespace) -> dict[str, Any]:
    """Do the work of `flowkit boltzmann` for parsed arguments; returns the metrics written to metrics.json."""
    import torch

    from .. import io, sampling
    from ..train import BoltzmannGenerator, fit

    for name in ("steps", "batch_size", "transforms", "eval_samples"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.imh_steps < 2:
        raise ValueError(f"--imh-steps must be at least 2, got {args.imh_steps}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be a positive integer, got {args.threads}")
    if args.samples < 0:
        raise ValueError(f"--samples must be non-negative, got {args.samples}")
    if args.aux < 0:
        raise ValueError(f"--aux must be non-negative, got {args.aux}")
    if args.heads < 1:
        raise ValueError(f"--heads must be a positive integer, got {args.heads}")
    if args.components is not None and args.components < 1:
        raise ValueError(f"--components must be a positive integer, got {args.components}")
    if not args.lr > 0:
        raise ValueError(f"--lr must be positive, got {args.lr}")
    if args.clip is not None and not args.clip >= 0:
        raise ValueError(f"--clip must be a non-negative number (0 for no clipping), got {args.clip}")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    target = build_target(args)
    samples = None
    if args.target == "alanine-dipeptide" and args.md_ns > 0:
        from ..data import alanine_dipeptide_md

        solvent = None if args.solvent == "vacuum" else args.solvent
        samples = alanine_dipeptide_md(args.temperature, args.md_ns, args.seed, solvent=solvent).float()
    elif args.samples and getattr(target, "segments", None) and not target.has_samples:
        samples = _metropolis_samples(target, args.samples, args.seed)  # rigid bodies: Metropolis on the manifold
    elif args.samples:
        if not target.has_samples:
            raise ValueError(f"--samples: the target {args.target} cannot draw exact samples with these parameters")
        samples = target.sample(args.samples, generator=torch.Generator().manual_seed(args.seed))
    flow = build_flow(args, target, samples)
    objective = BoltzmannGenerator(target, samples=samples, w_ml=args.w_ml, w_kl=args.w_kl, estimator=args.estimator)
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
    )
    seconds = time.perf_counter() - start
    flow.eval()
    io.save(flow, out / "model")
    x, log_w = sampling.importance_sample(flow, target, args.eval_samples)
    log_Z, log_Z_error = sampling.log_Z(log_w)
    chain, acceptance = sampling.imh(flow, target, args.imh_steps, generator=torch.Generator().manual_seed(args.seed))
    metrics: dict[str, Any] = {
        "target": args.target,
        "event_shape": list(target.event_shape),
        "flow": args.flow,
        "estimator": args.estimator,
        "steps": len(history),
        "skipped_steps": len(history.skipped),
        "train_seconds": round(seconds, 2),
        "ess": sampling.ess(log_w),
        "log_Z": log_Z,
        "log_Z_error": log_Z_error,
        "log_Z_exact": target.log_Z,
        "log_Z_abs_error": None if target.log_Z is None else abs(log_Z - target.log_Z),
        "imh_acceptance": acceptance,
        "eval_samples": args.eval_samples,
        "ml_samples": args.samples,
        "seed": args.seed,
    }
    if args.target == "gmm":
        metrics["modes_covered"] = int((target.mode_counts(x) > 0).sum())
    if args.target == "alanine-dipeptide":
        metrics.update(_alanine_metrics(flow, x, log_w, args))
    hmc = None
    if args.target == "phi4":
        metrics["observables"], hmc = _lattice_observables(target, chain, args)
    metrics = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    history.to_csv(out / "history.csv")
    if not args.no_plots:
        _plots(flow, target, x, log_w, chain, out, hmc)
    return metrics


def _lattice_observables(target: Any, chain: Any, args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """Observables with blocked-jackknife errors and tau_int of the IMH chain and of a jittered-HMC reference."""
    import torch

    from .. import lattice, sampling

    if args.hmc_steps < 0:
        raise ValueError(f"--hmc-steps must be non-negative, got {args.hmc_steps}")
    chains = {"imh": chain}
    hmc = None
    if args.hmc_steps:
        x0 = torch.zeros(8, *target.event_shape, dtype=torch.float64)
        run = sampling.hmc(
            target.double(), x0, args.hmc_steps, 0.1, 10, generator=torch.Generator().manual_seed(args.seed)
        )
        hmc = run.samples[args.hmc_steps // 10 :]
        chains["hmc"] = hmc
    out: dict[str, Any] = {}
    for name, samples in chains.items():
        blocks = max(2, min(20, samples.shape[0] // 10))
        measured = lattice.measure(samples, blocks=blocks)
        entry = {key: [float(measured[key][0]), float(measured[key][1])] for key in ("M", "abs_M", "chi2", "pole_mass")}
        m = lattice.magnetization(samples.double())
        entry["tau_int_abs_M"] = sampling.integrated_autocorrelation_time(m.abs())
        entry["tau_int_chi2"] = sampling.integrated_autocorrelation_time(m.square())
        out[name] = entry
    if hmc is not None:
        out["hmc"]["acceptance"] = float(run.mean_acceptance)
    return out, hmc


def _plots(flow: Any, target: Any, x: Any, log_w: Any, chain: Any, out: Path, hmc: Any = None) -> None:
    import numpy as np
    import torch
    from matplotlib.figure import Figure

    from .. import plot

    if getattr(target, "segments", None):  # rigid bodies: orientation of the first body, raw and reweighted
        q = x[:, :4]
        sets = {"flow": q, "flow (reweighted)": q}
        if target.has_samples:
            sets["target"] = target.sample(len(q))[:, :4]
        plot.orientations(sets, {"flow (reweighted)": log_w}).savefig(out / "orientations.png", dpi=100)
    elif hasattr(target, "topology"):  # a molecule: Ramachandran plot of the reweighted samples
        from ..targets.alanine import backbone_dihedrals

        phi, psi = backbone_dihedrals(x)
        plot.ramachandran(phi, psi, log_w, titles=("flow (reweighted)",)).savefig(out / "ramachandran.png", dpi=100)
    elif tuple(target.event_shape) == (2,):
        shown = x[:2000]
        bounds = [(float(shown[:, i].min()) - 0.5, float(shown[:, i].max()) + 0.5) for i in range(2)]
        plot.density(flow, shown, bounds=bounds, title="flow density and samples").savefig(out / "density.png", dpi=100)
        xs, ys = (np.linspace(lo, hi, 200) for lo, hi in bounds)
        grid = torch.as_tensor(np.stack(np.meshgrid(xs, ys, indexing="xy"), -1).reshape(-1, 2), dtype=x.dtype)
        u = target.energy(grid).double().numpy().reshape(200, 200)
        fig = Figure(figsize=(5, 4.4), layout="constrained")
        ax = fig.add_subplot()
        mesh = ax.pcolormesh(xs, ys, np.exp(-(u - u.min())), shading="auto", cmap="viridis")
        fig.colorbar(mesh, ax=ax, label="exp(-u(x)) (unnormalised)")
        ax.set(xlabel="$x_1$", ylabel="$x_2$", title="target density")
        ax.set_aspect("equal")
        fig.savefig(out / "target.png", dpi=100)
    elif len(target.event_shape) == 2:
        plot.lattice_configurations(x, n=4, title="flow samples").savefig(out / "configurations.png", dpi=100)
        chains = {"flow (IMH chain)": chain} if hmc is None else {"flow (IMH chain)": chain, "HMC": hmc}
        plot.magnetization_histogram(chains).savefig(out / "magnetization.png", dpi=100)
        series = {name: c.double().mean((-1, -2)).abs() for name, c in chains.items()}
        plot.autocorrelation(series, title="autocorrelation of |M|").savefig(out / "autocorrelation.png", dpi=100)


def _alanine_metrics(flow: Any, x: Any, log_w: Any, args: argparse.Namespace) -> dict[str, Any]:
    """P(phi > 0) (raw and reweighted), the mirror-image fraction and the MD frames used."""
    import torch

    from ..bijectors.internal import same_chirality
    from ..targets.alanine import ALANINE_CHIRAL_CENTRES, backbone_dihedrals

    phi, _ = backbone_dihedrals(x)
    reference = flow.bijector[0].reference
    mirror = ~same_chirality(x.double(), reference.double(), ALANINE_CHIRAL_CENTRES)
    w = torch.softmax(log_w, 0)
    return {
        "flow": "internal-coordinate splines",
        "temperature": args.temperature,
        "solvent": args.solvent,
        "md_ns": args.md_ns,
        "p_phi_positive_raw": float((phi > 0).double().mean()),
        "p_phi_positive_reweighted": float((w * (phi > 0).double()).sum()),
        "mirror_fraction": float(mirror.double().mean()),
    }


def run(args: argparse.Namespace) -> int:
    """Run `flowkit boltzmann` for parsed arguments; returns the exit code."""
    metrics = train_boltzmann(args)
    exact = "" if metrics["log_Z_exact"] is None else f" (exact {metrics['log_Z_exact']:.4f})"
    print(
        f"ESS {100 * metrics['ess']:.1f}%, log Z {metrics['log_Z']:.4f} +- {metrics['log_Z_error']:.4f}{exact}, "
        f"IMH acceptance {100 * metrics['imh_acceptance']:.1f}%; wrote {args.out or 'runs/boltzmann-' + args.target}"
    )
    return 0
