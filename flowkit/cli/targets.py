"""The built-in targets of `flowkit boltzmann`: one [`TargetSpec`][flowkit.cli.targets.TargetSpec] per name.

`TARGET_SPECS` maps each `TARGET` name to what the command needs of it: the target, the flow, the
maximum-likelihood samples, the target's own metrics and its plots. The targets on vectors and lattices take
the flow preset named by `--flow` (those that sample in one pass: `FLOWS`); the others bring their own (rigid bodies a
[`RigidBodyFlow`][flowkit.flows.RigidBodyFlow], the molecule an internal-coordinate flow) and ignore `--flow`.
A new target is one entry in `TARGET_SPECS` (the command's `TARGET` choices are its keys); a plot file it
writes must also be in `flowkit.cli.boltzmann.OUTPUTS`, which `--force` clears.

Everything here imports torch, flowkit's targets and matplotlib inside the functions, so that `flowkit --help`
stays fast.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .presets import preset_names

__all__ = ["TargetSpec", "Evaluation", "TARGET_SPECS", "FLOWS", "RENAMED_FLOWS"]


def _exact_samples(args: argparse.Namespace, target: Any) -> Any:
    """`--samples` exact samples of the target (None for `--samples 0`)."""
    import torch

    if not args.samples:
        return None
    if not target.has_samples:
        raise ValueError(f"--samples: the target {args.target} cannot draw exact samples with these parameters")
    return target.sample(args.samples, generator=torch.Generator().manual_seed(args.seed))


def _no_metrics(args: argparse.Namespace, run: Evaluation) -> dict[str, Any]:
    return {}


def _no_files(args: argparse.Namespace, run: Evaluation, out: Path) -> None:
    return None


@dataclass
class Evaluation:
    """What the trained flow gave on its target, handed to the target's metrics and plots.

    Attributes:
        flow: the trained flow, in eval mode.
        target: the target it was trained on.
        x: `--eval-samples` flow samples.
        log_w: their log importance weights.
        chain: the states of the independent Metropolis-Hastings chain.
        reference: what the target's metrics computed for its plots and files to use (`phi4`: the jittered-HMC
            reference chain; `alanine-dipeptide`: a dict of the MD dihedrals, the free-energy profiles and the
            resampled configurations); None when there is none.
    """

    flow: Any
    target: Any
    x: Any
    log_w: Any
    chain: Any
    reference: Any = None


@dataclass(frozen=True)
class TargetSpec:
    """What `flowkit boltzmann TARGET` needs of one target.

    Attributes:
        build_target: `(args) -> target`, the target for the parsed arguments.
        build_flow: `(args, target, samples) -> flow`, the untrained flow (`samples`: the ML samples or None).
        plots: `(evaluation, out) -> None`, writes the target's PNG plots into `out` (unless `--no-plots`).
        plot_files: the names of the files `plots` may write (each one of `flowkit.cli.boltzmann.OUTPUTS`).
        samples: `(args, target) -> samples or None`, the samples of the maximum-likelihood term (default: `--samples`
            exact samples, refused when the target cannot draw them).
        metrics: `(args, evaluation) -> dict`, entries added to (or replacing) the common ones in metrics.json
            (default: none).
        validation: the fraction of the ML samples held out, from their end (MD frames are a time series: the
            last ones are the least correlated with the training ones), to pick the best weights by their
            negative log-likelihood (0: none held out, the last weights kept).
        write: `(args, evaluation, out) -> None`, writes the target's data files into `out` (with or without
            `--no-plots`; default: none), after `metrics`.
        data_files: the names of the files `write` may write (each one of `flowkit.cli.boltzmann.OUTPUTS`).
        defaults: option values (by `args` name) that replace the command's defaults
            `flowkit.cli.boltzmann.DEFAULTS` for this target when the user leaves the option out.
        ais_step_size: the initial step size of the AIS kernels of `--objective fab` (adapted as it trains), in the
            target's coordinates (the molecule's: nm).
    """

    build_target: Callable[[argparse.Namespace], Any]
    build_flow: Callable[[argparse.Namespace, Any, Any], Any]
    plots: Callable[[Evaluation, Path], None]
    plot_files: tuple[str, ...]
    samples: Callable[[argparse.Namespace, Any], Any] = _exact_samples
    metrics: Callable[[argparse.Namespace, Evaluation], dict[str, Any]] = _no_metrics
    validation: float = 0.0
    write: Callable[[argparse.Namespace, Evaluation, Path], None] = _no_files
    data_files: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    ais_step_size: float = 0.1


# --- targets


def _target(name: str, *options: str, **keywords: str) -> Callable[[argparse.Namespace], Any]:
    """`(args) -> flowkit.targets.NAME(*options, **keywords)`, each an option's value (by `args` name)."""

    def build(args: argparse.Namespace) -> Any:
        from .. import targets

        given = {key: getattr(args, option) for key, option in keywords.items()}
        return getattr(targets, name)(*(getattr(args, option) for option in options), **given)

    return build


