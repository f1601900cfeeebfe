"""Flow proposals (IMH) against flow reparametrisation (NeuTra MALA) in MCMC, in Grenioux et al.'s setting (ICML 2023).

Two studies, set up as in the paper's Section 4 (and its code's configurations):

- **funnel** (the paper's imperfect flows): `NealFunnel(d, scale=sqrt(3))` (their funnel, Var v = 3) and the
  exact transport `FunnelTransport(d, beta)` off by a factor `beta^(-1/2)` in the mouth's widths, `beta` on the
  paper's grid `logspace(-1, 1, 12)` plus the exact map `beta = 1`. IMH proposes from the flow; NeuTra runs MALA
  in latent space, its step size adapted during a warm-up towards an acceptance of 0.75 (the paper's MALA target;
  times or over 1.25 every 10 steps), then fixed. Chains start at flow samples. Reported: the ESS of `v` per
  chain step, pooled over chains (automatic-window autocorrelation time). The cost of a step differs: IMH spends
  one target energy and one flow sample with its density; NeuTra one target energy *and gradient* plus one flow
  inverse with its backward pass, so "ESS per target evaluation" is ESS per step for both, and NeuTra's is also
  its ESS per gradient evaluation (IMH needs none). ESS per second is printed too (NeuTra's warm-up excluded).
- **bimodal**: `BimodalGaussian(d, separation, weight=2/3)`. By default the separation grows with `d` as in the
  paper's mixture, each mode `0.591 sqrt(2 log d)` from the origin in every coordinate (`separation = 0.591
  sqrt(2 d log d)`); `--separation 4` gives the fixed setting of the previous study. `--mixture paper4` (or `both`,
  the default) also runs the mixture of the paper's figure (their `gaussian_mixture.py`): four unit Gaussians of
  weight 1/4 at `(+-a 1_{d/2}, +-a 1_{d/2})`, `a = 0.591 sqrt(2 log d)`. The flow follows their code: a RealNVP of
  `2 int(4 + (d - 16) / 60)` couplings on contiguous halves (`--masks`), one hidden layer of `int(51.2 + 0.8 d)`
  units, log-scales bounded by `2 / couplings` (tanh), over a fixed Gaussian with the target's mean and standard
  deviation; fitted by maximum likelihood (their forward KL) with Adam (lr log-linear in `d`, 1e-2 at d = 16;
  weight decay 1e-4; times 0.99 every `int(100 + (d - 16) / 2.4)` steps) and stopped at their early checkpoint,
  5% of their budget (`--checkpoint-fraction`; 2,383 to 2,633 steps at d = 2 to 32; batch 2048 from 65,536 exact
  samples here against their 8192 fresh ones). Chains: the paper's length (700 steps up to d = 16, 900 at 32), 32
  of them; IMH from the flow; NeuTra started in the +mode (in (+, +) for four modes) from the paper's first
  step 0.01, adapted as above. Reported: the estimate of the +side's probability (each chain's fraction of states
  with a positive coordinate sum, averaged over chains; for four modes each nearest-mode fraction) with its
  standard error over chains, how many SE it is from the exact value (`2/3 Phi(a) + 1/3 Phi(-a)`, `a` the offset;
  1/4 for each of the four modes), the fraction of NeuTra chains that ever left their mode, and the latent
  pullback's bimodality: its energy barrier along the segment between two modes' preimages (nats above the higher
  end) and their latent distance.

    python bench/mcmc_proposals.py --threads 1

(the defaults: funnel d = 4, 8, 16, 32, 64, 128, bimodal d = 2, 4, 8, 16; several minutes at one thread each).
Prints Markdown tables and writes JSON with `--out`.

Measured (busy 2-core machine, 1 thread, defaults, seed 0; the full tables are on `docs/api/applications.md`):

- funnel: NeuTra's ESS of `v` per step beats IMH's for 5 of the 13 flows at d = 4 (all beta >= 1.87), 8 at d = 8,
  10 at d = 16 and 32 (all but beta = 0.81, 1, 1.23) and 11 at d = 64 and 128 (all but 0.81, 1); at d = 16,
  beta = 0.1: 0.023 against 0.007, beta = 2.85: 0.53 against 0.020; the exact map: IMH 1.01 against 0.17;
- bimodal with the paper's flow recipe (busy machine, `--skip funnel`, seed 0): IMH within 1.9 SE of the exact side
  probability at every d = 2 to 16; NeuTra started in the +mode within 1.7 SE, every chain crossing, though the
  latent pullback keeps a wall (9.4 nats on the segment at d = 16) that MALA's step (0.87) jumps; on the paper's
  four modes (`--mixture paper4 --dims 2,4,8,16,32,64`) IMH within 2.3 SE of 1/4 for every mode and NeuTra within
  2.1 SE, 97 to 100% of its chains leaving (+, +) (walls of 5.7, 13.3 and 31.5 nats at d = 16, 32, 64): the
  paper's claim that NeuTra stays in its mode does not reproduce, even with their early checkpoint.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from statistics import NormalDist
from typing import Any

import torch
from torch import Tensor

from flowkit.applications.mcmc_proposals import FunnelTransport, adapted_neutra_mala, chain_mean, ess_per_evaluation
from flowkit.bijectors import Chain, Coupling
from flowkit.distributions import DiagNormal, StandardNormal
from flowkit.flows import Flow, RealNVP
from flowkit.sampling import independent_metropolis
from flowkit.targets import BimodalGaussian, GaussianMixture, NealFunnel
from flowkit.train import MaximumLikelihood, fit
from flowkit.transformers import Affine


def paper_separation(dim: int) -> float:
    """The paper's mode offset: `0.591 sqrt(2 log d)` in every coordinate, so `0.591 sqrt(2 d log d)` from 0."""
    return 0.591 * math.sqrt(2 * dim * math.log(max(dim, 2)))


