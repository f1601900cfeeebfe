"""Yukawa model with two flavours of staggered fermions: flow IMH against pseudofermion HMC, with costs.

At one (L, m2, lam, g) point this script

- runs the baselines on the scalar field: pseudofermion HMC (heat-bath pseudofermions every trajectory,
  conjugate gradient to `--cg-tol`) and HMC on the exact-determinant action (dense LU; L <= 16);
- trains a `LatticeFlow` (checkerboard affine couplings, circular conv nets, Z2-symmetric) on the exact
  action `S_B - log det(D D^dagger)` by reverse KL with fast path gradients;
- runs flow IMH, and reports the observables (|M|, phi^2, chi_2 with blocked-jackknife errors; the chiral
  condensate |Sigma| and the fermion correlator from D^-1), the ESS, the acceptance, tau_int and the CPU seconds
  per effective sample of |M| and chi_2, as `bench/lattice.py` does for phi^4, with the deviation of the
  flow's values from the pseudofermion-HMC reference in standard errors.

Couplings: the phi^4 part is flowkit's parametrisation (`Phi4`), default m2 = -4, lam = 8 (the phi^4
tutorial point of `bench/lattice.py`) with g = 0.6, where the determinant more than doubles chi_2 against
the bosonic theory. The exact coupling table of Albergo et al. (2021) was not available offline when this was
written; pass `--m2 --lam --g` to run their point. Costs are process CPU seconds with one torch thread on a
shared machine (other jobs compete; wall time is longer). Run:

    python bench/fermions.py --L 8 --steps 3000 --out bench/results/fermions_L8.json
    python bench/fermions.py --L 16 --steps 300 --hmc-steps 300 --out bench/results/fermions_L16.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from lattice import _report, _tune_hmc  # bench/lattice.py: the phi^4 report, reused as is

import flowkit
from flowkit import lattice, sampling
from flowkit.flows import LatticeFlow
from flowkit.targets import YukawaStaggered
from flowkit.train import BoltzmannGenerator, fit


def _cpu() -> float:
    return time.process_time()


def _fermions(samples: torch.Tensor, target: YukawaStaggered, blocks: int, thin: int) -> dict:
    """|Sigma| and C_f(t) with errors, from every `thin`-th configuration of a chain `(n, chains, L, L)`."""
    obs = lattice.measure_fermions(samples[::thin], target.dirac, blocks=blocks)
    return {
        "abs_chiral_condensate": [float(v) for v in obs["abs_chiral_condensate"]],
        "fermion_correlator": [obs["fermion_correlator"][0].tolist(), obs["fermion_correlator"][1].tolist()],
    }


def _sigma(a: list, b: list) -> float:
    """(a - b) in combined standard errors."""
    return (a[0] - b[0]) / math.hypot(a[1], b[1])


def run_point(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    target = YukawaStaggered(args.L, args.m2, args.lam, args.g, cg_tol=args.cg_tol).double()
    result: dict = {
        "L": args.L,
        "m2": args.m2,
        "lam": args.lam,
        "g": args.g,
        "fermions": "2 flavours of massless staggered fermions, antiperiodic in time: weight det(D D^dagger)",
        "cg_tol": args.cg_tol,
        "flow": {"transforms": args.transforms, "hidden": args.hidden, "kernel": 3, "z2": True},
        "training": {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "estimator": "fast"},
        "machine": "shared 2-core CPU (several concurrent jobs), 1 torch thread; costs are process CPU seconds",
        "flowkit": flowkit.__version__,
    }
    x0 = torch.zeros(args.hmc_chains, args.L, args.L, dtype=torch.float64)
    start_x = x0 + 0.1 * torch.randn_like(x0)
    eps, n_lf = _tune_hmc(target, start_x, args.seed, args.pilot)
    total = args.hmc_steps + args.burn_in

    # ---- the reference: pseudofermion HMC
    start = _cpu()
    pf = sampling.pseudofermion_hmc(target, x0, total, eps, n_lf, generator=torch.Generator().manual_seed(args.seed))
    pf_seconds = (_cpu() - start) * args.hmc_steps / total
    kept = pf.samples[args.burn_in :]
    result["pf_hmc"] = _report("pf_hmc", kept, pf_seconds, 0.0, args.blocks)
    result["pf_hmc"].update({"step_size": eps, "n_leapfrog": n_lf, "acceptance": pf.mean_acceptance})
    result["pf_hmc"].update(_fermions(kept, target, args.blocks, args.thin))
    print(json.dumps({k: result["pf_hmc"][k] for k in ("abs_M", "phi2", "chi2", "acceptance")}), flush=True)

    # ---- HMC on the exact-determinant action
    start = _cpu()
    ex = sampling.hmc(target, x0, total, eps, n_lf, generator=torch.Generator().manual_seed(args.seed + 1))
    ex_seconds = (_cpu() - start) * args.hmc_steps / total
    result["exact_hmc"] = _report("exact_hmc", ex.samples[args.burn_in :], ex_seconds, 0.0, args.blocks)
    result["exact_hmc"]["acceptance"] = ex.mean_acceptance
    print(json.dumps({k: result["exact_hmc"][k] for k in ("abs_M", "phi2", "chi2", "acceptance")}), flush=True)

    # ---- train the flow on the exact action
    flow = LatticeFlow(args.L, args.transforms, tuple(args.hidden), z2=True)
    start, wall = _cpu(), time.perf_counter()
    history = fit(
        flow,
        BoltzmannGenerator(target.float(), estimator="fast"),
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        clip=10.0,
        progress=False,
        seed=args.seed,
    )
    train_seconds = _cpu() - start
    result["training"].update(
        {
            "cpu_seconds": round(train_seconds, 1),
            "wall_seconds": round(time.perf_counter() - wall, 1),
            "skipped_steps": len(history.skipped),
        }
    )
    flow.eval()
    print(f"trained in {train_seconds:.0f} CPU s", flush=True)
    target = target.float()

    # ---- importance sampling and flow IMH
    _, log_w = sampling.importance_sample(flow, target, args.eval_samples, batch_size=2048)
    result["importance_sampling"] = {"ess": sampling.ess(log_w)}
    start = _cpu()
    imh = sampling.independent_metropolis(flow, target, args.imh_steps, generator=torch.Generator().manual_seed(2))
    imh_seconds = _cpu() - start
    result["imh"] = _report("imh", imh.samples, imh_seconds, train_seconds, args.blocks)
    result["imh"]["acceptance"] = imh.mean_acceptance
    result["imh"].update(_fermions(imh.samples.double(), target.double(), args.blocks, args.thin))
    for key in ("abs_M", "phi2", "chi2", "abs_chiral_condensate"):
        result["imh"][f"{key}_vs_pf_hmc_sigma"] = _sigma(result["imh"][key], result["pf_hmc"][key])
    result["exact_hmc"]["chi2_vs_pf_hmc_sigma"] = _sigma(result["exact_hmc"]["chi2"], result["pf_hmc"]["chi2"])
    for key in ("abs_M", "chi2"):
        ref = result["pf_hmc"][f"cpu_s_per_eff_sample_{key}"]
        result["imh"][f"cost_ratio_{key}_vs_pf_hmc"] = result["imh"][f"cpu_s_per_eff_sample_{key}"] / ref
        result["imh"][f"cost_ratio_{key}_with_training_vs_pf_hmc"] = (
            result["imh"][f"cpu_s_per_eff_sample_{key}_with_training"] / ref
        )
    return result


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--L", type=int, default=8)
    p.add_argument("--m2", type=float, default=-4.0)
    p.add_argument("--lam", type=float, default=8.0)
    p.add_argument("--g", type=float, default=0.6)
    p.add_argument("--cg-tol", type=float, default=1e-10)
    p.add_argument("--transforms", type=int, default=16)
    p.add_argument("--hidden", type=int, nargs="+", default=[8, 8])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-samples", type=int, default=20_000)
    p.add_argument("--imh-steps", type=int, default=20_000)
    p.add_argument("--hmc-chains", type=int, default=16)
    p.add_argument("--hmc-steps", type=int, default=2000)
    p.add_argument("--burn-in", type=int, default=200)
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--thin", type=int, default=10, help="fermion observables on every thin-th configuration")
    p.add_argument("--pilot", type=int, default=20, help="trajectories of each step-size pilot run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON output path")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    torch.set_num_threads(1)
    args = parse(argv)
    result = run_point(args)
    result["command"] = "python bench/fermions.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
