r"""Markov chains batched over independent chains: HMC, MALA, flow HMC, NeuTra MALA and flow IMH.

Every sampler here is asymptotically exact for the target $p \propto e^{-u}$:

- [`hmc`][flowkit.sampling.hmc]: Hamiltonian Monte Carlo with leapfrog steps and a
  Metropolis test on $H = u(x) + |p|^2/2$. The step size is *jittered* by default
  (drawn per trajectory and chain from $\epsilon\,U(1 - j, 1 + j)$): with a
  fixed trajectory length $\epsilon n$, a near-harmonic mode whose leapfrog
  rotation over a trajectory is a multiple of $\pi$ never changes its amplitude,
  and the chain is not ergodic (Mackenzie 1989);
- [`mala`][flowkit.sampling.mala]: the Metropolis-adjusted Langevin algorithm;
- [`flow_hmc`][flowkit.sampling.flow_hmc] and [`neutra_mala`][flowkit.sampling.neutra_mala]:
  the same chains in the latent space of a flow $x = T(z)$, on the pulled-back energy
  ([`latent_energy`][flowkit.sampling.latent_energy])

  $$\tilde u(z) = u(T(z)) - \log|\det J_T(z)|,$$

  whose density $e^{-\tilde u}$ is exactly the target's law of $z = T^{-1}(x)$
  (Hoffman et al. 2019, NeuTra; Foreman et al. 2021, flow HMC);
- [`independent_metropolis`][flowkit.sampling.independent_metropolis]: the flow as an
  independence proposal, accepted with probability $\min(1, w(x')/w(x))$, $w = e^{-u}/q$.

Each returns [`Chains`][flowkit.sampling.Chains]: the states `(n_steps, chains, *event_shape)`,
the acceptance per chain and the wall time. The
[`integrated_autocorrelation_time`][flowkit.sampling.integrated_autocorrelation_time]
of an observable uses the automatic window of Madras & Sokal (1988).

References:
    Duane, Kennedy, Pendleton & Roweth, *Hybrid Monte Carlo*, Phys. Lett. B 195 (1987);
    Mackenzie, *An improper behavior of the hybrid Monte Carlo algorithm*, Phys. Lett. B 226 (1989);
    Roberts & Tweedie, *Exponential convergence of Langevin distributions*, Bernoulli 2 (1996);
    Hoffman, Sountsov, Dillon, Langmore, Tran & Vasudevan, *NeuTra-lizing bad geometry in
    Hamiltonian Monte Carlo using neural transport*, arXiv:1903.03704 (2019);
    Foreman, Izubuchi, Jin, Jin, Mukherjee & Osborn, *HMC with normalizing flows*, arXiv:2112.01586 (2021);
    Albergo, Kanwar & Shanahan, PRD 100, 034515 (2019) (flow IMH);
    Madras & Sokal, *The pivot algorithm*, J. Stat. Phys. 50 (1988) (automatic window).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._validation import check_number
from ..domains import Real
from ..flows import Flow, FlowModel
from ..flows.base import require_exact_weights
from ..targets import Target
from ..utils import value_and_gradient
from .importance import _check_target, _weighted_samples

__all__ = [
    "Chains",
    "Potential",
    "potential",
    "latent_energy",
    "leapfrog",
    "hmc",
    "hmc_transition",
    "metropolis_transition",
    "mala",
    "flow_hmc",
    "neutra_mala",
    "independent_metropolis",
    "imh",
    "metropolis",
    "autocorrelation",
    "integrated_autocorrelation_time",
]

#: `potential(x) -> (u(x), grad u(x))`, batched over the leading dimensions, without graphs.
Potential = Callable[[Tensor], tuple[Tensor, Tensor]]


@dataclass
class Chains:
    """The states of a batch of Markov chains.

    Attributes:
        samples: states `(n_steps, chains, *event_shape)` (the starting points are not included).
        acceptance: fraction of accepted proposals, per chain, float64 `(chains,)`.
        seconds: wall time of the run.
        latent: for flow HMC and NeuTra, the latent states `z` with `samples = T(z)`, else `None`.
    """

    samples: Tensor
    acceptance: Tensor
    seconds: float
    latent: Tensor | None = None

    @property
    def mean_acceptance(self) -> float:
        """The acceptance averaged over the chains."""
        return float(self.acceptance.mean())


def potential(energy: Target | Callable[[Tensor], Tensor]) -> Potential:
    """The potential `x -> (u(x), grad u(x))` of a target (its force) or of an energy function (autograd)."""
    if isinstance(energy, Target):

        def target_potential(x: Tensor) -> tuple[Tensor, Tensor]:
            return energy.energy(x).detach(), -energy.force(x)

        return target_potential
    if not callable(energy):
        raise ValueError(f"potential: energy must be a Target or a callable, got {type(energy).__name__}")

    def autograd_potential(x: Tensor) -> tuple[Tensor, Tensor]:
        return value_and_gradient(energy, x)

    return autograd_potential


def latent_energy(flow: Flow, target: Target) -> Callable[[Tensor], Tensor]:
    r"""The target pulled back to a flow's latent space: $\tilde u(z) = u(T(z)) - \log|\det J_T(z)|$.

    $T$ is the flow's sampling map `flow.bijector.inverse`. $e^{-\tilde u}$
    is, up to the target's $Z$, the density of $z = T^{-1}(x)$ for $x \sim p$;
    when the flow is exact it is the base density up to a constant. Non-finite
    latent points (a diverging trajectory) get the energy `+inf`.

    Arguments:
        flow: a [`Flow`][flowkit.flows.Flow] with the target's event shape.
        target: the [`Target`][flowkit.targets.Target].

    Returns:
        A differentiable function `z -> u~(z)` of latent points `(..., *event_shape)`.

    Raises:
        ValueError: for a model that is not one exact bijection over a base (a free-form flow, whose decoder
            has no tractable log-determinant; a stochastic flow), or a target of another event shape.
    """
    _check_target(flow, target, "latent_energy")
    require_exact_weights(flow, "latent_energy", density=True)
    if getattr(flow, "bijector", None) is None:
        raise ValueError(
            f"latent_energy: needs a Flow (a bijector over a base) to pull the target back, got {type(flow).__name__}"
        )

    dims = len(flow.event_shape)

    def energy(z: Tensor) -> Tensor:
        # A diverging leapfrog trajectory leaves the reals: its energy is +inf (the proposal is rejected).
        bad = ~torch.isfinite(z).flatten(z.dim() - dims).all(-1)
        if bool(bad.any()):
            z = torch.where(bad.reshape(*bad.shape, *(1,) * dims), torch.zeros_like(z), z)
        x, ladj = flow.bijector.inverse(z)
        u = target.energy(x) - ladj
        return torch.where(bad, torch.full_like(u, math.inf), u)

    return energy


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
        diverged |= ~torch.isfinite(moved).flatten(1).all(-1)
        x = torch.where(_expand(diverged, x), x, moved)  # a diverged chain stays where it was finite
        u, grad = potential(x)
        diverged |= ~(torch.isfinite(u) & torch.isfinite(grad).flatten(1).all(-1))
        p = p - (step_size if i < n_steps - 1 else 0.5 * step_size) * grad
    u = torch.where(diverged, torch.full_like(u, math.inf), u)
    return x, p, u, grad


def _check_start(x0: Tensor, where: str) -> Tensor:
    if not isinstance(x0, Tensor) or not x0.is_floating_point() or x0.dim() < 2:
        raise ValueError(f"{where}: x0 must be a floating tensor (chains, *event_shape)")
    if not bool(torch.isfinite(x0).all()):
        raise ValueError(f"{where}: x0 contains non-finite values")
    return x0.detach()


def _event_sum(t: Tensor) -> Tensor:
    return t.flatten(1).sum(-1)


def hmc(
    energy: Target | Callable[[Tensor], Tensor],
    x0: Tensor,
    n_steps: int,
    step_size: float = 0.1,
    n_leapfrog: int = 10,
    jitter: float = 0.2,
    generator: torch.Generator | None = None,
) -> Chains:
    r"""Hamiltonian Monte Carlo, batched over chains, with a jittered step size.

    Each trajectory draws $p \sim N(0, I)$ and a step size
    $\epsilon_t = \epsilon\, U(1 - j, 1 + j)$ per chain, takes `n_leapfrog`
    leapfrog steps and accepts with probability $\min(1, e^{-\Delta H})$. The
    jitter keeps the chain ergodic for near-harmonic modes (`jitter=0` is plain
    fixed-length HMC, which is not).

    Arguments:
        energy: a [`Target`][flowkit.targets.Target] (its analytic force is used) or a
            differentiable energy function `u(x)` of batches `(chains, *event_shape)`.
        x0: starting points `(chains, *event_shape)`; their dtype is the chains'.
        n_steps: number of trajectories per chain.
        step_size: the mean leapfrog step size $\epsilon$.
        n_leapfrog: leapfrog steps per trajectory.
        jitter: relative half-width $j \in [0, 1)$ of the step-size distribution.
        generator: random generator of momenta, step sizes and accept draws.

    Returns:
        [`Chains`][flowkit.sampling.Chains] of `n_steps` states per chain.
    """
    settings = _checked_settings("hmc", n_steps, step_size, n_leapfrog, jitter)
    return _hmc(potential(energy), _check_start(x0, "hmc"), *settings, generator)


def _checked_settings(
    where: str, n_steps: int, step_size: float, n_leapfrog: int = 1, jitter: float = 0.0
) -> tuple[int, float, int, float]:
    """A sampler's `(n_steps, step_size, n_leapfrog, jitter)`, checked."""
    return (
        check_number(n_steps, "n_steps", where=where, integer=True, low=1),
        check_number(step_size, "step_size", where=where, positive=True),
        check_number(n_leapfrog, "n_leapfrog", where=where, integer=True, low=1),
        check_number(jitter, "jitter", where=where, low=0, below=1),
    )


