r"""Rigid-body Boltzmann generators on unit quaternions (Köhler et al., ICML 2023), against exact answers.

Targets and gates (issue 15):

1. ``matrix-fisher``: $p(R) \propto e^{\mathrm{tr} F^\top R}$ with singular values about 10
   (F = U diag(10, 9, 11) V^T for fixed random rotations U, V). Exact log normaliser by the 1-D
   Bessel integral. Gate: |log Z_hat - log Z| < 0.02 and ESS > 90%.
2. ``octupole``: $u(R) = -\kappa \sum_i ((R b_i) \cdot \hat y)^3$ at kappa = 8, four modes of
   equal mass, log Z by quadrature. Gate: all four modes covered (reweighted mass of each within
   0.05 of 1/4, and raw flow samples in each), |log Z_hat - log Z| < 0.05.
3. ``dipoles``: three rigid dipoles in a periodic box; no exact answer, so the flow's reweighted
   observables (mean energy, mean mu_z, mean mu_i . mu_j) are compared with flowkit's random-walk
   Metropolis (``flowkit.sampling.metropolis``), and an IMH chain with the flow as proposal.

The flow for one body is ``RigidBodyFlow(["quaternion"] + ["real"] * m)``: double Möbius
couplings of the quaternion conditioned on m standard-normal auxiliaries
(``WithAuxiliaries``: the joint target is the rigid target times N(0, I), so weights, ESS
and Z are the rigid target's exactly); ``--components K`` makes each map a convex combination
of K (``RigidCoupling(components=K)``). With ``--aux 0`` the flow is a stack of ``--blocks``
unconditional maps on S^3 over the uniform base: ``DoubleMoebius(heads)``, or with ``--components K``
``ConvexDoubleMoebius(4, K, heads)``. ``tail-bounds`` measures what limits the ESS on the
matrix-Fisher target (see its docstring): the best angular central Gaussian (all that stacked
double Möbius maps can give) and the best single convex layer. Training: reverse KL with the fast path gradient
(``PathGradientVI(estimator="fast")``), or with ``--ml-exact N`` (matrix Fisher: N exact samples) or
``--ml-chains C`` (octupole: samples of C Metropolis chains started uniformly) ``BoltzmannGenerator``
(the same reverse KL plus maximum likelihood on the samples); Adam with a cosine schedule; one torch thread
(two threads are many times slower on a busy 2-core machine).

Run: ``nice -n 5 python bench/rigid.py`` (all targets) or ``--targets matrix-fisher``; ``--quick``
for a smoke run. Writes ``bench/results/rigid.json``.

Measured (2 CPU cores shared with other jobs, load about 7, one torch thread; ``train_cpu_seconds`` is
the training process's CPU time, wall time is 4-6 times longer under that load):

- ``--targets matrix-fisher --aux 0 --blocks 3 --components 4 --heads 1 --steps 3000 --lr 1e-2
  --seed S`` (reverse KL alone): ESS 93.7, 97.5, 89.2, 96.1, 90.6% and |log Z_hat - log Z| 0.0010,
  0.0002, 0.0055, 0.0004, 0.0035 for S = 0..4, in 49, 52, 44, 42, 39 s CPU
  (``results/rigid_matrix_fisher_convex_seed*.json``).
  Seed 2's learnt log-stretches stay within the bound (largest |beta| 4.8 of 6) and one layer with
  four components can reach 99% (below): a poorer optimum of the three-layer stack, not capacity.
- ``--targets tail-bounds``: the best angular central Gaussian (any stack of double Möbius maps)
  has ESS 61.5%; one convex layer on the principal axis 61.3% (K = 1), 96.9% (K = 2), 99.3% (K = 4).
  Before the convex layers, ``RigidBodyFlow`` with 4 auxiliaries reached 51% (reverse KL) and 84%
  (plus ML on 20k exact samples).
- ``--targets octupole --components 4`` (4 auxiliaries, 4 blocks, 2 heads, 1500 steps, lr 5e-3,
  reverse KL alone): collapses onto two modes (raw fractions 0.71, 0.003, 0.002, 0.28; ESS 0.03%,
  |log Z error| 0.31), 101 s CPU; reverse KL is mode-seeking whatever the layer, so the octupole gate
  is met with ``--ml-chains`` (``results/rigid_octupole_ml.json``).
- ``--targets octupole --ml-chains 512 --mcmc-steps 2000 --components 4`` (same flow and budget, plus
  ML on 81,920 Metropolis states): all four modes covered (reweighted masses 0.251, 0.251, 0.246,
  0.252), ESS 49.5% and |log Z error| 0.0064 in 156 s CPU; without ``--components`` the same run gave
  ESS 32.8% and 0.0146.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from scipy.spatial.transform import Rotation

from flowkit.distributions import rigid_domain
from flowkit.domains import Sphere
from flowkit.flows import RigidBodyFlow
from flowkit.sampling import ess, importance_sample, independent_metropolis, log_Z, metropolis, reweight
from flowkit.targets import MatrixFisher, Octupole, RigidDipoles, WithAuxiliaries
from flowkit.train import BoltzmannGenerator, PathGradientVI, fit

RESULTS = Path(__file__).resolve().parent / "results"


def _train(flow, target, steps, batch, lr, seed, samples=None):
    """Train; returns (wall seconds, process CPU seconds, history)."""
    start, cpu = time.perf_counter(), time.process_time()
    if samples is None:
        objective = PathGradientVI(target, "fast")
    else:  # reverse KL (fast path gradient) plus maximum likelihood on the samples
        objective = BoltzmannGenerator(target, samples=samples, estimator="fast")
    history = fit(flow, objective, steps=steps, batch_size=batch, lr=lr, progress=False, seed=seed)
    return time.perf_counter() - start, time.process_time() - cpu, history


def _body_flow(args):
    """One rigid body with `args.aux` auxiliaries; without auxiliaries a stack of unconditional maps on S^3."""
    segments = ["quaternion"] + ["real"] * args.aux
    return RigidBodyFlow(segments, blocks=args.blocks, heads=args.heads, hidden=args.hidden, components=args.components)


def _joint(target, aux):
    return WithAuxiliaries(target, aux) if aux else target


def _metropolis_samples(target, n_chains, n_steps, seed, aux):
    """Quaternions from random-walk Metropolis chains started uniformly (after burn-in), with N(0, 1) auxiliaries."""
    gen = torch.Generator().manual_seed(seed)
    x0 = Sphere(4).uniform((n_chains, 4), generator=gen)
    states, acceptance = metropolis(target.double(), x0, n_steps, 0.3, Sphere(4), thin=10, generator=gen)
    q = states[states.shape[0] // 5 :].reshape(-1, 4)
    aux = torch.randn(len(q), aux, generator=gen, dtype=q.dtype)
    return torch.cat([q, aux], -1).float(), acceptance


def _evaluate(flow, target, n, exact_log_z):
    x, log_w = importance_sample(flow, target, n)
    estimate, error = log_Z(log_w)
    return (
        x,
        log_w,
        {
            "ess": ess(log_w),
            "log_Z_hat": estimate,
            "log_Z_error": error,
            "log_Z_exact": exact_log_z,
            "abs_log_Z_error": abs(estimate - exact_log_z) if exact_log_z is not None else None,
            "samples": n,
        },
    )


def matrix_fisher(args) -> dict:
    target = _matrix_fisher_target()
    f = np.asarray(target.F)
    torch.manual_seed(args.seed)
    flow = _body_flow(args)
    joint = _joint(target, args.aux)
    samples = joint.sample(args.ml_exact, generator=torch.Generator().manual_seed(args.seed)) if args.ml_exact else None
    seconds, cpu_seconds, history = _train(flow, joint, args.steps, args.batch, args.lr, args.seed, samples)
    _, _, out = _evaluate(flow, joint, args.eval, target.log_Z)
    out["ml_exact_samples"] = args.ml_exact
    out.update(
        singular_values=np.linalg.svd(f, compute_uv=False).tolist(),
        log_normalizer=target.log_normalizer,
        train_seconds=seconds,
        train_cpu_seconds=cpu_seconds,
        steps=args.steps,
        final_loss=history.loss[-1],
        passed=bool(out["abs_log_Z_error"] < 0.02 and out["ess"] > 0.9),
    )
    return out


def _matrix_fisher_target():
    u, v = Rotation.random(2, random_state=3).as_matrix()
    return MatrixFisher((u @ np.diag([10.0, 9.0, 11.0]) @ v.T).tolist())


def tail_bounds(args) -> dict:
    r"""What limits the ESS on the matrix-Fisher target: the best of two families, fitted to exact samples.

    ESS in the large-sample limit is $1 / E_p[p/q]$ (Kish). (1) Any stack of unconditional double Möbius
    maps pushes the uniform base to an angular central Gaussian, $q \propto |\Sigma|^{-1/2} (x^\top
    \Sigma^{-1} x)^{-2}$ (each map is $x \mapsto M x / |M x|$); the best $\Sigma$ (Nelder-Mead on its
    three scale ratios in the eigenframe of the samples). (2) One convex double Möbius layer (sampling
    direction) on the samples' principal axis with K components (Adam on its 2K numbers).
    """
    from scipy.optimize import minimize

    from flowkit.bijectors.sphere import _convex_double_moebius_inverse

    target = _matrix_fisher_target().double()
    x = target.sample(args.eval, generator=torch.Generator().manual_seed(args.seed)).double()
    log_p = -target.energy(x) - target.log_Z
    log_area = Sphere(4).log_area
    _, vectors = torch.linalg.eigh(x.T @ x / len(x))
    y = (x @ vectors.flip(-1)).numpy()

    def log_chi(log_scales):  # log E_p[p / q] for the ACG with scales (1, e^s1, e^s2, e^s3)
        s2 = np.exp(2 * np.concatenate([[0.0], log_scales]))
        log_q = -0.5 * np.log(s2).sum() - 2 * np.log((y**2 / s2).sum(1)) - log_area
        return float(np.log(np.mean(np.exp(log_p.numpy() - log_q))))

    acg = minimize(log_chi, np.full(3, -2.0), method="Nelder-Mead")
    out = {"samples": args.eval, "acg_ess": math.exp(-acg.fun), "acg_scales": np.exp(acg.x).tolist(), "convex": {}}
    axis = vectors[:, -1].expand_as(x)
    for k in (1, 2, 4):
        beta = torch.nn.Parameter(torch.linspace(-4.0, -0.5, k, dtype=torch.float64) if k > 1 else torch.tensor([-2.0]))
        logits = torch.nn.Parameter(torch.zeros(k, dtype=torch.float64))
        optimizer = torch.optim.Adam([beta, logits], lr=0.05)
        for _ in range(400):
            _, ladj = _convex_double_moebius_inverse(
                x, axis, beta.expand(len(x), k), logits.log_softmax(-1).expand(len(x), k)
            )
            loss = torch.logsumexp(log_p - ladj + log_area, 0) - math.log(len(x))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        out["convex"][k] = {
            "ess": math.exp(-loss.item()),
            "beta": beta.tolist(),
            "weights": logits.softmax(-1).tolist(),
        }
    return out


def octupole(args) -> dict:
    target = Octupole(8.0)
    torch.manual_seed(args.seed)
    flow = _body_flow(args)
    joint = _joint(target, args.aux)
    samples, acceptance = None, None
    if args.ml_chains:
        samples, acceptance = _metropolis_samples(target, args.ml_chains, args.mcmc_steps, args.seed, args.aux)
        target.float()
    seconds, cpu_seconds, history = _train(flow, joint, args.steps, args.batch, args.lr, args.seed, samples)
    x, log_w, out = _evaluate(flow, joint, args.eval, target.log_Z)
    if samples is not None:
        ml_modes = torch.bincount(target.mode(samples[:, :4]), minlength=4).double() / len(samples)
        out.update(ml_samples=len(samples), ml_chains=args.ml_chains, ml_acceptance=acceptance)
        out["ml_mode_fraction"] = ml_modes.tolist()
    mode = target.mode(x[:, :4])
    weights = torch.softmax(log_w, 0)
    reweighted = torch.zeros(4, dtype=torch.float64).index_add_(0, mode, weights)
    raw = torch.bincount(mode, minlength=4).double() / len(mode)
    out.update(
        kappa=8.0,
        mode_mass_reweighted=reweighted.tolist(),
        mode_fraction_raw=raw.tolist(),
        train_seconds=seconds,
        train_cpu_seconds=cpu_seconds,
        steps=args.steps,
        final_loss=history.loss[-1],
    )
    covered = bool((raw > 0.05).all()) and bool(((reweighted - 0.25).abs() < 0.05).all())
    out["all_modes_covered"] = covered
    out["passed"] = bool(covered and out["abs_log_Z_error"] < 0.05)
    return out


def _dipole_observables(target, x):
    mu = target.dipoles(x)
    i, j = torch.triu_indices(target.n, target.n, 1)
    return torch.stack([target.energy(x), mu[..., 2].mean(-1), (mu[:, i] * mu[:, j]).sum(-1).mean(-1)], -1)


def dipoles(args) -> dict:
    target = RigidDipoles(n=3, box=3.0, coupling=1.0, field=1.0).double()
    domain = rigid_domain(target.segments)
    gen = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    x0 = domain.uniform((args.chains, 21), generator=gen)
    states, acceptance = metropolis(target, x0, args.mcmc_steps, 0.25, domain, thin=10, generator=gen)
    states = states[states.shape[0] // 5 :]  # burn-in
    mcmc_seconds = time.perf_counter() - start
    per_chain = torch.stack([_dipole_observables(target, s) for s in states.unbind(0)]).mean(0)  # (chains, 3)
    reference = per_chain.mean(0)
    reference_err = per_chain.std(0) / math.sqrt(per_chain.shape[0])
    torch.manual_seed(args.seed)
    flow = RigidBodyFlow(
        target.segments, blocks=args.blocks, heads=args.heads, hidden=args.hidden, components=args.components
    ).double()
    seconds, cpu_seconds, history = _train(flow, target, args.steps, args.batch, args.lr, args.seed)
    x, log_w, out = _evaluate(flow, target, args.eval, None)
    flow_obs, flow_err = reweight(_dipole_observables(target, x), log_w)
    imh = independent_metropolis(flow, target, args.eval)
    chain, imh_acceptance = imh.samples[:, 0], imh.mean_acceptance
    imh_obs = _dipole_observables(target, chain).mean(0)
    names = ["energy", "mu_z", "mu_i.mu_j"]
    deviation = ((flow_obs - reference).abs() / torch.sqrt(flow_err**2 + reference_err**2)).tolist()
    out.update(
        observables=names,
        mcmc=reference.tolist(),
        mcmc_error=reference_err.tolist(),
        mcmc_acceptance=acceptance,
        mcmc_seconds=mcmc_seconds,
        flow_reweighted=flow_obs.tolist(),
        flow_reweighted_error=flow_err.tolist(),
        flow_raw=_dipole_observables(target, x).mean(0).tolist(),
        imh=imh_obs.tolist(),
        imh_acceptance=imh_acceptance,
        deviation_in_sigmas=deviation,
        train_seconds=seconds,
        train_cpu_seconds=cpu_seconds,
        steps=args.steps,
        final_loss=history.loss[-1],
        passed=bool(max(deviation) < 3),
    )
    return out


RUNS = {"matrix-fisher": matrix_fisher, "tail-bounds": tail_bounds, "octupole": octupole, "dipoles": dipoles}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", default="matrix-fisher,octupole,dipoles")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--hidden", default="64,64")
    parser.add_argument(
        "--components", type=int, default=None, help="maps per convex Möbius combination (default: single maps)"
    )
    parser.add_argument(
        "--aux", type=int, default=4, help="auxiliary coordinates for one body (0: unconditional maps on S^3)"
    )
    parser.add_argument("--eval", type=int, default=20_000, help="flow samples for ESS and log Z")
    parser.add_argument("--chains", type=int, default=256, help="Metropolis chains (dipoles)")
    parser.add_argument("--mcmc-steps", type=int, default=4000, help="Metropolis steps per chain (dipoles)")
    parser.add_argument(
        "--ml-chains",
        type=int,
        default=0,
        help="octupole: add maximum likelihood on samples of this many Metropolis chains (default 0: reverse KL only)",
    )
    parser.add_argument(
        "--ml-exact",
        type=int,
        default=0,
        help="matrix-fisher: add maximum likelihood on this many exact samples (default 0: reverse KL only)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: faster on a busy machine)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a smoke run (tiny budgets)")
    parser.add_argument("--out", default=str(RESULTS / "rigid.json"))
    args = parser.parse_args()
    args.hidden = tuple(int(h) for h in args.hidden.split(","))
    if args.quick:
        args.steps, args.eval, args.chains, args.mcmc_steps = 20, 2000, 16, 200
    torch.set_num_threads(args.threads)
    results = {"config": {k: v for k, v in vars(args).items() if k != "out"}, "torch_threads": args.threads}
    for name in args.targets.split(","):
        results[name] = RUNS[name](args)
        print(name, json.dumps(results[name]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
