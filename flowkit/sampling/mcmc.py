r"""Markov chains batched over independent chains: HMC, MALA, flow HMC, NeuTra MALA and flow IMH.

Every sampler here is asymptotically exact for the target $p \propto e^{-u}$:

- [`hmc`][flowkit.sampling.hmc]: Hamiltonian Monte Carlo, leapfrog steps and a Metropolis test on
  $H = u(x) + |p|^2/2$, its step size *jittered* per trajectory and chain, $\epsilon\,U(1 - j, 1 + j)$: at a
  fixed trajectory length, a near-harmonic mode whose rotation is a multiple of $\pi$ never changes its
  amplitude and the chain is not ergodic (Mackenzie 1989);
- [`mala`][flowkit.sampling.mala]: the Metropolis-adjusted Langevin algorithm;
- [`flow_hmc`][flowkit.sampling.flow_hmc] and [`neutra_mala`][flowkit.sampling.neutra_mala]: the same chains
  in a flow's latent space on the pulled-back energy [`latent_energy`][flowkit.sampling.latent_energy]
  $\tilde u(z) = u(T(z)) - \log|\det J_T(z)|$ (Hoffman et al. 2019, NeuTra; Foreman et al. 2021);
- [`independent_metropolis`][flowkit.sampling.independent_metropolis]: the flow as an independence proposal,
  accepted with probability $\min(1, w(x')/w(x))$, $w = e^{-u}/q$ (flow IMH; `imh` is deprecated).

Their single moves (`hmc_transition`, ...) live in `flowkit.transitions`. Each sampler returns
[`Chains`][flowkit.sampling.Chains];
[`integrated_autocorrelation_time`][flowkit.sampling.integrated_autocorrelation_time] uses the automatic
window of Madras & Sokal (1988).

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
from ..transitions import Potential, hmc_transition, langevin_transition, leapfrog, metropolis_transition
from ..utils import value_and_gradient
from .importance import _weighted_samples, check_target

__all__ = [
    "Chains",
    "Potential",
    "potential",
    "latent_energy",
    "leapfrog",
    "hmc",
    "hmc_transition",
    "metropolis_transition",
    "langevin_transition",
    "mala",
    "flow_hmc",
    "neutra_mala",
    "independent_metropolis",
    "imh",
    "metropolis",
    "autocorrelation",
    "integrated_autocorrelation_time",
]


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

    @classmethod
    def run(
        cls,
        transition: Callable[..., tuple[Tensor, ...]],
        x0: Tensor,
        n_steps: int,
        step_size: float,
        where: str,
        start: Callable[[Tensor], tuple[Tensor, ...]] | None = None,
    ) -> Chains:
        """Make `n_steps` moves of a batch of chains from `x0` and keep their positions.

        `transition` moves every chain, `(*state) -> (*state, accepted, diverged)`, the state's first tensor
        the positions; `start` makes the state from `x0` (default `(x0,)`), e.g. `(x0, u(x0), grad u(x0))`;
        `step_size` is named when proposals diverge and `where` starts errors and warnings.
        """
        n_steps = check_number(n_steps, "n_steps", where=where, integer=True, low=1)
        begin = time.perf_counter()
        if not isinstance(x0, Tensor) or not x0.is_floating_point() or x0.dim() < 2:
            raise ValueError(f"{where}: x0 must be a floating tensor (chains, *event_shape)")
        if not bool(torch.isfinite(x0).all()):
            raise ValueError(f"{where}: x0 contains non-finite values")
        x = x0.detach()
        state = (x,) if start is None else start(x)
        out = x.new_empty(n_steps, *x.shape)
        accepted = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
        diverged = 0
        for t in range(n_steps):
            *state, accept, proposal_diverged = transition(*state)
            accepted += accept
            diverged += int(proposal_diverged.sum())
            out[t] = state[0]
        if diverged:
            warnings.warn(
                f"{where}: {diverged} of {n_steps * x.shape[0]} proposals diverged (a non-finite position, energy "
                f"or gradient) and were rejected; step_size={step_size:g} is too large for this target there",
                RuntimeWarning,
                stacklevel=3,
            )
        return cls(out, accepted / n_steps, time.perf_counter() - begin)


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

    $T$ is the sampling map of a bijective flow; $e^{-\tilde u}$ is, up to the target's $Z$, the density of
    $z = T^{-1}(x)$ for $x \sim p$. Non-finite latent points (a diverging trajectory), and latent points that the map
    sends out of the reals, get the energy `+inf`.

    Returns:
        A differentiable function `z -> u~(z)` of latent points `(..., *event_shape)`.

    Raises:
        ValueError: for a model that is not one exact bijection over a base (a free-form or stochastic flow),
            or a target of another event shape.
    """
    check_target(flow, target, "latent_energy")
    require_exact_weights(flow, "latent_energy", density=True)
    if not flow.bijective:
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
        # A finite latent point the map sends out of the reals (an overflowing scale) is rejected the same way.
        overflow = ~torch.isfinite(x).flatten(x.dim() - dims).all(-1)
        if bool(overflow.any()):
            bad = bad | overflow
            x = torch.where(overflow.reshape(*overflow.shape, *(1,) * dims), torch.zeros_like(x), x)
        u = target.energy(x) - ladj
        return torch.where(bad, torch.full_like(u, math.inf), u)

    return energy


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

    Each trajectory draws $p \sim N(0, I)$ and a step size $\epsilon_t = \epsilon\, U(1 - j, 1 + j)$ per chain,
    takes `n_leapfrog` leapfrog steps and accepts with probability $\min(1, e^{-\Delta H})$ (`jitter=0`: plain
    fixed-length HMC, not ergodic for near-harmonic modes).

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
    return _hmc(potential(energy), x0, n_steps, step_size, n_leapfrog, jitter, generator)