def funnel_row(dim: int, beta: float, args: argparse.Namespace) -> dict[str, Any]:
    target = NealFunnel(dim, scale=math.sqrt(3.0))
    flow = Flow(FunnelTransport(dim, math.sqrt(3.0), beta), StandardNormal(dim))
    generator = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    imh = independent_metropolis(flow, target, args.chain_steps, chains=args.chains, generator=generator)
    with torch.no_grad():
        z0 = flow.base.sample((args.chains,))
    neutra, eps, diverged = adapted_neutra_mala(flow, target, args.chain_steps, z0, args.warmup, generator=generator)
    ess_imh = ess_per_evaluation(imh.samples[..., 0], 1.0, burn_in=args.burn_in)
    ess_neutra = ess_per_evaluation(neutra.samples[..., 0], 1.0, burn_in=args.burn_in)
    kept = args.chain_steps - args.burn_in
    return {
        "dim": dim,
        "beta": beta,
        "imh_ess_per_step": ess_imh,
        "imh_ess_per_second": ess_imh * kept * args.chains / imh.seconds,
        "imh_acceptance": imh.mean_acceptance,
        "neutra_ess_per_step": ess_neutra,
        "neutra_ess_per_second": ess_neutra * kept * args.chains / neutra.seconds,
        "neutra_step_size": eps,
        "neutra_acceptance": neutra.mean_acceptance,
        "neutra_warmup_diverged": diverged,
        "neutra_beats_imh": ess_neutra > ess_imh,
    }


def paper_schedule(dim: int) -> dict[str, float]:
    """The paper's flow recipe for their Gaussian mixture at `dim` (linear rules anchored at d = 16 and 256).

    `blocks` RealNVP blocks of two couplings, one hidden layer of `hidden` units, Adam at `lr` (log-linear in `d`)
    decayed by 0.99 every `patience` steps, `total` steps in all; the figure used their second checkpoint, saved
    after 5% of `total`.
    """
    line = lambda lo, hi: lo + (hi - lo) * (dim - 16) / 240  # noqa: E731
    return {
        "blocks": int(line(4, 8)),
        "hidden": int(line(64, 256)),
        "lr": math.exp(line(math.log(1e-2), math.log(1e-4))),
        "patience": int(line(100, 200)),
        "total": int(line(50000, 90000)),
    }


def paper_chain_steps(dim: int) -> int:
    """The paper's chain length for the mixture: 700 steps up to d = 16, then 200 more per doubling."""
    return 700 + 200 * max(0, math.ceil(math.log2(dim / 16)))


