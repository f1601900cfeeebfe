r"""Markov transition kernels: one move of a batch of chains, the single steps every sampler is built on.

[`metropolis_transition`][flowkit.sampling.metropolis_transition] (a symmetric proposal of the domain),
[`langevin_transition`][flowkit.sampling.langevin_transition] (overdamped Langevin, Metropolis-adjusted or not)
and [`hmc_transition`][flowkit.sampling.hmc_transition] (a trajectory of [`leapfrog`][flowkit.sampling.leapfrog]
steps and its Metropolis test) leave $e^{-u}$ invariant, or, unadjusted, return the log ratio of the backward to
the forward transition density, the path-weight increment of a stochastic normalizing flow. The samplers of
[`flowkit.sampling`][flowkit.sampling], which exports these names, run them along chains; the stochastic blocks
of [`flowkit.flows.stochastic`][flowkit.flows.stochastic] make their moves with them.

References:
    Roberts & Tweedie, *Exponential convergence of Langevin distributions*, Bernoulli 2 (1996);
    Wu, Köhler & Noé, *Stochastic Normalizing Flows*, NeurIPS 2020 (arXiv:2002.06707).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ._validation import check_number
from .domains import Real
from .utils import sum_event

__all__ = ["Potential", "leapfrog", "hmc_transition", "metropolis_transition", "langevin_transition"]

#: `potential(x) -> (u(x), grad u(x))`, batched over the leading dimensions.
Potential = Callable[[Tensor], tuple[Tensor, Tensor]]


def _expand(mask: Tensor, like: Tensor) -> Tensor:
    """A batch-shaped mask `(chains,)` or `(*batch,)` viewed to broadcast against `like`'s events."""
    return mask.reshape(*mask.shape, *(1,) * (like.dim() - mask.dim()))


def _finite(t: Tensor, batch_dims: int) -> Tensor:
    """Whether every number of each event of `t` is finite, batch-shaped."""
    return torch.isfinite(t).flatten(batch_dims).all(-1)


