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

from functools import partial

import torch
from torch import Tensor

from .._validation import check_number
from .mcmc import Chains, hmc_transition

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

    `target` is a theory with pseudofermions, [`YukawaStaggered`][flowkit.targets.YukawaStaggered] (any object
    with `sample_pseudofermions(x, generator)` and `pseudofermion_potential(x, chi)`); `x0` are starting scalar
    fields `(chains, L, L)` (float64 advised); the other settings are [`hmc`][flowkit.sampling.hmc]'s.

    Returns:
        [`Chains`][flowkit.sampling.Chains] of `n_steps` scalar fields per chain.
    """
    for name in ("sample_pseudofermions", "pseudofermion_potential"):
        if not callable(getattr(target, name, None)):
            raise ValueError(
                f"pseudofermion_hmc: target must have pseudofermions ({name}), e.g. flowkit.targets.YukawaStaggered; "
                f"got {type(target).__name__}"
            )
    step_size = check_number(step_size, "step_size", where="pseudofermion_hmc", positive=True)
    n_leapfrog = check_number(n_leapfrog, "n_leapfrog", where="pseudofermion_hmc", integer=True, low=1)
    jitter = check_number(jitter, "jitter", where="pseudofermion_hmc", low=0, below=1)

    def trajectory(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        pot = partial(target.pseudofermion_potential, chi=target.sample_pseudofermions(x, generator))
        x, _, _, accepted, diverged = hmc_transition(pot, x, *pot(x), step_size, n_leapfrog, jitter, generator)
        return x, accepted, diverged

    return Chains.run(trajectory, x0, n_steps, step_size, "pseudofermion_hmc")