def fitted_realnvp(target: Any, dim: int, mean: float, std: float, args: argparse.Namespace) -> tuple[Flow, int]:
    """The paper's RealNVP for `dim`, fitted by maximum likelihood (their forward KL) to exact samples of `target`.

    As in their code: couplings on contiguous halves of the coordinates (`--masks halves`; flowkit's
    `RealNVP` alternates even and odd ones, `--masks alternate`) with log-scales bounded by `2 / couplings`
    (tanh), one hidden layer, a fixed
    Gaussian base with the target's mean and per-coordinate standard deviation (`mean`, `std`), Adam with weight
    decay 1e-4 and a step decay; trained for `--steps`, by default their early checkpoint (`--checkpoint-fraction`
    of their budget). Returns the flow and its number of training steps.
    """
    recipe = paper_schedule(dim)
    steps = args.steps if args.steps is not None else max(1, int(args.checkpoint_fraction * recipe["total"]))
    lr = recipe["lr"] if args.lr is None else args.lr
    couplings = 2 * int(recipe["blocks"])
    width = (int(recipe["hidden"]),)
    base = DiagNormal(dim, loc=mean, scale=std, trainable=False)
    torch.manual_seed(args.seed)
    if args.masks == "halves":  # the paper's: the first half, then the second, transformed in turn
        half = [1] * (dim // 2) + [0] * (dim - dim // 2)
        layers = [
            Coupling(Affine(clamp=2 / couplings), dim, half if i % 2 == 0 else [1 - m for m in half], hidden=width)
            for i in range(couplings)
        ]
        flow = Flow(Chain(*layers), base)
    else:
        flow = RealNVP(dim, couplings, hidden=width, transformer=Affine(clamp=2 / couplings), base=base)
    x = target.sample(args.n_train, generator=torch.Generator().manual_seed(args.seed + 1)).float()
    patience = int(recipe["patience"])
    fit(
        flow,
        MaximumLikelihood(),
        x,
        steps=steps,
        batch_size=args.batch_size,
        lr=lr,
        optimizer=lambda params, lr: torch.optim.Adam(params, lr=lr, weight_decay=1e-4),
        schedule=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=patience, gamma=0.99),
        progress=False,
        seed=args.seed,
    )
    return flow, steps


def latent_barrier(flow: Flow, target: Any, start: Tensor, end: Tensor, points: int = 201) -> tuple[float, float]:
    r"""The latent pullback's bimodality: its energy barrier between two modes' preimages, and their distance.

    Along the segment from $z_0 = T^{-1}(\mu_0)$ to $z_1 = T^{-1}(\mu_1)$ (the modes' centres `start`, `end`), the
    highest latent energy $\tilde u(z) = u(T(z)) - \log|\det T'(z)|$ minus the higher of its two ends (nats; the
    target's own barrier for the identity map, 0 when the pullback has one mode on that segment), and
    $|z_1 - z_0|$.
    """
    with torch.no_grad():
        ends = flow.bijector.forward(torch.stack([start, end]).float())[0]
        t = torch.linspace(0, 1, points).unsqueeze(-1)
        z = ends[0] + t * (ends[1] - ends[0])
        x, log_det = flow.bijector.inverse(z)
        energy = target.energy(x.double()).float() - log_det
    barrier = float(energy.max() - torch.maximum(energy[0], energy[-1]))
    return barrier, float((ends[1] - ends[0]).norm())


def paper_four_modes(dim: int) -> GaussianMixture:
    """The paper's figure's mixture: four unit Gaussians, equal weights, at `(+-a, ..., +-a)` by halves.

    The means are `a (s_1 1_{d/2}, s_2 1_{d - d/2})` for the four signs `(s_1, s_2)`, `a = 0.591 sqrt(2 log d)`:
    the two halves are independent, each a symmetric two-mode mixture.
    """
    a = 0.591 * math.sqrt(2 * math.log(max(dim, 2)))
    target = GaussianMixture(4, dim, scale=1.0)
    half = dim // 2
    means = torch.full((4, dim), a)
    means[0, :half] *= -1  # (-, +)
    means[2] *= -1  # (-, -)
    means[3, half:] *= -1  # (+, -)
    target.means = means  # mode 1 is (+, +)
    return target


def four_modes_row(dim: int, args: argparse.Namespace) -> dict[str, Any]:
    """IMH against NeuTra started in the (+, +) mode on the paper's four-mode mixture (each weight 1/4)."""
    target = paper_four_modes(dim)
    a = float(target.means[1, 0])
    start = time.perf_counter()
    flow, steps = fitted_realnvp(target, dim, 0.0, math.sqrt(1 + a * a), args)
    barrier, distance = latent_barrier(flow, target, target.means[1], target.means[3])
    n_steps = paper_chain_steps(dim) if args.chain_steps is None else args.chain_steps
    generator = torch.Generator().manual_seed(args.seed + 2)
    imh = independent_metropolis(flow, target, n_steps, chains=args.chains, generator=generator)
    plus = torch.randn(args.chains, dim, generator=generator) + target.means[1]
    with torch.no_grad():
        z0 = flow.bijector.forward(plus)[0]
    neutra, eps, _ = adapted_neutra_mala(
        flow, target, n_steps, z0, args.warmup, step_size=args.neutra_step, generator=generator
    )

    def nearest(x: Tensor) -> Tensor:
        return torch.cdist(x.float(), target.means.float()).argmin(-1)

    row: dict[str, Any] = {"dim": dim, "offset": a, "fit_steps": steps, "chain_steps": n_steps}
    row |= {"latent_barrier": barrier, "latent_distance": distance, "seconds": 0.0}
    for name, run in (("imh", imh), ("neutra", neutra)):
        mode = nearest(run.samples)
        fits = [chain_mean((mode == k).double(), burn_in=args.burn_in) for k in range(4)]
        row[f"{name}_weights"] = [w for w, _ in fits]
        row[f"{name}_se"] = [se for _, se in fits]
        row[f"{name}_max_z"] = max(abs(w - 0.25) / max(se, 1e-12) for w, se in fits)
        row[f"{name}_acceptance"] = run.mean_acceptance
    row["neutra_step_size"] = eps
    row["neutra_chains_that_crossed"] = float((nearest(neutra.samples[args.burn_in :]) != 1).any(0).double().mean())
    row["seconds"] = time.perf_counter() - start
    return row


