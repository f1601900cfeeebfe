"""Flow proposals (IMH) against flow reparametrisation (NeuTra MALA) in MCMC (Grenioux et al., ICML 2023).

Two studies, each flow a `RealNVP` fitted by maximum likelihood to exact samples of its target with `fit`:

- **bimodal**: `BimodalGaussian(d, separation, weight=2/3)`; IMH chains from the flow and NeuTra chains
  started in the +mode; the estimate of the +mode weight (mean over chains of each chain's fraction of states
  on the +side) with its standard error over chains, and how many SE it is from 2/3;
- **funnel**: `NealFunnel(d)`; ESS of the neck coordinate `v` per target evaluation (one energy per IMH step,
  one energy and gradient per MALA step), NeuTra at each of `--step-sizes`, its best one reported.

    python bench/mcmc_proposals.py --dims 2,4,8,16 --funnel-dims 4,8,16,32 --threads 1

(the defaults; about 4 minutes at one thread). Prints Markdown tables and writes JSON with `--out`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import torch

from flowkit.applications.mcmc_proposals import chain_mean, ess_per_evaluation
from flowkit.flows import RealNVP
from flowkit.sampling import independent_metropolis, neutra_mala
from flowkit.targets import BimodalGaussian, NealFunnel
from flowkit.train import MaximumLikelihood, fit


def fitted_flow(target: Any, dim: int, steps: int, n_train: int, seed: int) -> RealNVP:
    """A RealNVP fitted by maximum likelihood to `n_train` exact samples of `target`."""
    torch.manual_seed(seed)
    x = target.sample(n_train, generator=torch.Generator().manual_seed(seed + 1)).float()
    flow = RealNVP(dim, transforms=6, hidden=(64, 64))
    fit(flow, MaximumLikelihood(), x, steps=steps, batch_size=256, lr=3e-3, progress=False, seed=seed)
    return flow


def bimodal_row(dim: int, args: argparse.Namespace) -> dict[str, Any]:
    target = BimodalGaussian(dim, args.separation, 2 / 3)
    start = time.perf_counter()
    flow = fitted_flow(target, dim, args.steps, args.n_train, args.seed)
    generator = torch.Generator().manual_seed(args.seed + 2)
    imh = independent_metropolis(flow, target, args.chain_steps, chains=args.chains, generator=generator)
    w_imh, se_imh = chain_mean(target.mode_of(imh.samples).double(), burn_in=args.burn_in)
    plus = torch.randn(args.chains, dim, generator=generator) + args.separation / math.sqrt(dim)
    with torch.no_grad():
        z0 = flow.bijector.forward(plus)[0]
    neutra = neutra_mala(flow, target, args.chain_steps, z0=z0, step_size=args.neutra_step, generator=generator)
    w_neutra, se_neutra = chain_mean(target.mode_of(neutra.samples).double(), burn_in=args.burn_in)
    return {
        "dim": dim,
        "separation": args.separation,
        "imh_weight": w_imh,
        "imh_se": se_imh,
        "imh_z": (w_imh - 2 / 3) / max(se_imh, 1e-12),
        "imh_acceptance": imh.mean_acceptance,
        "neutra_weight": w_neutra,
        "neutra_se": se_neutra,
        "neutra_z": (w_neutra - 2 / 3) / max(se_neutra, 1e-12),
        "neutra_acceptance": neutra.mean_acceptance,
        "seconds": time.perf_counter() - start,
    }


def funnel_row(dim: int, args: argparse.Namespace) -> dict[str, Any]:
    target = NealFunnel(dim)
    start = time.perf_counter()
    flow = fitted_flow(target, dim, args.steps, args.n_train, args.seed)
    generator = torch.Generator().manual_seed(args.seed + 2)
    imh = independent_metropolis(flow, target, args.chain_steps, chains=args.chains, generator=generator)
    ess_imh = ess_per_evaluation(imh.samples[..., 0], 1.0, burn_in=args.burn_in)
    neutra = []
    for eps in args.step_sizes:
        with torch.no_grad():
            z0 = flow.base.sample((args.chains,))
        run = neutra_mala(flow, target, args.chain_steps, z0=z0, step_size=eps, generator=generator)
        neutra.append((ess_per_evaluation(run.samples[..., 0], 1.0, burn_in=args.burn_in), eps, run.mean_acceptance))
    best = max(neutra)
    return {
        "dim": dim,
        "imh_ess_per_evaluation": ess_imh,
        "imh_acceptance": imh.mean_acceptance,
        "neutra_ess_per_evaluation": best[0],
        "neutra_step_size": best[1],
        "neutra_acceptance": best[2],
        "neutra_beats_imh": best[0] > ess_imh,
        "seconds": time.perf_counter() - start,
    }


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=_ints, default=[2, 4, 8, 16], help="bimodal dimensions")
    parser.add_argument("--funnel-dims", type=_ints, default=[4, 8, 16, 32], help="funnel dimensions")
    parser.add_argument("--separation", type=float, default=4.0, help="distance of each mode from 0")
    parser.add_argument("--steps", type=int, default=300, help="fit steps of each flow")
    parser.add_argument("--n-train", type=int, default=5000, help="exact samples each flow is fitted to")
    parser.add_argument("--chains", type=int, default=32)
    parser.add_argument("--chain-steps", type=int, default=1000)
    parser.add_argument("--burn-in", type=int, default=100)
    parser.add_argument("--neutra-step", type=float, default=0.5, help="NeuTra's Langevin step (bimodal)")
    parser.add_argument("--step-sizes", type=lambda s: [float(t) for t in s.split(",")], default=[0.2, 0.5, 1.0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bimodal = [bimodal_row(d, args) for d in args.dims]
    print("| d | IMH weight (SE) | IMH z | NeuTra weight (SE) | NeuTra z | acc IMH / NeuTra |")
    print("|---|---|---|---|---|---|")
    for r in bimodal:
        print(
            f"| {r['dim']} | {r['imh_weight']:.3f} ({r['imh_se']:.3f}) | {r['imh_z']:+.1f} | "
            f"{r['neutra_weight']:.3f} ({r['neutra_se']:.3f}) | {r['neutra_z']:+.1f} | "
            f"{r['imh_acceptance']:.2f} / {r['neutra_acceptance']:.2f} |"
        )
    funnel = [funnel_row(d, args) for d in args.funnel_dims]
    print("\n| d | IMH ESS/eval (acc) | NeuTra ESS/eval (step, acc) | NeuTra ahead |")
    print("|---|---|---|---|")
    for r in funnel:
        print(
            f"| {r['dim']} | {r['imh_ess_per_evaluation']:.4f} ({r['imh_acceptance']:.2f}) | "
            f"{r['neutra_ess_per_evaluation']:.4f} ({r['neutra_step_size']:g}, {r['neutra_acceptance']:.2f}) | "
            f"{r['neutra_beats_imh']} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"threads": args.threads, "args": vars(args), "bimodal": bimodal, "funnel": funnel}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
