"""Lattice phi^4: flow IMH, flow HMC and plain HMC at one (L, m2, lambda) point, with costs per effective sample.

Trains a `LatticeFlow` (checkerboard affine couplings, circular conv nets) by
reverse KL with fast path gradients, then runs

- IMH with the flow as proposal (acceptance, ESS, tau_int of |M| and chi_2);
- flow HMC (HMC in the flow's latent space);
- plain HMC on the field (jittered step size, batched chains): the long reference run;

and reports every observable with its blocked-jackknife error, chi_2 from the flow
chain against HMC's (in standard errors), and the CPU seconds per effective sample
of |M| and of chi_2 (sampling only, and with the training time added).

Costs are CPU seconds of this process (`time.process_time`, one torch thread);
on a shared machine wall time is longer. Run:

    python bench/lattice.py --L 8 --m2 -4 --lam 8 --steps 2500 --out bench/results/lattice_L8.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

import flowkit
from flowkit import io, lattice, sampling
from flowkit.flows import LatticeFlow
from flowkit.targets import Phi4
from flowkit.train import BoltzmannGenerator, fit


def _cpu() -> float:
    return time.process_time()


def _series(samples: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-configuration |M| and V M^2 (the chi_2 estimator), shape (n_steps, chains)."""
    m = lattice.magnetization(samples.double())
    V = samples.shape[-1] * samples.shape[-2]
    return {"abs_M": m.abs(), "chi2": V * m.square()}


def _report(name: str, samples: torch.Tensor, seconds: float, train_seconds: float, blocks: int) -> dict:
    """Observables with errors, tau_int and cost per effective sample of a chain `(n_steps, chains, L, L)`."""
    if samples.dim() == 3:
        samples = samples[:, None]
    obs = lattice.measure(samples, blocks=blocks)
    n = samples.shape[0] * samples.shape[1]
    out: dict = {"sampler": name, "samples": n, "chains": samples.shape[1], "cpu_seconds": round(seconds, 3)}
    for key in ("M", "abs_M", "phi2", "chi2", "pole_mass"):
        value, error = obs[key]
        out[key] = [float(value), float(error)]
    for key, series in _series(samples).items():
        tau = sampling.integrated_autocorrelation_time(series)
        ess = n / (2 * tau) if math.isfinite(tau) else 0.0
        out[f"tau_int_{key}"] = tau
        out[f"ess_{key}"] = ess
        out[f"cpu_s_per_eff_sample_{key}"] = seconds / ess if ess else math.inf
        out[f"cpu_s_per_eff_sample_{key}_with_training"] = (seconds + train_seconds) / ess if ess else math.inf
    return out


def _tune_hmc(energy, x0: torch.Tensor, seed: int, pilot: int) -> tuple[float, int]:
    """The largest step size (trajectory length about 1) with a pilot acceptance of at least 0.75."""
    chosen = (0.02, 50)
    for eps in (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5):
        n_lf = max(1, round(1.0 / eps))
        run = sampling.hmc(energy, x0, pilot, eps, n_lf, generator=torch.Generator().manual_seed(seed))
        if run.mean_acceptance >= 0.75:
            chosen = (eps, n_lf)
        else:
            break
    return chosen