def _hmc(
    pot: Potential,
    x: Tensor,
    n_steps: int,
    step_size: float,
    n_leapfrog: int,
    jitter: float,
    generator: torch.Generator | None,
    where: str = "hmc",
) -> Chains:
    start = time.perf_counter()
    chains = x.shape[0]
    u, grad = pot(x)
    out = x.new_empty(n_steps, *x.shape)
    accepted = torch.zeros(chains, dtype=torch.float64, device=x.device)
    diverged = 0
    for t in range(n_steps):
        x, u, grad, accept, proposal_diverged = hmc_transition(
            pot, x, u, grad, step_size, n_leapfrog, jitter, generator
        )
        accepted += accept
        diverged += int(proposal_diverged.sum())
        out[t] = x
    _warn_divergences(where, diverged, n_steps * chains, step_size)
    return Chains(out, accepted / n_steps, time.perf_counter() - start)


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
    along a chain (annealed importance sampling) call it with their own potential.

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
    delta = (u_new - u) + 0.5 * (_event_sum(p_new.square()) - _event_sum(p.square()))
    log_u = torch.rand(chains, generator=generator, dtype=torch.float64).log().to(x.device)
    accept = log_u < -delta.double()  # NaN energies are rejected
    x = torch.where(_expand(accept, x), x_new, x)
    u = torch.where(accept, u_new, u)
    grad = torch.where(_expand(accept, x), grad_new, grad)
    return x, u, grad, accept, ~torch.isfinite(u_new)