def leapfrog(
    x: Tensor, p: Tensor, step_size: Tensor | float, n_steps: int, potential: Potential, grad: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""`n_steps` leapfrog steps of $\dot x = p$, $\dot p = -\nabla u(x)$ (volume preserving and reversible).

    Arguments:
        x: positions `(chains, *event_shape)`.
        p: momenta, same shape.
        step_size: a number or a tensor broadcastable to `x` (one step size per chain).
        n_steps: number of steps (at least 1).
        potential: `x -> (u(x), grad u(x))`.
        grad: $\nabla u(x)$ when already known (saves one evaluation).

    Returns:
        `(x, p, u(x), grad u(x))` at the end of the trajectory. A trajectory that diverges (a position,
        energy or gradient not finite: a step size too large for the potential) stops at its last finite
        position with $u = +\infty$, so that a Metropolis test rejects it; the potential is never
        evaluated at a non-finite point.
    """
    n_steps = check_number(n_steps, "n_steps", where="leapfrog", integer=True, low=1)
    if grad is None:
        _, grad = potential(x)
    diverged = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    p = p - 0.5 * step_size * grad
    for i in range(n_steps):
        moved = x + step_size * p
        diverged |= ~_finite(moved, 1)
        x = torch.where(_expand(diverged, x), x, moved)  # a diverged chain stays where it was finite
        u, grad = potential(x)
        diverged |= ~(torch.isfinite(u) & _finite(grad, 1))
        p = p - (step_size if i < n_steps - 1 else 0.5 * step_size) * grad
    u = torch.where(diverged, torch.full_like(u, math.inf), u)
    return x, p, u, grad


def hmc_transition(
    pot: Potential,
    x: Tensor,
    u: Tensor,
    grad: Tensor,
    step_size: float,
    n_leapfrog: int,
    jitter: float = 0.0,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    r"""One HMC trajectory per chain from `x` (where `pot` gave `u` and `grad`), with its Metropolis test.

    The kernel of [`hmc`][flowkit.sampling.hmc], one step of it: momenta $p \sim N(0, I)$, a step size
    $\epsilon\, U(1 - j, 1 + j)$ per chain, `n_leapfrog` leapfrog steps and acceptance with probability
    $\min(1, e^{-\Delta H})$; it leaves $e^{-u}$ invariant. Samplers that carry more than the potential
    along a chain (annealed importance sampling, pseudofermions) call it with their own potential.

    Arguments:
        pot: the potential `x -> (u(x), grad u(x))`.
        x: the current states `(chains, *event_shape)`.
        u: `u(x)`, `(chains,)`.
        grad: `grad u(x)`, shape of `x`.
        step_size: the mean leapfrog step size.
        n_leapfrog: leapfrog steps of the trajectory.
        jitter: relative half-width of the step-size distribution.
        generator: random generator of momenta, step sizes and accept draws.

    Returns:
        `(x, u, grad, accepted, diverged)`: the new states with their potential and gradient, a boolean
        mask of the accepted proposals and one of the proposals that diverged (rejected).
    """
    chains = x.shape[0]
    ones = (1,) * (x.dim() - 1)
    p = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
    eps = step_size * (1 + jitter * (2 * torch.rand(chains, generator=generator, dtype=x.dtype) - 1))
    x_new, p_new, u_new, grad_new = leapfrog(x, p, eps.to(x.device).reshape(chains, *ones), n_leapfrog, pot, grad)
    delta = (u_new - u) + 0.5 * (sum_event(p_new.square(), x.dim() - 1) - sum_event(p.square(), x.dim() - 1))
    log_u = torch.rand(chains, generator=generator, dtype=torch.float64).log().to(x.device)
    accept = log_u < -delta.double()  # NaN energies are rejected
    x = torch.where(_expand(accept, x), x_new, x)
    u = torch.where(accept, u_new, u)
    grad = torch.where(_expand(accept, x), grad_new, grad)
    return x, u, grad, accept, ~torch.isfinite(u_new)


def metropolis_transition(
    energy: Callable[[Tensor], Tensor],
    x: Tensor,
    u: Tensor,
    step: float,
    domain: Any = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""One random-walk Metropolis move per chain from `x` (of energy `u`): the kernel of `metropolis`.

    A symmetric proposal $x'$ of the domain ([`propose`][flowkit.domains.Domain.propose]) is accepted with
    probability $\min(1, e^{u(x) - u(x')})$ (a NaN energy is rejected), which leaves $e^{-u}$ invariant. The
    new energy keeps its graph (the accept indicator is a constant), for a stochastic flow's path weight.

    Arguments:
        energy: `x -> u(x)`, batched.
        x: the current states `(*batch, *event_shape)`.
        u: `u(x)`, batch-shaped.
        step: the proposal scale.
        domain: a [`Domain`][flowkit.domains.Domain] (default: the real line).
        generator: random generator of the proposals and the accept draws (default: the global one of the
            states' device).

    Returns:
        `(x, u, accepted)`: the new states, their energies and a boolean mask of the accepted moves.
    """
    domain = Real() if domain is None else domain
    y = domain.propose(x, step, generator)
    u_y = energy(y)
    device = u.device if generator is None else generator.device
    log_r = torch.rand(u.shape, dtype=u.dtype, generator=generator, device=device).to(u.device).log()
    accept = log_r < u - u_y
    return torch.where(_expand(accept, x), y, x), torch.where(accept, u_y, u), accept


def langevin_transition(
    pot: Potential,
    x: Tensor,
    u: Tensor,
    grad: Tensor,
    step_size: float,
    *,
    adjusted: bool = True,
    event_dims: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    r"""One overdamped Langevin move per chain from `x`, Metropolis-adjusted (MALA) or not.

    The proposal is $x' = x - \epsilon \nabla u(x) + \sqrt{2\epsilon}\,\eta$, $\eta \sim N(0, I)$. The move
    back from $x'$ would need the noise $\tilde\eta = (x - x' + \epsilon \nabla u(x'))/\sqrt{2\epsilon}$, so
    $\log q(x' \to x) - \log q(x \to x') = \tfrac12 (|\eta|^2 - |\tilde\eta|^2)$. Adjusted, $x'$ is accepted
    with probability $\min\big(1, e^{u(x) - u(x')} q(x' \to x)/q(x \to x')\big)$, which leaves $e^{-u}$
    invariant; a proposal that leaves the finite numbers stays at $x$ with infinite energy (rejected).
    Unadjusted, every move is made, and the log ratio is the path-weight increment of a stochastic
    normalizing flow (exact for any step size); gradients then flow through the move.

    Arguments:
        pot: the potential `x -> (u(x), grad u(x))`.
        x: the current states `(*batch, *event_shape)`.
        u: `u(x)`, batch-shaped.
        grad: `grad u(x)`, shape of `x`.
        step_size: the time step $\epsilon$ (MALA's $h$ of the proposal $x - \frac{h^2}2 \nabla u + h\xi$ is
            $\sqrt{2\epsilon}$).
        adjusted: make the Metropolis test.
        event_dims: the number of event dimensions (default: all but the first).
        generator: random generator of the noise and the accept draws.

    Returns:
        `(x, u, grad, accepted, diverged, log_ratio)`: the new states with their potential and gradient,
        boolean masks of the accepted and of the diverged proposals, and
        $\log q(x' \to x) - \log q(x \to x')$ of the proposal.
    """
    batch_dims = 1 if event_dims is None else x.dim() - event_dims
    noise_scale = math.sqrt(2.0 * step_size)
    eta = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
    x_new = x - step_size * grad + noise_scale * eta
    if adjusted:  # a proposal that leaves the finite numbers is never evaluated
        diverged = ~_finite(x_new, batch_dims)
        x_new = torch.where(_expand(diverged, x), x, x_new)
    u_new, grad_new = pot(x_new)
    if adjusted:
        diverged |= ~(torch.isfinite(u_new) & _finite(grad_new, batch_dims))
        u_new = torch.where(diverged, torch.full_like(u_new, math.inf), u_new)
    else:
        diverged = ~torch.isfinite(u_new)
    eta_back = (x - x_new + step_size * grad_new) / noise_scale
    log_ratio = 0.5 * sum_event(eta.square() - eta_back.square(), x.dim() - batch_dims)
    if not adjusted:
        return x_new, u_new, grad_new, torch.ones_like(diverged), diverged, log_ratio
    log_u = torch.rand(u.shape, generator=generator, dtype=torch.float64).log().to(x.device)
    accept = log_u < ((u - u_new) + log_ratio).double()
    x = torch.where(_expand(accept, x), x_new, x)
    grad = torch.where(_expand(accept, x), grad_new, grad)
    return x, torch.where(accept, u_new, u), grad, accept, diverged, log_ratio