def run_point(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    target = Phi4(args.L, args.m2, args.lam)
    result: dict = {
        "L": args.L,
        "m2": args.m2,
        "lam": args.lam,
        "kappa_lambda_hopping": list(target.hopping()),
        "flow": {"transforms": args.transforms, "hidden": args.hidden, "kernel": 3, "transformer": "affine"},
        "training": {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "estimator": "fast"},
        "machine": "shared 2-core CPU (up to 9 concurrent jobs), 1 torch thread; costs are process CPU seconds",
        "flowkit": flowkit.__version__,
    }
    # ---- plain HMC: the reference (float64, batched chains)
    x0 = torch.zeros(args.hmc_chains, args.L, args.L, dtype=torch.float64)
    eps, n_lf = _tune_hmc(target.double(), x0 + 0.1 * torch.randn_like(x0), args.seed, args.pilot)
    start = _cpu()
    total = args.hmc_steps + args.burn_in
    hmc = sampling.hmc(target.double(), x0, total, eps, n_lf, generator=torch.Generator().manual_seed(args.seed))
    hmc_seconds = _cpu() - start
    kept = hmc.samples[args.burn_in :]
    result["hmc"] = _report("hmc", kept, hmc_seconds * args.hmc_steps / total, 0.0, args.blocks)
    result["hmc"].update({"step_size": eps, "n_leapfrog": n_lf, "jitter": 0.2, "acceptance": hmc.mean_acceptance})
    print(json.dumps(result["hmc"]), flush=True)

    # ---- train the flow
    flow = LatticeFlow(args.L, args.transforms, tuple(args.hidden), z2=args.z2)
    start, wall = _cpu(), time.perf_counter()
    history = fit(
        flow,
        BoltzmannGenerator(target, estimator="fast"),
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
    if args.save_model:
        io.save(flow, args.save_model)

    # ---- importance sampling
    _, log_w = sampling.importance_sample(flow, target, args.eval_samples, batch_size=2048)
    log_Z, log_Z_error = sampling.log_Z(log_w)
    result["importance_sampling"] = {"ess": sampling.ess(log_w), "log_Z": log_Z, "log_Z_error": log_Z_error}

    # ---- flow IMH
    start = _cpu()
    imh = sampling.independent_metropolis(
        flow, target, args.imh_steps, generator=torch.Generator().manual_seed(args.seed)
    )
    imh_seconds = _cpu() - start
    result["imh"] = _report("imh", imh.samples, imh_seconds, train_seconds, args.blocks)
    result["imh"]["acceptance"] = imh.mean_acceptance

    # ---- flow HMC
    z0 = flow.base.sample((args.flow_hmc_chains,))
    latent = sampling.latent_energy(flow, target)
    feps, fn_lf = _tune_hmc(latent, z0, args.seed, args.pilot)
    start = _cpu()
    fhmc = sampling.flow_hmc(
        flow,
        target,
        args.flow_hmc_steps,
        step_size=feps,
        n_leapfrog=fn_lf,
        z0=z0,
        generator=torch.Generator().manual_seed(args.seed),
    )
    fhmc_seconds = _cpu() - start
    result["flow_hmc"] = _report("flow_hmc", fhmc.samples, fhmc_seconds, train_seconds, args.blocks)
    result["flow_hmc"].update({"step_size": feps, "n_leapfrog": fn_lf, "acceptance": fhmc.mean_acceptance})

    # ---- agreement of chi_2 with the HMC reference
    ref, ref_err = result["hmc"]["chi2"]
    for name in ("imh", "flow_hmc"):
        value, err = result[name]["chi2"]
        result[name]["chi2_vs_hmc_sigma"] = (value - ref) / math.hypot(err, ref_err)
    return result


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--L", type=int, default=8)
    p.add_argument("--m2", type=float, default=-4.0)
    p.add_argument("--lam", type=float, default=8.0)
    p.add_argument("--transforms", type=int, default=16)
    p.add_argument("--hidden", type=int, nargs="+", default=[8, 8])
    p.add_argument("--z2", action="store_true", help="Z2-symmetrised conditioners")
    p.add_argument("--steps", type=int, default=2500)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-samples", type=int, default=20_000)
    p.add_argument("--imh-steps", type=int, default=20_000)
    p.add_argument("--hmc-chains", type=int, default=16)
    p.add_argument("--hmc-steps", type=int, default=5000)
    p.add_argument("--burn-in", type=int, default=500)
    p.add_argument("--flow-hmc-chains", type=int, default=16)
    p.add_argument("--flow-hmc-steps", type=int, default=500)
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--pilot", type=int, default=30, help="trajectories of each step-size pilot run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON output path")
    p.add_argument("--save-model", default=None, help="directory to save the trained flow in (flowkit.io)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    torch.set_num_threads(1)
    args = parse(argv)
    result = run_point(args)
    result["command"] = "python bench/lattice.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
