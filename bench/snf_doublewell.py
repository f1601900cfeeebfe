"""The double-well experiment of stochastic normalizing flows (Wu, Köhler & Noé 2020), at CPU scale.

Target u(x) = x1^4 - 6 x1^2 - 0.5 x1 + 0.5 x2^2 (flowkit.targets.DoubleWell), prior N(0, I2).
Two flows, trained alike over several seeds:

* ``RNVP``: 3 RealNVP blocks (2 affine couplings each, MLPs [64, 64]);
* ``RNVP+MC``: the same with Metropolis blocks (20 steps, sigma = 0.25) at the prior,
  after the first two blocks (lambda = 0 and 0.5) and at the target (lambda = 1),
  as in the paper's ``boltzmann_generator_RNVP_MC(..., stochastic=True, diffuse_at_0=True)``.

``--coupling bgtorch`` (the default) uses the paper's coupling parameterisation: log-scale
``alpha * tanh(.)`` with a trainable ``alpha`` starting at e^-1 and randomly initialised
conditioners, so each coupling starts close to a small random affine map and the
intermediate distributions stay near N(0, I), which the lambda = 0 and 0.5 Metropolis
blocks expect. ``--coupling flowkit`` uses :class:`flowkit.bijectors.AffineCoupling`
(log-scale clamped at 5, identity start), a much stronger RealNVP: its plain flow already
reaches ESS ~0.6, and its deterministic blocks learn maps whose intermediate distributions
are far from N(0, I) (the minor well sits near x1 = -4 after the first block), so the
lambda = 0 Metropolis block pushes paths away from it and the few paths that reach it by
uphill moves carry huge weights: the SNF's ESS collapses on some seeds and it does not beat
the plain flow. Both flows of a run always use the same coupling, data, seeds and budget.

Training (as in ``experiment1_doublewell.ipynb``): Adam 5e-3, batch 128, 300 steps of
maximum likelihood (path-space likelihood for the SNF), then 300 steps of 1/2 ML + 1/2
reverse KL (on path space for the SNF). The training data are 10,000 exact samples of the
target (the paper used long MCMC thinned by 10).

Metrics, per seed: the free-energy profile along x1 from 20 x 1e5 samples, raw and
reweighted with the path weights, on 30 fixed bins over [-3, 3] restricted to
|x1| < 2.25; the paper's error sqrt(bias^2 + std^2) (bias: mean signed deviation from
the exact profile, std: spread over the 20 repeats), and also the RMS deviation of the
mean profile after the best constant shift; the Kish effective sample size fraction (per batch of 1e5, averaged); and
the log Z estimate against the exact value. Paths and weights are computed in float64.
The paper bins each repeat on its own sample range; fixed bins align the repeats with each
other and with the exact profile. The row ``exact`` is the metric for exact samples with
equal weights, the floor that 20 x 1e5 samples allow. Published (10 runs, paper's notebook):
RNVP 1.44 +- 0.53 raw / 1.15 +- 0.41 reweighted; RNVP+MC 1.51 +- 0.19 / 0.63 +- 0.11.

Run: ``python bench/snf_doublewell.py --workers 2`` (about 8 minutes on 2 cores), ``--quick`` for a smoke run.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import multiprocessing
import time
from pathlib import Path

import numpy as np
import torch

from flowkit.bijectors import AffineCoupling, Chain, Coupling
from flowkit.distributions import StandardNormal
from flowkit.flows import Flow, MetropolisBlock, StochasticFlow
from flowkit.sampling import sample_with_log_weights
from flowkit.targets import DoubleWell
from flowkit.train import BoltzmannGenerator, MaximumLikelihood, fit
from flowkit.transformers import Affine

RESULTS = Path(__file__).resolve().parent / "results"
EDGES = np.linspace(-3.0, 3.0, 31)
CENTERS = 0.5 * (EDGES[1:] + EDGES[:-1])
INSIDE = np.abs(CENTERS) < 2.25


class _BgtorchAffine(Affine):
    r"""The affine transformer of the paper's code (bgtorch ``AffineTransformer``): ``y = x e^{s} + t``.

    The log-scale is :math:`s = \alpha \tanh(s_{raw})` with a trainable :math:`\alpha = e^{a}`,
    :math:`a = -1` at the start, so every coupling starts with :math:`|s| < 0.37`.
    """

    def __init__(self) -> None:
        super().__init__()
        self.log_alpha = torch.nn.Parameter(torch.tensor(-1.0))

    def _shift_log_scale(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shift, raw = params.unbind(-1)
        return shift, self.log_alpha.exp() * torch.tanh(raw)


def coupling(kind: str, parity: int, hidden: int) -> Coupling:
    """One affine coupling on 2-D inputs.

    ``flowkit``: :class:`~flowkit.bijectors.AffineCoupling` (log-scale soft-clamped at 5, the
    conditioner's last layer starts at zero, i.e. the identity). ``bgtorch``: the
    parameterisation of the paper's ``boltzmann_generator_RNVP_MC`` (log-scale
    ``alpha * tanh``, alpha trainable from e^-1, ReLU conditioner with PyTorch's default random
    initialisation of every layer); one conditioner gives shift and log-scale where the paper
    has two separate networks of the same shape.
    """
    if kind == "flowkit":
        return AffineCoupling(2, parity=parity, hidden=(hidden, hidden))
    layer = Coupling(_BgtorchAffine(), 2, parity=parity, hidden=(hidden, hidden), activation="relu")
    layer.conditioner.last.reset_parameters()
    return layer


def build(
    stochastic: bool, target: DoubleWell, mc_steps: int, step_size: float, hidden: int, kind: str = "flowkit"
) -> Flow | StochasticFlow:
    """RealNVP with 3 blocks of 2 couplings; Metropolis blocks in between when ``stochastic``.

    Layers are listed data side first, so the sampling path reads the list backwards:
    MC(lambda=0), block, MC(0), block, MC(0.5), block, MC(1).
    """

    def block() -> list:
        return [coupling(kind, p, hidden) for p in (1, 0)]

    def mc(lam: float) -> list:
        return [MetropolisBlock(target, lam, n_steps=mc_steps, step_size=step_size)] if stochastic else []

    layers = mc(1.0) + block() + mc(0.5) + block() + mc(0.0) + block() + mc(0.0)
    return StochasticFlow(layers, StandardNormal(2)) if stochastic else Flow(Chain(*layers), StandardNormal(2))


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
    return {
        "bias": float(bias),
        "std": float(std),
        "error": float(math.hypot(bias, std)),
        "rms": rms,
        "bins_missing": int((INSIDE & ~np.isfinite(mean)).sum()),
    }


def exact_reference(target: DoubleWell, args: argparse.Namespace, seed: int) -> dict:
    """The metric for exact samples (all weights equal): the floor that finite sampling sets."""
    generator = torch.Generator().manual_seed(10_000 + seed)
    profiles, x1s = [], []
    for _ in range(args.repeats):
        x1 = target.sample(args.samples, generator=generator)[:, 0].double().numpy()
        profiles.append(free_energy(x1, None))
        x1s.append(x1)
    return profile_errors(np.array(profiles), free_energy(np.concatenate(x1s), None), exact_profile(target))


def exact_profile(target: DoubleWell) -> np.ndarray:
    grid = torch.tensor(np.stack([CENTERS, np.zeros_like(CENTERS)], -1))
    exact = target.energy(grid).numpy()
    return exact - exact[INSIDE].min()


@torch.no_grad()
def evaluate(flow: Flow, target: DoubleWell, args: argparse.Namespace) -> dict:
    """Free-energy errors, ESS and log Z from ``repeats`` batches of paths, run in float64."""
    flow = copy.deepcopy(flow).double()
    raw, reweighted, x1s, log_ws, ess = [], [], [], [], []
    for _ in range(args.repeats):
        x, log_w = sample_with_log_weights(flow, args.samples, target)
        x1 = x[:, 0].double().numpy()
        w = torch.softmax(log_w, 0).numpy()
        raw.append(free_energy(x1, None))
        reweighted.append(free_energy(x1, w))
        ess.append(float(1.0 / np.square(w).sum() / len(w)))
        x1s.append(x1)
        log_ws.append(log_w)
    exact = exact_profile(target)
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
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per process")
    parser.add_argument("--workers", type=int, default=1, help="processes running (seed, flow) jobs in parallel")
    parser.add_argument(
        "--coupling",
        choices=("bgtorch", "flowkit"),
        default="bgtorch",
        help="affine coupling: flowkit's AffineCoupling, or the paper's code's parameterisation",
    )
    parser.add_argument("--quick", action="store_true", help="tiny budget, for a smoke run")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON output (default bench/results/snf_doublewell_<coupling>.json)"
    )
    args = parser.parse_args()
    if args.out is None:
        args.out = RESULTS / f"snf_doublewell_{args.coupling}.json"
    if args.quick:
        args.seeds, args.ml_steps, args.kl_steps, args.samples, args.repeats = 2, 30, 30, 5000, 4

    target = DoubleWell()
    names = ("RNVP", "RNVP+MC")
    jobs = [(seed, name, args) for seed in range(args.seeds) for name in names]
    if args.workers > 1:
        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
            results = pool.map(run_job, jobs, chunksize=1)
    else:
        results = [run_job(job) for job in jobs]
    runs: dict[str, list] = {
        name: [r for (_, n, _), r in zip(jobs, results, strict=True) if n == name] for name in names
    }
    runs["exact samples"] = [exact_reference(target, args, seed) for seed in range(args.seeds)]

    def stat(name: str, *keys: str) -> tuple[float, float]:
        values = np.array([_get(r, keys) for r in runs[name]])
        return float(values.mean()), float(values.std())

    summary = {}
    print(
        f"\nDouble well, {args.seeds} seeds; free-energy error sqrt(bias^2+std^2) in kT on |x1| < 2.25 "
        "(mean +- std over seeds)"
    )
    print(
        f"{'flow':9s} {'error raw':>14s} {'error rew.':>14s} {'rms raw':>12s} {'rms rew.':>12s} "
        f"{'ESS':>14s} {'log Z':>16s}"
    )
    for name in names:
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
    summary["exact samples"] = {"error": stat("exact samples", "error"), "rms": stat("exact samples", "rms")}
    floor = summary["exact samples"]["error"]
    print(
        f"{'exact':9s} {floor[0]:6.2f} +- {floor[1]:4.2f}  "
        "(exact samples, equal weights: the sampling floor of the metric)"
    )
    print(f"exact log Z = {target.log_Z:.4f}; paper: RNVP 1.44+-0.53 / 1.15+-0.41, RNVP+MC 1.51+-0.19 / 0.63+-0.11")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    args.out.write_text(
        json.dumps({"config": config, "exact_log_Z": target.log_Z, "summary": summary, "runs": runs}, indent=2)
    )
    print(f"wrote {args.out}")


def run_job(job: tuple[int, str, argparse.Namespace]) -> dict:
    """Train and evaluate one flow (``RNVP`` or ``RNVP+MC``) for one seed, in this process."""
    seed, name, args = job
    torch.set_num_threads(args.threads)
    target = DoubleWell()
    data = target.sample(args.data, generator=torch.Generator().manual_seed(1000 + seed)).float()
    torch.manual_seed(seed)
    flow = build(name == "RNVP+MC", target, args.mc_steps, args.step_size, args.hidden, args.coupling)
    seconds = train(flow, target, data, args)
    result = evaluate(flow, target, args)
    result["train_seconds"] = seconds
    print(
        f"seed {seed} {name:8s} error raw {result['raw']['error']:.2f} reweighted {result['reweighted']['error']:.2f} "
        f"| rms raw {result['raw']['rms']:.2f} rew {result['reweighted']['rms']:.2f} | ESS {result['ess']:.3f} "
        f"| log Z {result['log_Z']:.3f} | {seconds:.0f} s",
        flush=True,
    )
    return result


def _get(record: dict, keys: tuple[str, ...]) -> float:
    for key in keys:
        record = record[key]
    return record  # type: ignore[return-value]


if __name__ == "__main__":
    main()