def _solvent(args: argparse.Namespace) -> str | None:
    return None if args.solvent == "vacuum" else args.solvent


def _alanine_dipeptide(args: argparse.Namespace) -> Any:
    from ..targets import AlanineDipeptide

    return AlanineDipeptide(args.temperature, solvent=_solvent(args))


def _with_auxiliaries(body: Any, args: argparse.Namespace) -> Any:
    """The rigid body with `--aux` auxiliary coordinates (`--aux 0`: the body alone)."""
    from ..targets import WithAuxiliaries

    return WithAuxiliaries(body, args.aux) if args.aux else body


def _matrix_fisher_parameter() -> list[list[float]]:
    """F = U diag(10, 9, 11) V^T with U, V two fixed random rotations (the matrix-Fisher target of bench/rigid.py)."""
    import numpy as np
    from scipy.spatial.transform import Rotation

    u, v = Rotation.random(2, random_state=3).as_matrix()
    return (u @ np.diag([10.0, 9.0, 11.0]) @ v.T).tolist()


def _matrix_fisher(args: argparse.Namespace) -> Any:
    from ..targets import MatrixFisher

    return _with_auxiliaries(MatrixFisher(_matrix_fisher_parameter()), args)


def _octupole(args: argparse.Namespace) -> Any:
    from ..targets import Octupole

    return _with_auxiliaries(Octupole(args.kappa), args)


# --- maximum-likelihood samples


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


def _rigid_samples(args: argparse.Namespace, target: Any) -> Any:
    """Exact samples when the rigid target draws them, else Metropolis states on its manifold."""
    if args.samples and not target.has_samples:
        return _metropolis_samples(target, args.samples, args.seed)
    return _exact_samples(args, target)


def _md_samples(args: argparse.Namespace, target: Any) -> Any:
    """Cached Langevin MD frames of `--md-ns` ns at `--temperature` (`--md-ns 0`: `--samples` exact samples)."""
    if not args.md_ns > 0:
        return _exact_samples(args, target)
    from ..data import alanine_dipeptide_md

    return alanine_dipeptide_md(args.temperature, args.md_ns, args.seed, solvent=_solvent(args)).float()


# --- flows


def _preset_flow(args: argparse.Namespace, target: Any, samples: Any) -> Any:
    """The `--flow` preset on the target's lattice, or on its events as vectors (standardised by the samples)."""
    from ..bijectors import Chain, Reshape
    from ..data import standardize
    from ..distributions import StandardNormal
    from ..flows import PRESETS, Flow

    shape, preset = tuple(target.event_shape), PRESETS[RENAMED_FLOWS.get(args.flow, args.flow)]
    sizes = {"transforms": args.transforms, "hidden": args.hidden}
    if preset.kind == "lattice":
        if len(shape) != 2:
            raise ValueError(f"--flow {args.flow} needs a lattice target (phi4, yukawa), got {args.target}")
        return preset(shape, z2=bool(getattr(args, "z2", False)), **sizes)
    features = math.prod(shape)
    flow = preset(features, **sizes)
    if samples is not None:
        flow = standardize(flow, samples.reshape(samples.shape[0], -1))
    if len(shape) == 1:
        return flow
    bijector = Chain(Reshape(shape, (features,)), flow.bijector, Reshape((features,), shape))
    return Flow(bijector, StandardNormal(shape))


#: Names `--flow` took with another meaning than in `flowkit fit`, and the preset each meant (with a FutureWarning).
RENAMED_FLOWS = {"nsf": "nsf-coupling"}

FLOWS: dict[str, Callable[[argparse.Namespace, Any, Any], Any]] = dict.fromkeys(
    [*preset_names("vector", "lattice", one_pass=True), *RENAMED_FLOWS], _preset_flow
)
"""`--flow` name -> `(args, target, samples) -> flow`: the presets that sample in one pass (reverse KL needs it)."""