def _warn_divergences(where: str, diverged: int, trajectories: int, step_size: float) -> None:
    """Say how many trajectories diverged (and were rejected), naming the step size."""
    if diverged:
        warnings.warn(
            f"{where}: {diverged} of {trajectories} proposals diverged (a non-finite position, energy or "
            f"gradient) and were rejected; step_size={step_size:g} is too large for this target there",
            RuntimeWarning,
            stacklevel=3,
        )


def _expand(mask: Tensor, like: Tensor) -> Tensor:
    return mask.reshape(-1, *(1,) * (like.dim() - 1))


def mala(
    energy: Target | Callable[[Tensor], Tensor],
    x0: Tensor,
    n_steps: int,
    step_size: float = 0.1,
    generator: torch.Generator | None = None,
) -> Chains:
    r"""Metropolis-adjusted Langevin algorithm, batched over chains.

    Proposes $x' = x - \frac{\epsilon^2}2 \nabla u(x) + \epsilon\,\xi$, $\xi \sim N(0, I)$,
    and accepts with probability $\min\big(1, \frac{p(x')\, q(x \mid x')}{p(x)\, q(x' \mid x)}\big)$.

    Arguments:
        energy: a [`Target`][flowkit.targets.Target] or a differentiable energy function.
        x0: starting points `(chains, *event_shape)`.
        n_steps: number of steps per chain.
        step_size: $\epsilon$.
        generator: random generator of the noise and accept draws.

    Returns:
        [`Chains`][flowkit.sampling.Chains] of `n_steps` states per chain.
    """
    n_steps, step_size, _, _ = _checked_settings("mala", n_steps, step_size)
    return _mala(potential(energy), _check_start(x0, "mala"), n_steps, step_size, generator)