def bimodal_row(dim: int, args: argparse.Namespace) -> dict[str, Any]:
    separation = paper_separation(dim) if args.separation is None else args.separation
    target = BimodalGaussian(dim, separation, 2 / 3)
    start = time.perf_counter()
    offset = separation / math.sqrt(dim)
    mean = (2 * target.weight - 1) * offset
    flow, steps = fitted_realnvp(target, dim, mean, math.sqrt(1 + offset**2 - mean**2), args)
    barrier, distance = latent_barrier(flow, target, torch.full((dim,), offset), torch.full((dim,), -offset))
    n_steps = paper_chain_steps(dim) if args.chain_steps is None else args.chain_steps
    generator = torch.Generator().manual_seed(args.seed + 2)
    imh = independent_metropolis(flow, target, n_steps, chains=args.chains, generator=generator)
    w_imh, se_imh = chain_mean(target.mode_of(imh.samples).double(), burn_in=args.burn_in)
    plus = torch.randn(args.chains, dim, generator=generator) + separation / math.sqrt(dim)
    with torch.no_grad():
        z0 = flow.bijector.forward(plus)[0]
    neutra, eps, _ = adapted_neutra_mala(
        flow, target, n_steps, z0, args.warmup, step_size=args.neutra_step, generator=generator
    )
    w_neutra, se_neutra = chain_mean(target.mode_of(neutra.samples).double(), burn_in=args.burn_in)
    crossed = target.mode_of(neutra.samples[args.burn_in :]).logical_not().any(0).double().mean()
    # The +side's probability: sum(x) / sqrt(d) is N(+-separation, 1) in each mode (2/3 up to the overlap).
    side = 2 / 3 * NormalDist().cdf(separation) + 1 / 3 * NormalDist().cdf(-separation)
    return {
        "dim": dim,
        "separation": separation,
        "fit_steps": steps,
        "latent_barrier": barrier,
        "latent_distance": distance,
        "chain_steps": n_steps,
        "side_probability": side,
        "imh_weight": w_imh,
        "imh_se": se_imh,
        "imh_z": (w_imh - side) / max(se_imh, 1e-12),
        "imh_acceptance": imh.mean_acceptance,
        "neutra_weight": w_neutra,
        "neutra_se": se_neutra,
        "neutra_z": (w_neutra - side) / max(se_neutra, 1e-12),
        "neutra_acceptance": neutra.mean_acceptance,
        "neutra_step_size": eps,
        "neutra_chains_that_crossed": float(crossed),
        "seconds": time.perf_counter() - start,
    }


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t]


def _floats(text: str) -> list[float]:
    return [float(t) for t in text.split(",") if t]