def _rigid_flow(args: argparse.Namespace, target: Any, samples: Any) -> Any:
    """Double Moebius couplings on the bodies' quaternions (`--transforms` blocks, `--heads`, `--components`)."""
    from ..flows import RigidBodyFlow, parse_hidden

    return RigidBodyFlow(
        target.segments,
        blocks=args.transforms,
        hidden=parse_hidden(args.hidden),
        heads=args.heads,
        components=args.components,
    )


def _internal_coordinate_flow(args: argparse.Namespace, target: Any, samples: Any) -> Any:
    """Splines on the molecule's internal coordinates about its energy minimum (`--transforms // 2` layers)."""
    from ..flows import internal_coordinate_flow, parse_hidden
    from ..targets.alanine import alanine_internal_coordinates

    internal = alanine_internal_coordinates(target.minimum())
    return internal_coordinate_flow(internal, max(1, args.transforms // 2), parse_hidden(args.hidden), seed=args.seed)


# --- metrics


def _modes_covered(args: argparse.Namespace, run: Evaluation) -> dict[str, Any]:
    """The number of the mixture's modes that hold at least one flow sample."""
    return {"modes_covered": int((run.target.mode_counts(run.x) > 0).sum())}


def _lattice_observables(args: argparse.Namespace, run: Evaluation) -> dict[str, Any]:
    """Observables with blocked-jackknife errors and tau_int of the IMH chain and of a jittered-HMC reference.

    The HMC chain (`--hmc-steps` trajectories; 0: none) is kept in `run.reference` for the plots.
    """
    import torch

    from .. import lattice, sampling

    if args.hmc_steps < 0:
        raise ValueError(f"--hmc-steps must be non-negative, got {args.hmc_steps}")
    target = run.target
    chains = {"imh": run.chain}
    if args.hmc_steps:
        x0 = torch.zeros(8, *target.event_shape, dtype=torch.float64)
        hmc = sampling.hmc(
            target.double(), x0, args.hmc_steps, 0.1, 10, generator=torch.Generator().manual_seed(args.seed)
        )
        run.reference = chains["hmc"] = hmc.samples[args.hmc_steps // 10 :]
    out: dict[str, Any] = {}
    for name, samples in chains.items():
        blocks = max(2, min(20, samples.shape[0] // 10))
        measured = lattice.measure(samples, blocks=blocks)
        entry = {key: [float(measured[key][0]), float(measured[key][1])] for key in ("M", "abs_M", "chi2", "pole_mass")}
        m = lattice.magnetization(samples.double())
        entry["tau_int_abs_M"] = sampling.integrated_autocorrelation_time(m.abs())
        entry["tau_int_chi2"] = sampling.integrated_autocorrelation_time(m.square())
        out[name] = entry
    if args.hmc_steps:
        out["hmc"]["acceptance"] = float(hmc.mean_acceptance)
    return {"observables": out}


def _md_reference(args: argparse.Namespace, target: Any) -> Any:
    """The MD frames the flow is compared with: those of `--md-ns` (training and validation), or None for 0."""
    return _md_samples(args, target) if args.md_ns > 0 else None


def _yukawa_observables(args: argparse.Namespace, run: Evaluation) -> dict[str, Any]:
    """The lattice observables (IMH and exact-determinant HMC) plus the chiral condensate |Sigma| of each chain."""
    from .. import lattice

    out = _lattice_observables(args, run)
    chains = {"imh": run.chain, **({} if run.reference is None else {"hmc": run.reference})}
    for name, samples in chains.items():
        thinned = samples[:: max(1, samples.shape[0] // 500)]
        blocks = max(2, min(20, thinned.shape[0] // 10))
        measured = lattice.measure_fermions(thinned, run.target.dirac, blocks=blocks)
        out["observables"][name]["abs_chiral_condensate"] = [float(v) for v in measured["abs_chiral_condensate"]]
    return out


def _alanine_metrics(args: argparse.Namespace, run: Evaluation) -> dict[str, Any]:
    """P(phi > 0) raw, reweighted and in MD with errors, F(phi) against MD, and the resampled configurations.

    The reweighted estimates use the L-alanine samples only (mirror images dropped: MD started from L-alanine
    never visits D-alanine, which has the same energy): P(phi > 0) with its delta-method error, F(phi) on 36
    bins with the bootstrap error over 200 resamples of the flow samples. The MD reference (the `--md-ns`
    frames) gets blocked errors over 10 contiguous blocks. `--trajectory-frames` configurations are drawn
    from the reweighted samples by systematic resampling, for `samples.pdb` / `samples.dcd`.
    """
    import torch

    from .. import sampling
    from ..bijectors.internal import same_chirality
    from ..stats import blocked_mean, free_energy_profile
    from ..targets.alanine import ALANINE_CHIRAL_CENTRES, backbone_dihedrals

    phi, psi = backbone_dihedrals(run.x)
    reference = run.flow.bijector[0].reference
    keep = same_chirality(run.x.double(), reference.double(), ALANINE_CHIRAL_CENTRES)
    if int(keep.sum()) < 2:
        raise ValueError(
            f"alanine-dipeptide: {int(keep.sum())} of {len(keep)} flow samples are L-alanine (the others are mirror "
            "images); nothing to reweight"
        )
    x, log_w, phi, psi = run.x[keep], run.log_w[keep], phi[keep], psi[keep]
    p, p_error = sampling.reweight(phi > 0, log_w)
    profiles = {
        "flow (reweighted)": free_energy_profile(phi, log_w, error="bootstrap", resamples=200, seed=args.seed),
        "flow (raw)": free_energy_profile(phi, error=None),
    }
    metrics: dict[str, Any] = {
        "flow": "internal-coordinate splines",
        "temperature": args.temperature,
        "solvent": args.solvent,
        "md_ns": args.md_ns,
        "w_kl": args.w_kl,
        "mirror_fraction": float(1 - keep.double().mean()),
        "ess_l_alanine": sampling.ess(log_w),
        "p_phi_positive_raw": float((phi > 0).double().mean()),
        "p_phi_positive_reweighted": float(p),
        "p_phi_positive_reweighted_error": float(p_error),
    }
    frames = _md_reference(args, run.target)
    md = None
    if frames is not None:
        md = backbone_dihedrals(frames)
        metrics["p_phi_positive_md"], metrics["p_phi_positive_md_error"] = blocked_mean((md[0] > 0).double(), 10)
        profiles["MD"] = free_energy_profile(md[0], error="blocks", blocks=10)
        metrics["free_energy_vs_md"] = profiles["flow (reweighted)"].compare(profiles["MD"], below=5.0)
    metrics["errors"] = (
        "reweighted P(phi > 0): delta method of the self-normalised estimate; F(phi): bootstrap over 200 "
        "resamples of the flow samples; MD: 10 contiguous blocks of the --md-ns frames (the training data)"
    )
    index = sampling.resample(log_w, args.trajectory_frames, generator=torch.Generator().manual_seed(args.seed))
    metrics["trajectory_frames"] = len(index)
    metrics["trajectory_distinct_frames"] = int(torch.unique(index).numel())
    run.reference = {"phi_psi": (phi, psi), "log_w": log_w, "md": md, "profiles": profiles, "frames": x[index]}
    return metrics


def _alanine_files(args: argparse.Namespace, run: Evaluation, out: Path) -> None:
    """`samples.pdb` (topology and first frame), `samples.dcd` (the resampled frames) and `free_energy.csv`."""
    import numpy as np

    from ..targets.trajectory import write_dcd, write_pdb

    frames = run.reference["frames"]
    write_pdb(out / "samples.pdb", run.target.topology, frames[0])
    write_dcd(out / "samples.dcd", run.target.topology, frames)
    profiles = run.reference["profiles"]
    flow, raw, md = profiles["flow (reweighted)"], profiles["flow (raw)"], profiles.get("MD")
    columns = {"phi": flow.centres, "F_flow": flow.free_energy, "F_flow_error": flow.error, "F_raw": raw.free_energy}
    if md is not None:
        columns.update({"F_md": md.free_energy, "F_md_error": md.error})
    table = np.column_stack(list(columns.values()))
    np.savetxt(out / "free_energy.csv", table, delimiter=",", header=",".join(columns), comments="")


# --- plots


def _density_plots(run: Evaluation, out: Path) -> None:
    """For a 2-D target: the flow density with its samples (`density.png`) and the target density (`target.png`)."""
    import numpy as np
    import torch
    from matplotlib.figure import Figure

    from .. import plot

    x, target = run.x, run.target
    if tuple(target.event_shape) != (2,):  # many-well in more dimensions: no plot
        return
    shown = x[:2000]
    bounds = [(float(shown[:, i].min()) - 0.5, float(shown[:, i].max()) + 0.5) for i in range(2)]
    plot.density(run.flow, shown, bounds=bounds, title="flow density and samples").savefig(out / "density.png", dpi=100)
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


def _lattice_plots(run: Evaluation, out: Path) -> None:
    """Sample configurations, the magnetisation histogram and the autocorrelation of |M| (IMH, and HMC if run)."""
    from .. import plot

    plot.lattice_configurations(run.x, n=4, title="flow samples").savefig(out / "configurations.png", dpi=100)
    chains = {"flow (IMH chain)": run.chain}
    if run.reference is not None:
        chains["HMC"] = run.reference
    plot.magnetization_histogram(chains).savefig(out / "magnetization.png", dpi=100)
    series = {name: c.double().mean((-1, -2)).abs() for name, c in chains.items()}
    plot.autocorrelation(series, title="autocorrelation of |M|").savefig(out / "autocorrelation.png", dpi=100)


def _ramachandran_plots(run: Evaluation, out: Path) -> None:
    """Ramachandran plots of the raw and reweighted L-alanine flow samples next to MD's, and F(phi) with errors."""
    from .. import plot

    phi, psi = run.reference["phi_psi"]
    md = run.reference["md"]
    titles = ("flow (raw)", "flow (reweighted)", "MD")
    fig = plot.ramachandran(phi, psi, run.reference["log_w"], raw=True, reference=md, titles=titles)
    fig.savefig(out / "ramachandran.png", dpi=100)
    profiles = run.reference["profiles"]
    fig = plot.free_energy_profiles(profiles, title=r"free energy along $\phi$")
    fig.savefig(out / "free_energy.png", dpi=100)


def _orientation_plot(run: Evaluation, out: Path) -> None:
    """The orientation of the first body: flow samples raw and reweighted (and target samples when exact)."""
    from .. import plot

    q = run.x[:, :4]
    sets = {"flow": q, "flow (reweighted)": q}
    if run.target.has_samples:
        sets["target"] = run.target.sample(len(q))[:, :4]
    plot.orientations(sets, {"flow (reweighted)": run.log_w}).savefig(out / "orientations.png", dpi=100)


_DENSITY_FILES = ("density.png", "target.png")
_LATTICE_FILES = ("configurations.png", "magnetization.png", "autocorrelation.png")
_ORIENTATION = {"plots": _orientation_plot, "plot_files": ("orientations.png",), "samples": _rigid_samples}

TARGET_SPECS: dict[str, TargetSpec] = {
    "double-well": TargetSpec(_target("DoubleWell"), _preset_flow, plots=_density_plots, plot_files=_DENSITY_FILES),
    "many-well": TargetSpec(_target("ManyWell", "dim"), _preset_flow, plots=_density_plots, plot_files=_DENSITY_FILES),
    "gmm": TargetSpec(
        _target("GaussianMixture", seed="seed"),
        _preset_flow,
        plots=_density_plots,
        plot_files=_DENSITY_FILES,
        metrics=_modes_covered,
    ),
    "phi4": TargetSpec(
        _target("Phi4", "L", "m2", "lam"),
        _preset_flow,
        plots=_lattice_plots,
        plot_files=_LATTICE_FILES,
        metrics=_lattice_observables,
    ),
    "yukawa": TargetSpec(
        _target("YukawaStaggered", "L", "m2", "lam", "g"),
        _preset_flow,
        plots=_lattice_plots,
        plot_files=_LATTICE_FILES,
        metrics=_yukawa_observables,
    ),
    "alanine-dipeptide": TargetSpec(
        _alanine_dipeptide,
        _internal_coordinate_flow,
        plots=_ramachandran_plots,
        plot_files=("ramachandran.png", "free_energy.png"),
        samples=_md_samples,
        metrics=_alanine_metrics,
        validation=0.1,
        write=_alanine_files,
        data_files=("samples.pdb", "samples.dcd", "free_energy.csv"),
        # measured (2 shared cores, 1000 K): 5 ns MD, 3000 steps, w_kl 0.1 give P(phi > 0) 0.107 +- 0.024 against
        # 0.113 +- 0.009 in 10 ns of independent MD, ESS 2.4%; w_kl 1 drains the phi > 0 basin (0.014). The
        # reweighted P(phi > 0) of one model varies by 0.023 (sd) between sets of 20,000 samples; 100,000 (about
        # 10 s of energies) cut the spread by about sqrt(5).
        defaults={"steps": 3000, "w_kl": 0.1, "eval_samples": 100_000},
        ais_step_size=0.002,
    ),
    "matrix-fisher": TargetSpec(_matrix_fisher, _rigid_flow, **_ORIENTATION),
    "octupole": TargetSpec(_octupole, _rigid_flow, **_ORIENTATION),
    "dipoles": TargetSpec(_target("RigidDipoles", "bodies"), _rigid_flow, **_ORIENTATION),
}
"""`TARGET` name -> [`TargetSpec`][flowkit.cli.targets.TargetSpec], in the order of `flowkit boltzmann --help`."""