def _hmc(
    pot: Potential,
    x0: Tensor,
    n_steps: int,
    step_size: float,
    n_leapfrog: int,
    jitter: float,
    generator: torch.Generator | None,
    where: str = "hmc",
) -> Chains:
    step_size = check_number(step_size, "step_size", where=where, positive=True)
    n_leapfrog = check_number(n_leapfrog, "n_leapfrog", where=where, integer=True, low=1)
    jitter = check_number(jitter, "jitter", where=where, low=0, below=1)

    def trajectory(x: Tensor, u: Tensor, grad: Tensor) -> tuple[Tensor, ...]:
        return hmc_transition(pot, x, u, grad, step_size, n_leapfrog, jitter, generator)

    return Chains.run(trajectory, x0, n_steps, step_size, where, start=lambda x: (x, *pot(x)))


def mala(
    energy: Target | Callable[[Tensor], Tensor],
    x0: Tensor,
    n_steps: int,
    step_size: float = 0.1,
    generator: torch.Generator | None = None,
) -> Chains:
    r"""Metropolis-adjusted Langevin algorithm, batched over chains.

    Proposes $x' = x - \frac{\epsilon^2}2 \nabla u(x) + \epsilon\,\xi$, $\xi \sim N(0, I)$, $\epsilon$ the
    `step_size`, and accepts with probability $\min\big(1, \frac{p(x')\, q(x \mid x')}{p(x)\, q(x' \mid x)}\big)$.
    The other arguments are [`hmc`][flowkit.sampling.hmc]'s.

    Returns:
        [`Chains`][flowkit.sampling.Chains] of `n_steps` states per chain.
    """
    return _mala(potential(energy), x0, n_steps, step_size, generator)


def _mala(
    pot: Potential, x0: Tensor, n_steps: int, eps: float, generator: torch.Generator | None, where: str = "mala"
) -> Chains:
    eps = check_number(eps, "step_size", where=where, positive=True)
    time_step = 0.5 * eps * eps  # the proposal x - eps^2/2 grad u + eps xi

    def move(x: Tensor, u: Tensor, grad: Tensor) -> tuple[Tensor, ...]:
        return langevin_transition(pot, x, u, grad, time_step, generator=generator)[:5]

    return Chains.run(move, x0, n_steps, eps, where, start=lambda x: (x, *pot(x)))


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
    z = z0
    if z is None:
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

    The gradient of $\tilde u$ is taken by autograd through the flow; a good flow makes $\tilde u$ close to
    $|z|^2/2$, so that large step sizes are accepted (Foreman et al. 2021). The settings are
    [`hmc`][flowkit.sampling.hmc]'s, in latent space; without latent starting points `z0`, the `chains`
    start at base samples.

    Returns:
        [`Chains`][flowkit.sampling.Chains] with `samples = T(latent)`.
    """
    settings = (n_steps, step_size, n_leapfrog, jitter, generator, "flow_hmc")
    return _in_latent_space(flow, target, chains, z0, "flow_hmc", lambda u, z: _hmc(u, z, *settings))


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

    The arguments are [`flow_hmc`][flowkit.sampling.flow_hmc]'s; `step_size` is the Langevin one.

    Returns:
        [`Chains`][flowkit.sampling.Chains] with `samples = T(latent)`.
    """
    settings = (n_steps, step_size, generator, "neutra_mala")
    return _in_latent_space(flow, target, chains, z0, "neutra_mala", lambda u, z: _mala(u, z, *settings))


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

    Each chain starts at its first proposal of non-zero weight (the states before it repeat it) and then
    replaces its state $x$ by a fresh proposal $x' \sim q$ with probability $\min(1, w(x')/w(x))$, $w = e^{-u}/q$.

    A [`StochasticFlow`][flowkit.flows.StochasticFlow] proposes with its path weights; `batch_size` proposals
    are drawn per pass; `generator` draws the accept tests.

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

    The window $W$ is the smallest with $W \ge c\, \tau_{int}(W)$ (Madras & Sokal 1988; $c \approx 4$-$6$).
    The variance of a chain mean is $2\tau_{int}\,\sigma^2 / N$ (independent samples: $\tau_{int} = 1/2$).
    `series`: values `(n_steps,)` or `(n_steps, chains)`.

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


def imh(
    flow: FlowModel, target: Target, n_steps: int, batch_size: int = 10_000, generator: torch.Generator | None = None
) -> tuple[Tensor, float]:
    """Deprecated: one chain of [`independent_metropolis`][flowkit.sampling.independent_metropolis] `run`.

    Returns:
        `(chain, acceptance)`: `run.samples[:, 0]`, the states `(n_steps, *event_shape)`, and `run.mean_acceptance`.
    """
    message = "imh is deprecated: use independent_metropolis(...), whose .samples[:, 0] and .mean_acceptance it returns"
    warnings.warn(message, DeprecationWarning, stacklevel=2)
    run = independent_metropolis(flow, target, n_steps, 1, batch_size, generator)
    return run.samples[:, 0], run.mean_acceptance


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
    ([`propose`][flowkit.domains.Domain.propose], of scale `step`) and accepts with probability
    $\min(1, e^{u(x) - u(x')})$: it targets $e^{-u}$ against the domain's volume measure
    (`domain`: a [`Domain`][flowkit.domains.Domain], default the real line). Every `thin`-th state is kept.

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