def _mala(
    pot: Potential, x: Tensor, n_steps: int, eps: float, generator: torch.Generator | None, where: str = "mala"
) -> Chains:
    start = time.perf_counter()
    chains = x.shape[0]
    u, grad = pot(x)
    out = x.new_empty(n_steps, *x.shape)
    accepted = torch.zeros(chains, dtype=torch.float64, device=x.device)
    divergences = 0

    def log_q(to: Tensor, frm: Tensor, grad_frm: Tensor) -> Tensor:
        return -_event_sum((to - frm + 0.5 * eps * eps * grad_frm).square()) / (2 * eps * eps)

    for t in range(n_steps):
        noise = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        x_new = x - 0.5 * eps * eps * grad + eps * noise
        # A proposal that leaves the finite numbers is never evaluated: it stays at x with infinite energy (rejected).
        diverged = ~torch.isfinite(x_new).flatten(1).all(-1)
        x_new = torch.where(_expand(diverged, x), x, x_new)
        u_new, grad_new = pot(x_new)
        diverged |= ~(torch.isfinite(u_new) & torch.isfinite(grad_new).flatten(1).all(-1))
        u_new = torch.where(diverged, torch.full_like(u_new, math.inf), u_new)
        divergences += int(diverged.sum())
        log_ratio = (u - u_new) + log_q(x, x_new, grad_new) - log_q(x_new, x, grad)
        log_u = torch.rand(chains, generator=generator, dtype=torch.float64).log().to(x.device)
        accept = log_u < log_ratio.double()
        x = torch.where(_expand(accept, x), x_new, x)
        u = torch.where(accept, u_new, u)
        grad = torch.where(_expand(accept, x), grad_new, grad)
        accepted += accept
        out[t] = x
    _warn_divergences(where, divergences, n_steps * chains, eps)
    return Chains(out, accepted / n_steps, time.perf_counter() - start)


def _in_latent_space(
    flow: Flow,
    target: Target,
    chains: int,
    z0: Tensor | None,
    where: str,
    sampler: Callable[[Potential, Tensor], Chains],
) -> Chains:
    """Run `sampler(potential, z0)` on the flow's latent energy; the states are mapped back to the data space."""
    require_exact_weights(flow, where, density=True)  # before latent_energy asks, to name the caller
    energy = latent_energy(flow, target)
    if z0 is not None:
        z = _check_start(z0, where)
    else:
        chains = check_number(chains, "chains", where=where, integer=True, low=1)
        with torch.no_grad():
            z = flow.base.sample((chains,))
    run = sampler(potential(energy), z)
    n = run.samples.shape[0]
    with torch.no_grad():
        samples = flow.bijector.inverse(run.samples.flatten(0, 1))[0].unflatten(0, (n, -1))
    return Chains(samples, run.acceptance, run.seconds, latent=run.samples)


