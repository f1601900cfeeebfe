r"""HMC with pseudofermions: the standard exact sampler of theories with dynamical fermions.

For a density $p(\phi) \propto e^{-S_B(\phi)}\det(D D^\dagger)$, each trajectory of
[`pseudofermion_hmc`][flowkit.sampling.pseudofermion_hmc]

1. refreshes the pseudofermions by the heat bath $\chi = D[\phi]\eta$, $\eta$ complex Gaussian
   ($p(\eta) \propto e^{-\eta^\dagger\eta}$): an exact Gibbs draw from $p(\chi \mid \phi) \propto
   e^{-\chi^\dagger (D D^\dagger)^{-1}\chi}$;
2. runs jittered-step leapfrog ([`leapfrog`][flowkit.sampling.leapfrog]) on
   $H = \frac12|\pi|^2 + S_B(\phi) + \chi^\dagger (D[\phi] D[\phi]^\dagger)^{-1}\chi$ at fixed $\chi$, with the
   force $-\nabla_\phi S_B + 2g\sum_f X_{f}\,(D^\dagger X_f)$ from the conjugate-gradient solution
   $X = (D D^\dagger)^{-1}\chi$;
3. accepts with probability $\min(1, e^{-\Delta H})$.

The joint chain on $(\phi, \chi)$ leaves $e^{-S_B - \chi^\dagger A^{-1}\chi}$ invariant, whose
$\phi$-marginal is the target. Every CG solve starts from zero, so the force is a deterministic function
of $\phi$ (reversibility); solves stop at the relative residual `target.cg_tol`, which bounds the error of
$\Delta H$ (the Metropolis test sees the action to that accuracy: with `cg_tol = 1e-10` in float64 the
bias is far below any statistical error).

References:
    Duane, Kennedy, Pendleton & Roweth, *Hybrid Monte Carlo*, Phys. Lett. B 195 (1987);
    Weingarten & Petcher, Phys. Lett. B 99 (1981) (pseudofermions);
    Gottlieb, Liu, Toussaint, Renken & Sugar, *Hybrid-molecular-dynamics algorithms for the numerical
    simulation of quantum chromodynamics*, PRD 35, 2531 (1987);
    Albergo et al., PRD 104, 114507 (2021) (arXiv:2106.05934).
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from .mcmc import Chains, _check_start, _checked_settings, _event_sum, _expand, _warn_divergences, leapfrog

__all__ = ["pseudofermion_hmc"]


def pseudofermion_hmc(
    target: object,
    x0: Tensor,
    n_steps: int,
    step_size: float = 0.1,
    n_leapfrog: int = 10,
    jitter: float = 0.2,
    generator: torch.Generator | None = None,
) -> Chains:
    r"""Hybrid Monte Carlo with pseudofermions refreshed every trajectory, batched over chains.

    Arguments:
        target: a theory with pseudofermions: [`YukawaStaggered`][flowkit.targets.YukawaStaggered] (any
            object with `sample_pseudofermions(x, generator)` and `pseudofermion_potential(x, chi)`). Its
            `cg_tol` is the relative residual of every conjugate-gradient solve.
        x0: starting scalar fields `(chains, L, L)`; their dtype is the chains' (float64 advised).
        n_steps: trajectories per chain.
        step_size: the mean leapfrog step size.
        n_leapfrog: leapfrog steps per trajectory.
        jitter: relative half-width of the step-size distribution (see [`hmc`][flowkit.sampling.hmc]).
        generator: random generator of the pseudofermions, momenta, step sizes and accept draws.

    Returns:
        [`Chains`][flowkit.sampling.Chains] of `n_steps` scalar fields per chain.
    """
    for name in ("sample_pseudofermions", "pseudofermion_potential"):
        if not callable(getattr(target, name, None)):
            raise ValueError(
                f"pseudofermion_hmc: target must have pseudofermions ({name}), e.g. flowkit.targets.YukawaStaggered; "
                f"got {type(target).__name__}"
            )
    n_steps, step_size, n_leapfrog, jitter = _checked_settings(
        "pseudofermion_hmc", n_steps, step_size, n_leapfrog, jitter
    )
    x = _check_start(x0, "pseudofermion_hmc")
    start = time.perf_counter()
    chains = x.shape[0]
    ones = (1,) * (x.dim() - 1)
    out = x.new_empty(n_steps, *x.shape)
    accepted = torch.zeros(chains, dtype=torch.float64, device=x.device)
    diverged = 0
    for t in range(n_steps):
        chi = target.sample_pseudofermions(x, generator)

        def potential(phi: Tensor, chi: Tensor = chi) -> tuple[Tensor, Tensor]:
            return target.pseudofermion_potential(phi, chi)

        u, grad = potential(x)
        p = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        eps = step_size * (1 + jitter * (2 * torch.rand(chains, generator=generator, dtype=x.dtype) - 1))
        x_new, p_new, u_new, _ = leapfrog(x, p, eps.to(x.device).reshape(chains, *ones), n_leapfrog, potential, grad)
        delta = (u_new - u) + 0.5 * (_event_sum(p_new.square()) - _event_sum(p.square()))
        log_u = torch.rand(chains, generator=generator, dtype=torch.float64).log().to(x.device)
        accept = log_u < -delta.double()  # NaN energies are rejected
        x = torch.where(_expand(accept, x), x_new, x)
        accepted += accept
        diverged += int((~torch.isfinite(u_new)).sum())
        out[t] = x
    _warn_divergences("pseudofermion_hmc", diverged, n_steps * chains, step_size)
    return Chains(out, accepted / n_steps, time.perf_counter() - start)