def main(argv: list[str] | None = None) -> int:
    paper_betas = [round(10 ** (-1 + 2 * i / 11), 4) for i in range(12)]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--funnel-dims", type=_ints, default=[4, 8, 16, 32, 64, 128])
    parser.add_argument("--betas", type=_floats, default=sorted(paper_betas + [1.0]), help="flow qualities")
    parser.add_argument("--dims", type=_ints, default=[2, 4, 8, 16], help="bimodal dimensions")
    parser.add_argument("--separation", type=float, default=None, help="fixed mode offset (default: the paper's)")
    parser.add_argument("--steps", type=int, default=None, help="fit steps of each RealNVP (default: see below)")
    parser.add_argument(
        "--checkpoint-fraction", type=float, default=0.05, help="without --steps: this share of the paper's budget"
    )
    parser.add_argument("--lr", type=float, default=None, help="the RealNVP's learning rate (default: the paper's)")
    parser.add_argument("--batch-size", type=int, default=2048, help="the RealNVP's batch (the paper's: 8192)")
    parser.add_argument("--n-train", type=int, default=65536, help="exact samples each RealNVP is fitted to")
    parser.add_argument("--neutra-step", type=float, default=0.01, help="bimodal NeuTra's first step (the paper's)")
    parser.add_argument("--chains", type=int, default=32)
    parser.add_argument(
        "--chain-steps", type=int, default=None, help="kept steps per chain (default: funnel 1000, bimodal the paper's)"
    )
    parser.add_argument("--burn-in", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=200, help="NeuTra's step-size adaptation steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip", choices=["funnel", "bimodal"], default=None)
    parser.add_argument(
        "--masks", choices=["halves", "alternate"], default="halves", help="coupling masks (the paper's: halves)"
    )
    parser.add_argument(
        "--mixture",
        choices=["bimodal", "paper4", "both"],
        default="both",
        help="the issue's two modes (2/3, 1/3), the paper's figure's four modes, or both",
    )
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    funnel, bimodal, four = [], [], []
    if args.skip != "funnel":
        funnel_args = argparse.Namespace(**{**vars(args), "chain_steps": args.chain_steps or 1000})
        funnel = [funnel_row(d, b, funnel_args) for d in args.funnel_dims for b in args.betas]
        print("| d | beta | IMH ESS/step (acc) | NeuTra ESS/step (step, acc) | ESS/s IMH / NeuTra | NeuTra ahead |")
        print("|---|---|---|---|---|---|")
        for r in funnel:
            print(
                f"| {r['dim']} | {r['beta']:.3g} | {r['imh_ess_per_step']:.4f} ({r['imh_acceptance']:.2f}) | "
                f"{r['neutra_ess_per_step']:.4f} ({r['neutra_step_size']:.2f}, {r['neutra_acceptance']:.2f}) | "
                f"{r['imh_ess_per_second']:.3g} / {r['neutra_ess_per_second']:.3g} | {r['neutra_beats_imh']} |"
            )
        print("\n| d | betas where NeuTra's ESS per step beats IMH's |")
        print("|---|---|")
        for d in args.funnel_dims:
            wins = [r for r in funnel if r["dim"] == d and r["neutra_beats_imh"]]
            names = ", ".join(f"{r['beta']:.3g}" for r in wins)
            print(f"| {d} | {len(wins)} of {len(args.betas)}: {names} |")
    if args.skip != "bimodal":
        bimodal = [bimodal_row(d, args) for d in args.dims] if args.mixture != "paper4" else []
    if bimodal:
        print(
            "\n| d | offset | fit steps | latent barrier (nats), distance | exact | IMH (SE) | IMH z | NeuTra (SE) "
            "| NeuTra z | NeuTra chains crossed | acc |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in bimodal:
            print(
                f"| {r['dim']} | {r['separation']:.2f} | {r['fit_steps']} | "
                f"{r['latent_barrier']:.1f}, {r['latent_distance']:.1f} | {r['side_probability']:.3f} | "
                f"{r['imh_weight']:.3f} ({r['imh_se']:.3f}) | "
                f"{r['imh_z']:+.1f} | {r['neutra_weight']:.3f} ({r['neutra_se']:.3f}) | {r['neutra_z']:+.1f} | "
                f"{r['neutra_chains_that_crossed']:.2f} | {r['imh_acceptance']:.2f} / {r['neutra_acceptance']:.2f} |"
            )
    if args.skip != "bimodal" and args.mixture != "bimodal":
        four = [four_modes_row(d, args) for d in args.dims]
        print(
            "\n| d | offset | fit steps | latent barrier (nats), distance | IMH weights (SE) | IMH max z "
            "| NeuTra from (+,+): weights (SE) | NeuTra max z | NeuTra chains crossed | acc |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in four:
            cells = {
                k: ", ".join(f"{w:.2f} ({e:.2f})" for w, e in zip(r[f"{k}_weights"], r[f"{k}_se"], strict=True))
                for k in ("imh", "neutra")
            }
            print(
                f"| {r['dim']} | {r['offset']:.2f} | {r['fit_steps']} | {r['latent_barrier']:.1f}, "
                f"{r['latent_distance']:.1f} | {cells['imh']} | {r['imh_max_z']:.1f} | {cells['neutra']} | "
                f"{r['neutra_max_z']:.1f} | {r['neutra_chains_that_crossed']:.2f} | "
                f"{r['imh_acceptance']:.2f} / {r['neutra_acceptance']:.2f} |"
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"threads": args.threads, "args": vars(args), "bimodal": bimodal, "four_modes": four, "funnel": funnel},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