def flow_hmc(
    flow: Flow,
    target: Target,
    n_steps: int,
    chains: int = 1,
    step_size: float = 0.1,
    n_leapfrog: int = 10,
    jitter: float = 0.2,
    z0: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Chains:
    r"""HMC in a flow's latent space, on $\tilde u(z) = u(T(z)) - \log|\det J_T(z)|$; states mapped back by $T$.

    The gradient of $\tilde u$ is taken by autograd through the flow. A
    good flow makes $\tilde u$ close to the base energy $|z|^2/2$, so that
    large step sizes are accepted (Foreman et al. 2021).

    Arguments:
        flow: a [`Flow`][flowkit.flows.Flow] with the target's event shape.
        target: the [`Target`][flowkit.targets.Target].
        n_steps: trajectories per chain.
        chains: number of chains (when `z0` is not given: then they start at base samples).
        step_size: the mean leapfrog step size in latent space.
        n_leapfrog: leapfrog steps per trajectory.
        jitter: relative half-width of the step-size distribution (see [`hmc`][flowkit.sampling.hmc]).
        z0: latent starting points `(chains, *event_shape)`.
        generator: random generator.

    Returns:
        [`Chains`][flowkit.sampling.Chains] with `samples = T(latent)`.
    """
    settings = _checked_settings("flow_hmc", n_steps, step_size, n_leapfrog, jitter)
    return _in_latent_space(
        flow, target, chains, z0, "flow_hmc", lambda u, z: _hmc(u, z, *settings, generator, "flow_hmc")
    )


def neutra_mala(
    flow: Flow,
    target: Target,
    n_steps: int,
    chains: int = 1,
    step_size: float = 0.5,
    z0: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Chains:
    r"""NeuTra: MALA in a flow's latent space on $\tilde u(z)$ (see [`latent_energy`][flowkit.sampling.latent_energy]).

    With the identity map this is [`mala`][flowkit.sampling.mala] on the target itself.

    Arguments:
        flow: a [`Flow`][flowkit.flows.Flow] with the target's event shape.
        target: the [`Target`][flowkit.targets.Target].
        n_steps: steps per chain.
        chains: number of chains (when `z0` is not given).
        step_size: the Langevin step size in latent space.
        z0: latent starting points `(chains, *event_shape)`.
        generator: random generator.

    Returns:
        [`Chains`][flowkit.sampling.Chains] with `samples = T(latent)`.
    """
    n, eps, _, _ = _checked_settings("neutra_mala", n_steps, step_size)
    return _in_latent_space(
        flow, target, chains, z0, "neutra_mala", lambda u, z: _mala(u, z, n, eps, generator, "neutra_mala")
    )


@torch.no_grad()
def independent_metropolis(
    flow: FlowModel,
    target: Target,
    n_steps: int,
    chains: int = 1,
    batch_size: int = 10_000,
    generator: torch.Generator | None = None,
) -> Chains:
    r"""Independent Metropolis-Hastings with the flow as proposal, batched over chains.

    Each chain starts at its first proposal of non-zero weight (the states
    before it repeat it, so no state has zero density) and then replaces its
    state $x$ by a fresh proposal $x' \sim q$ with probability
    $\min(1, w(x')/w(x))$, $w = e^{-u}/q$. With $q = p$ every proposal is accepted.

    Arguments:
        flow: the proposal flow (a [`StochasticFlow`][flowkit.stochastic.StochasticFlow] uses its path weights).
        target: the [`Target`][flowkit.targets.Target].
        n_steps: proposals per chain (the first one of non-zero weight is the starting state).
        chains: number of independent chains.
        batch_size: proposals drawn per pass.
        generator: random generator of the accept draws.

    Returns:
        [`Chains`][flowkit.sampling.Chains]; the acceptance counts the proposals after each chain's starting one.

    Raises:
        ValueError: when every proposal of some chain has zero weight under the target, or for a flow whose
            samples do not come from its density (a free-form flow, whose acceptance ratios would be wrong).
    """
    n_steps = check_number(n_steps, "n_steps", where="independent_metropolis", integer=True, low=2)
    chains = check_number(chains, "chains", where="independent_metropolis", integer=True, low=1)
    start = time.perf_counter()
    proposals, log_w = _weighted_samples(flow, target, n_steps * chains, batch_size, "independent_metropolis")
    proposals = proposals.unflatten(0, (n_steps, chains))
    lw = log_w.reshape(n_steps, chains).cpu().numpy()
    log_u = torch.rand(n_steps, chains, generator=generator, dtype=torch.float64).log().numpy()
    finite = np.isfinite(lw)
    if not finite.any(0).all():
        bad = np.flatnonzero(~finite.any(0)).tolist()
        raise ValueError(f"independent_metropolis: every proposal of chain(s) {bad} has zero weight under the target")
    first = finite.argmax(0)  # each chain's starting state: its first proposal of non-zero weight
    index = np.empty((n_steps, chains), dtype=np.int64)
    current, columns = first.copy(), np.arange(chains)
    index[0] = current
    accepted = np.zeros(chains)
    for t in range(1, n_steps):
        accept = (t > first) & (log_u[t] < lw[t] - lw[current, columns])
        current = np.where(accept, t, current)
        accepted += accept
        index[t] = current
    samples = proposals[torch.from_numpy(index).to(proposals.device), torch.from_numpy(columns).to(proposals.device)]
    acceptance = torch.from_numpy(accepted / np.maximum(n_steps - 1 - first, 1))
    return Chains(samples, acceptance, time.perf_counter() - start)


def autocorrelation(series: Tensor) -> Tensor:
    r"""Normalised autocorrelation function $\rho(t)$ of a scalar series, averaged over chains.

    Arguments:
        series: values `(n_steps,)` or `(n_steps, chains)` (one series per chain).

    Returns:
        float64 $\rho(t)$ for $t = 0, \dots, n - 1$ with $\rho(0) = 1$ (zeros for a constant series).
    """
    x = _series(series, "autocorrelation")
    n = x.shape[0]
    x = x - x.mean(0)
    spectrum = torch.fft.rfft(x, n=2 * n, dim=0)
    acov = torch.fft.irfft(spectrum.abs().square(), n=2 * n, dim=0)[:n].mean(1) / n
    if not float(acov[0]) > 0:
        return torch.zeros(n, dtype=torch.float64)
    return acov / acov[0]


def integrated_autocorrelation_time(series: Tensor, c: float = 5.0) -> float:
    r"""Integrated autocorrelation time $\tau_{int} = \frac12 + \sum_{t=1}^{W} \rho(t)$, with an automatic window.

    The window $W$ is the smallest with $W \ge c\, \tau_{int}(W)$ (Madras & Sokal
    1988; $c \approx 4$-$6$). With this convention the variance of a chain
    mean is $2\tau_{int}\,\sigma^2 / N$: independent samples have
    $\tau_{int} = 1/2$ and the effective sample size is $N / (2\tau_{int})$.

    Arguments:
        series: values `(n_steps,)` or `(n_steps, chains)`.
        c: the window factor.

    Returns:
        $\tau_{int}$ (`nan` for a constant series, `inf` when no window fits the chain).
    """
    c = check_number(c, "c", where="integrated_autocorrelation_time", positive=True)
    rho = autocorrelation(series)
    if not float(rho[0]) > 0:
        return math.nan
    taus = 0.5 + torch.cumsum(rho[1:], 0)  # tau(W) for W = 1, ..., n - 1
    windows = torch.arange(1, rho.numel(), dtype=torch.float64)
    fits = torch.nonzero(windows >= c * taus).flatten()
    return float(taus[fits[0]]) if fits.numel() else math.inf


def _series(series: Tensor, where: str) -> Tensor:
    if not isinstance(series, Tensor) or series.dim() not in (1, 2) or series.shape[0] < 2:
        raise ValueError(f"{where}: series must be a tensor (n_steps,) or (n_steps, chains) with n_steps >= 2")
    if not bool(torch.isfinite(series).all()):
        raise ValueError(f"{where}: series contains non-finite values")
    x = series.detach().double().cpu()
    return x[:, None] if x.dim() == 1 else x


@torch.no_grad()
def imh(
    flow: FlowModel, target: Target, n_steps: int, batch_size: int = 10_000, generator: torch.Generator | None = None
) -> tuple[Tensor, float]:
    r"""Independent Metropolis-Hastings with the flow as proposal (one chain of `independent_metropolis`).

    A proposal $x' \sim q$ replaces the state $x$ with probability
    $\min(1, w(x') / w(x))$, $w = e^{-u}/q$; the chain has the
    target as its stationary law, so averages over it are asymptotically
    exact even when the flow is not. The chain starts at the first proposal
    of non-zero weight.

    Arguments:
        flow: the proposal flow (stochastic flows use their path weights).
        target: the target.
        n_steps: chain length (number of proposals).
        batch_size: proposals drawn per pass.
        generator: random generator of the accept/reject draws.

    Returns:
        `(chain, acceptance)`: the states `(n_steps, *event_shape)` and the
        fraction of the proposals after the starting one that were accepted; the same as
        [`independent_metropolis`][flowkit.sampling.independent_metropolis] with one chain.
    """
    if n_steps < 2:
        raise ValueError(f"imh: n_steps must be at least 2, got {n_steps}")
    run = independent_metropolis(flow, target, n_steps, chains=1, batch_size=batch_size, generator=generator)
    return run.samples[:, 0], float(run.acceptance[0])


@torch.no_grad()
def metropolis(
    target: Target,
    x0: Tensor,
    n_steps: int,
    step: float,
    domain: Any = None,
    thin: int = 1,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, float]:
    r"""Random-walk Metropolis chains on the target's domain: a reference sampler independent of any flow.

    Every chain (one per row of `x0`) moves by the domain's symmetric proposal
    ([`propose`][flowkit.domains.Domain.propose]: a Gaussian step on the real line,
    wrapped on circles, renormalised on spheres) and accepts with probability
    $\min(1, e^{u(x) - u(x')})$, so it targets $e^{-u}$ against the domain's volume
    measure (the area measure on $S^3$).

    Arguments:
        target: the target.
        x0: starting points `(chains, *event_shape)` on the domain.
        n_steps: the number of moves per chain.
        step: the proposal scale.
        domain: a [`Domain`][flowkit.domains.Domain] (default: the real line).
        thin: keep every `thin`-th state.
        generator: random generator of the proposals and the accept draws.

    Returns:
        `(states, acceptance)`: `(n_steps // thin, chains, *event_shape)` and the fraction of accepted moves.
    """
    if not isinstance(target, Target):
        raise ValueError(f"metropolis: target must be a flowkit.targets.Target, got {type(target).__name__}")
    if n_steps < 1 or thin < 1 or not step > 0:
        raise ValueError(f"metropolis: n_steps and thin must be positive and step > 0, got {n_steps}, {thin}, {step}")
    domain = Real() if domain is None else domain
    x = x0.detach().clone()
    u = target.energy(x)
    kept, accepted = [], 0.0
    for t in range(n_steps):
        x, u, accept = metropolis_transition(target.energy, x, u, step, domain, generator)
        accepted += float(accept.double().mean())
        if (t + 1) % thin == 0:
            kept.append(x.clone())
    return torch.stack(kept), accepted / n_steps


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
    probability $\min(1, e^{u(x) - u(x')})$ (a NaN energy is rejected), which leaves $e^{-u}$ invariant.

    Arguments:
        energy: `x -> u(x)`, batched.
        x: the current states `(chains, *event_shape)`.
        u: `u(x)`, `(chains,)`.
        step: the proposal scale.
        domain: a [`Domain`][flowkit.domains.Domain] (default: the real line).
        generator: random generator of the proposals and the accept draws.

    Returns:
        `(x, u, accepted)`: the new states, their energies and a boolean mask of the accepted moves.
    """
    domain = Real() if domain is None else domain
    y = domain.propose(x, step, generator)
    u_y = energy(y)
    log_r = torch.rand(u.shape, dtype=u.dtype, generator=generator).to(u.device).log()
    accept = log_r < u - u_y
    x = torch.where(accept.reshape(*accept.shape, *([1] * (x.dim() - accept.dim()))), y, x)
    u = torch.where(accept, u_y, u)
    return x, u, accept
