"""The double-well experiment of stochastic normalizing flows (Wu, Köhler & Noé 2020), at CPU scale.

Target u(x) = x1^4 - 6 x1^2 - 0.5 x1 + 0.5 x2^2 (flowkit.targets.DoubleWell), prior N(0, I2).
Two flows, trained alike over several seeds:

* ``RNVP``: 3 RealNVP blocks (2 affine couplings each, MLPs [64, 64]);
* ``RNVP+MC``: the same with Metropolis blocks (20 steps, sigma = 0.25) at the prior,
  after the first two blocks (lambda = 0 and 0.5) and at the target (lambda = 1),
  as in the paper's ``boltzmann_generator_RNVP_MC(..., stochastic=True, diffuse_at_0=True)``.

Training (as in ``experiment1_doublewell.ipynb``): Adam 5e-3, batch 128, 300 steps of
maximum likelihood (path-space likelihood for the SNF), then 300 steps of 1/2 ML + 1/2
reverse KL (on path space for the SNF). The training data are 10,000 exact samples of the
target (the paper used long MCMC thinned by 10).

Metrics, per seed: the free-energy profile along x1 from 20 x 1e5 samples, raw and
reweighted with the path weights, on 30 fixed bins over [-3, 3] restricted to
|x1| < 2.25; the paper's error sqrt(bias^2 + std^2) (bias: mean signed deviation from
the exact profile, std: spread over the 20 repeats), and also the RMS deviation of the
mean profile after the best constant shift; the Kish effective sample size fraction (per batch of 1e5, averaged); and
the log Z estimate against the exact value. Published (10 runs, paper's notebook):
RNVP 1.44 +- 0.53 raw / 1.15 +- 0.41 reweighted; RNVP+MC 1.51 +- 0.19 / 0.63 +- 0.11.

Run: ``python bench/snf_doublewell.py`` (about 10 minutes on 2 cores), ``--quick`` for a smoke run.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from flowkit.bijectors import AffineCoupling, Chain
from flowkit.distributions import StandardNormal
from flowkit.flows import Flow
from flowkit.stochastic import MetropolisBlock
from flowkit.targets import DoubleWell
from flowkit.train import BoltzmannGenerator, MaximumLikelihood, fit

RESULTS = Path(__file__).resolve().parent / "results"
EDGES = np.linspace(-3.0, 3.0, 31)
CENTERS = 0.5 * (EDGES[1:] + EDGES[:-1])
INSIDE = np.abs(CENTERS) < 2.25


def build(stochastic: bool, target: DoubleWell, mc_steps: int, step_size: float, hidden: int) -> Flow:
    """RealNVP with 3 blocks of 2 couplings; Metropolis blocks in between when ``stochastic``.

    Layers are listed data side first, so the sampling path reads the list backwards:
    MC(lambda=0), block, MC(0), block, MC(0.5), block, MC(1).
    """

    def block() -> list:
        return [AffineCoupling(2, parity=p, hidden=(hidden, hidden)) for p in (1, 0)]

    def mc(lam: float) -> list:
        return [MetropolisBlock(target, lam, n_steps=mc_steps, step_size=step_size)] if stochastic else []

    layers = mc(1.0) + block() + mc(0.5) + block() + mc(0.0) + block() + mc(0.0)
    return Flow(Chain(*layers), StandardNormal(2))


def train(flow: Flow, target: DoubleWell, data: torch.Tensor, args: argparse.Namespace) -> float:
    """ML for ``ml_steps``, then 1/2 ML + 1/2 reverse KL for ``kl_steps``, with one Adam optimiser and a constant rate.

    For flows with stochastic blocks both objectives work on path space
    (``path_log_likelihood`` and ``sample_with_log_weights``).
    """
    optimiser = torch.optim.Adam(flow.parameters(), lr=args.lr)
    options = dict(batch_size=args.batch, optimizer=optimiser, schedule=None, progress=False)
    start = time.perf_counter()
    fit(flow, MaximumLikelihood(), data, steps=args.ml_steps, **options)
    mixed = BoltzmannGenerator(target, samples=data, w_ml=0.5, w_kl=0.5, estimator="reparam")
    fit(flow, mixed, steps=args.kl_steps, **options)
    return time.perf_counter() - start


def free_energy(x1: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """-log of the histogram density on the fixed bins, shifted to mean zero over its finite bins."""
    hist, _ = np.histogram(x1, bins=EDGES, density=True, weights=weights)
    with np.errstate(divide="ignore"):
        f = -np.log(hist)
    return f - f[np.isfinite(f)].mean()


def profile_errors(profiles: np.ndarray, pooled: np.ndarray, exact: np.ndarray) -> dict:
    """The paper's sqrt(bias^2 + std^2) over the repeats, and the RMS error of the pooled profile.

    ``bias`` is the mean signed deviation of the repeat-averaged profile (shifted to minimum
    zero) from the exact one, ``std`` the spread over the repeats, averaged over bins. ``rms``
    is the root-mean-square deviation of the profile of all repeats pooled after the best
    constant shift (insensitive to how each repeat is aligned).
    """
    mean = profiles.mean(0)
    mean = mean - mean[np.isfinite(mean)].min()
    ok = INSIDE & np.isfinite(mean)
    bias = abs((exact - mean)[ok].mean())
    std = profiles[:, ok].std(0).mean()
    ok_pooled = INSIDE & np.isfinite(pooled)
    diff = (pooled - exact)[ok_pooled]
    rms = float(np.sqrt(((diff - diff.mean()) ** 2).mean()))
    return {"bias": float(bias), "std": float(std), "error": float(math.hypot(bias, std)), "rms": rms,
            "bins_missing": int((INSIDE & ~np.isfinite(mean)).sum())}


@torch.no_grad()
def evaluate(flow: Flow, target: DoubleWell, args: argparse.Namespace) -> dict:
    raw, reweighted, x1s, log_ws, ess = [], [], [], [], []
    for _ in range(args.repeats):
        x, log_w = flow.sample_with_log_weights(args.samples, target)
        log_w = log_w.double()
        x1 = x[:, 0].double().numpy()
        w = torch.softmax(log_w, 0).numpy()
        raw.append(free_energy(x1, None))
        reweighted.append(free_energy(x1, w))
        ess.append(float(1.0 / np.square(w).sum() / len(w)))
        x1s.append(x1)
        log_ws.append(log_w)
    grid = torch.tensor(np.stack([CENTERS, np.zeros_like(CENTERS)], -1))
    exact = target.energy(grid).numpy()
    exact = exact - exact[INSIDE].min()
    log_w = torch.cat(log_ws)
    x1 = np.concatenate(x1s)
    pooled_raw = free_energy(x1, None)
    pooled_reweighted = free_energy(x1, torch.softmax(log_w, 0).numpy())
    return {
        "raw": profile_errors(np.array(raw), pooled_raw, exact),
        "reweighted": profile_errors(np.array(reweighted), pooled_reweighted, exact),
        "ess": float(np.mean(ess)),
        "log_Z": float(torch.logsumexp(log_w, 0) - math.log(len(log_w))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--ml-steps", type=int, default=300)
    parser.add_argument("--kl-steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--mc-steps", type=int, default=20)
    parser.add_argument("--step-size", type=float, default=0.25)
    parser.add_argument("--data", type=int, default=10_000, help="number of exact training samples")
    parser.add_argument("--samples", type=int, default=100_000, help="samples per free-energy repeat")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--quick", action="store_true", help="tiny budget, for a smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS / "snf_doublewell.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.quick:
        args.seeds, args.ml_steps, args.kl_steps, args.samples, args.repeats = 2, 30, 30, 5000, 4

    target = DoubleWell()
    runs: dict[str, list] = {"RNVP": [], "RNVP+MC": []}
    for seed in range(args.seeds):
        data = target.sample(args.data, generator=torch.Generator().manual_seed(1000 + seed)).float()
        for name in runs:
            torch.manual_seed(seed)
            flow = build(name == "RNVP+MC", target, args.mc_steps, args.step_size, args.hidden)
            seconds = train(flow, target, data, args)
            result = evaluate(flow, target, args)
            result["train_seconds"] = seconds
            runs[name].append(result)
            print(
                f"seed {seed} {name:8s} error raw {result['raw']['error']:.2f} reweighted {result['reweighted']['error']:.2f} "
                f"| rms raw {result['raw']['rms']:.2f} rew {result['reweighted']['rms']:.2f} | ESS {result['ess']:.3f} "
                f"| log Z {result['log_Z']:.3f} | {seconds:.0f} s",
                flush=True,
            )

    def stat(name: str, *keys: str) -> tuple[float, float]:
        values = np.array([_get(r, keys) for r in runs[name]])
        return float(values.mean()), float(values.std())

    summary = {}
    print(f"\nDouble well, {args.seeds} seeds; free-energy error sqrt(bias^2+std^2) in kT on |x1| < 2.25 (mean +- std over seeds)")
    print(f"{'flow':9s} {'error raw':>14s} {'error rew.':>14s} {'rms raw':>12s} {'rms rew.':>12s} {'ESS':>14s} {'log Z':>16s}")
    for name in runs:
        row = {
            "error_raw": stat(name, "raw", "error"),
            "error_reweighted": stat(name, "reweighted", "error"),
            "rms_raw": stat(name, "raw", "rms"),
            "rms_reweighted": stat(name, "reweighted", "rms"),
            "ess": stat(name, "ess"),
            "log_Z": stat(name, "log_Z"),
        }
        summary[name] = row
        print(
            f"{name:9s} "
            + " ".join(f"{m:6.2f} +- {s:4.2f}" for m, s in (row["error_raw"], row["error_reweighted"]))
            + " "
            + " ".join(f"{m:5.2f}+-{s:4.2f}" for m, s in (row["rms_raw"], row["rms_reweighted"]))
            + f" {row['ess'][0]:6.3f}+-{row['ess'][1]:5.3f} {row['log_Z'][0]:8.3f}+-{row['log_Z'][1]:5.3f}"
        )
    print(f"exact log Z = {target.log_Z:.4f}; paper: RNVP 1.44+-0.53 / 1.15+-0.41, RNVP+MC 1.51+-0.19 / 0.63+-0.11")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    args.out.write_text(json.dumps({"config": config, "exact_log_Z": target.log_Z, "summary": summary, "runs": runs}, indent=2))
    print(f"wrote {args.out}")


def _get(record: dict, keys: tuple[str, ...]) -> float:
    for key in keys:
        record = record[key]
    return record  # type: ignore[return-value]


if __name__ == "__main__":
    main()
