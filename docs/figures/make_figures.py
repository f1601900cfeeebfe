"""Make the figures of the documentation with flowkit's own plotting functions, from small runs.

    PYTHONPATH=. python docs/figures/make_figures.py            # all figures, a few minutes on one CPU thread
    PYTHONPATH=. python docs/figures/make_figures.py density    # only some: density lattice alanine benchmarks

Writes small PNGs beside this file; the pages that show them say which run made them. The benchmark charts
are drawn from the numbers measured by `bench/speed.py` and `bench/likelihood.py` (copied below from the
benchmarks page, where the commands and the machine are stated).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import flowkit  # noqa: E402
from flowkit import plot  # noqa: E402

HERE = Path(__file__).resolve().parent
DPI = 80


def save(figure: plt.Figure, name: str) -> None:
    """Write one figure as a small PNG beside this script."""
    figure.savefig(HERE / name, dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    print(f"wrote {name} ({(HERE / name).stat().st_size // 1024} KiB)")


def density() -> None:
    """A neural spline flow fitted to the two-moons data: its density with the test points, its samples by the data."""
    from flowkit.train import MaximumLikelihood, fit

    data = flowkit.data.load("moons")
    flow = flowkit.flows.NSF(features=2, transforms=4, hidden=(64, 64))
    fit(flow, MaximumLikelihood(), data.train, steps=1500, val_data=data.val, standardize=True, progress=False, seed=0)
    nll = flowkit.data.evaluate_nll(flow, data.test)
    print(f"moons: NSF test NLL {nll.mean:.3f} +- {nll.two_se:.3f}")
    save(plot.density(flow, data.test, title=f"NSF on moons, test NLL {nll.mean:.2f}"), "density_moons.png")
    save(plot.samples_vs_data(flow, data.test, n=1000), "samples_moons.png")


def lattice() -> None:
    """Configurations of lattice phi^4 (L = 16, m^2 = -4, lambda = 8) from a short HMC run."""
    from flowkit import sampling
    from flowkit.targets import Phi4

    target = Phi4(16, -4.0, 8.0).double()
    start = 0.1 * torch.randn(4, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    run = sampling.hmc(target, start, 1000, 0.1, 10, generator=torch.Generator().manual_seed(0))
    print(f"lattice: HMC acceptance {float(run.acceptance.mean()):.2f}")
    save(plot.lattice_configurations(run.samples[-1], n=4, title="phi^4 at L = 16 (HMC)"), "lattice_phi4.png")


def alanine() -> None:
    """A short Boltzmann generator for alanine dipeptide at 1000 K: Ramachandran plots and F(phi)."""
    from flowkit.bijectors.internal import same_chirality
    from flowkit.flows import internal_coordinate_flow
    from flowkit.targets.alanine import ALANINE_CHIRAL_CENTRES, alanine_internal_coordinates, backbone_dihedrals
    from flowkit.train import BoltzmannGenerator, MaximumLikelihood, fit

    target = flowkit.targets.AlanineDipeptide(temperature=1000.0)
    frames = flowkit.data.alanine_dipeptide_md(1000.0, ns=2.0, seed=0)
    phi_md, psi_md = backbone_dihedrals(frames)
    internal = alanine_internal_coordinates(target.minimum())
    flow = internal_coordinate_flow(internal, blocks=2, hidden=(64, 64))
    fit(flow, MaximumLikelihood(), frames.float(), steps=1500, batch_size=256, lr=1e-3, clip=10.0, progress=False)
    fit(
        flow,
        BoltzmannGenerator(target, samples=frames.float(), w_kl=0.1),
        steps=40,
        batch_size=128,
        lr=2e-4,
        clip=10.0,
        progress=False,
    )
    with torch.no_grad():
        x, log_w = flowkit.sampling.importance_sample(flow, target, 10_000)
    keep = same_chirality(x.double(), internal.reference.double(), ALANINE_CHIRAL_CENTRES) & torch.isfinite(log_w)
    x, log_w = x[keep], log_w[keep]
    phi, psi = backbone_dihedrals(x)
    print(f"alanine: {len(frames)} MD frames (2 ns), reverse ESS {flowkit.sampling.ess(log_w):.4f}")
    save(
        plot.ramachandran(
            phi, psi, log_w, raw=True, reference=(phi_md, psi_md), titles=("flow (raw)", "flow (reweighted)", "MD")
        ),
        "ramachandran.png",
    )
    profiles = {
        "flow (reweighted)": flowkit.stats.free_energy_profile(phi, log_w, error="bootstrap", resamples=100),
        "flow (raw)": flowkit.stats.free_energy_profile(phi, error=None),
        "MD": flowkit.stats.free_energy_profile(phi_md, error="blocks", blocks=10),
    }
    save(plot.free_energy_profiles(profiles, title="free energy along phi"), "free_energy.png")


# Fastest peer's time / flowkit's per operation (NSF, 5 layers, K = 8, 2x128, batch 512, 2 threads; the
# fourth run of `python bench/speed.py --libraries flowkit zuko nflows normflows --styles matched default
# --no-memory`, from the benchmarks page).
SPEED_CONFIGS = ["coupling D=8", "autoregressive D=8", "coupling D=64", "autoregressive D=64"]
SPEED = {
    "matched": {
        "train": [2.16, 2.11, 2.40, 2.43],
        "log_prob": [2.63, 2.91, 2.92, 2.94],
        "sample": [2.32, 6.13, 3.10, 40.2],
    },
    "each peer's own NSF": {
        "train": [2.53, 2.30, 2.83, 2.30],
        "log_prob": [3.92, 2.85, 3.83, 3.29],
        "sample": [3.65, 6.29, 4.12, 32.2],
    },
}

# Test NLL, flowkit's NSF minus zuko's, paired by seed, with one standard error over the seeds (`python
# bench/likelihood.py --datasets 2d,small --models flowkit-nsf,zuko-nsf,nflows-nsf --steps 400 --threads 1`,
# autoregressive NSF, from the benchmarks page); below zero, flowkit's is the better density.
NLL_DIFFERENCE = {
    "moons": (-0.001, 0.001),
    "circles": (-0.005, 0.000),
    "checkerboard": (-0.018, 0.003),
    "8gaussians": (-0.008, 0.005),
    "pinwheel": (0.003, 0.007),
    "spirals": (0.040, 0.046),
    "rings": (-0.009, 0.003),
    "diabetes": (-0.15, 0.45),
    "wine": (0.04, 0.18),
    "breast_cancer": (-2.40, 0.69),
    "star98": (-0.23, 0.83),
    "macrodata": (-1.58, 0.24),
    "digits": (-0.69, 0.07),
}


def benchmarks() -> None:
    """Bar charts of the speed ratios against the peers and of the paired NLL differences with error bars."""
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    width = 0.25
    for ax, (style, table) in zip(axes, SPEED.items(), strict=True):
        for i, (operation, ratios) in enumerate(table.items()):
            ax.bar([c + (i - 1) * width for c in range(len(SPEED_CONFIGS))], ratios, width, label=operation)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(SPEED_CONFIGS)), [c.replace(" ", "\n") for c in SPEED_CONFIGS], fontsize=8)
        ax.set_title(f"peer construction: {style}", fontsize=10)
    axes[0].set_ylabel("fastest peer's time / flowkit's")
    axes[0].legend(fontsize=8)
    save(figure, "bench_speed.png")

    groups = {
        "2-D sets": list(NLL_DIFFERENCE)[:7],
        "tabular sets (scikit-learn, statsmodels)": list(NLL_DIFFERENCE)[7:],
    }
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.4), gridspec_kw={"width_ratios": [7, 6]})
    for ax, (title, names) in zip(axes, groups.items(), strict=True):
        values = [NLL_DIFFERENCE[n][0] for n in names]
        errors = [2 * NLL_DIFFERENCE[n][1] for n in names]
        ax.errorbar(range(len(names)), values, yerr=errors, fmt="o", capsize=3)
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("test NLL, flowkit - zuko (nats)")
    figure.suptitle(
        "NSF at equal budget, paired by seed, two standard errors; below 0: flowkit's density is better", fontsize=10
    )
    save(figure, "bench_nll.png")


FIGURES = {"density": density, "lattice": lattice, "alanine": alanine, "benchmarks": benchmarks}

if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for name in sys.argv[1:] or FIGURES:
        start = time.time()
        FIGURES[name]()
        print(f"{name}: {time.time() - start:.0f} s")
