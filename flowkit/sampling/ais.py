r"""Annealed importance sampling (AIS) from a flow towards a target, a sampler and an estimator of log Z.

AIS (Neal 2001) moves flow samples $x_0 \sim q$ through a sequence of distributions

$$
\log \pi_j(x) = (1 - \gamma_j) \log q(x) + \gamma_j\, (-u(x)) + \text{const}, \qquad
0 = \gamma_0 < \gamma_1 < \dots < \gamma_{K+1} = \alpha,
$$

with $\gamma_j = \alpha \beta_j$ on a schedule $0 = \beta_0 < \dots < \beta_{K+1} = 1$ (linear by default).
This is the geometric path $\pi_\beta \propto q^{1-\beta} (p^\alpha q^{1-\alpha})^\beta$ from the flow to
$p^\alpha q^{1-\alpha}$: the target itself for $\alpha = 1$, and $p^2/q$, the distribution that
minimises the variance of the $\alpha = 2$ divergence's estimator and FAB's AIS target, for $\alpha = 2$.
At each of the $K$ intermediate distributions $x_{j-1}$ is moved by a Markov kernel $T_j$ that leaves
$\pi_j$ invariant (HMC or random-walk Metropolis: [`hmc_transition`][flowkit.sampling.mcmc.hmc_transition],
[`metropolis_transition`][flowkit.sampling.mcmc.metropolis_transition]), and the log weight

$$
\log w = \sum_{j=1}^{K+1} (\gamma_j - \gamma_{j-1}) \big(-u(x_{j-1}) - \log q(x_{j-1})\big)
= \sum_{j=1}^{K+1} \log \frac{\tilde\pi_j(x_{j-1})}{\tilde\pi_{j-1}(x_{j-1})}
$$

is exact for any kernels (it does not need them to mix): $E[w] = \int \tilde \pi_{K+1}$, which is
$Z = \int e^{-u}$ for $\alpha = 1$, and $w$ importance-weights the final states $x_K$ towards
$\pi_{K+1}$. With $K = 0$ this would be plain importance sampling; a perfect flow ($q = p$) makes every
$\pi_j = p$ and every weight equal to $\alpha \log Z$.

Each kernel's step size is fixed during a run, so that the weights stay exact; `adapt=True` adapts it
*for the next run* towards a target acceptance, as fab-torch does
([`AISResult.step_sizes`][flowkit.sampling.ais.AISResult]).

References:
    Neal, *Annealed importance sampling*, Statistics and Computing 11 (2001) (arXiv:physics/9803008);
    Midgley, Stimper, Simm, Schölkopf & Hernández-Lobato, *Flow annealed importance sampling
    bootstrap*, ICLR 2023 (arXiv:2208.01893).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .._validation import check_number, check_tensor
from ..domains import Real
from ..flows.base import FlowModel, require_exact_weights
from ..targets import Target
from ..utils import value_and_gradient
from .importance import check_target, ess, log_Z
from .mcmc import hmc_transition, metropolis_transition

__all__ = ["ais", "AISResult", "TRANSITIONS", "TARGET_ACCEPTANCE", "check_step_sizes"]

#: The AIS transition kernels.
TRANSITIONS = ("hmc", "metropolis")

#: The acceptance each kernel's step size is adapted towards (HMC: fab-torch's 0.65; random walk: 0.23).
TARGET_ACCEPTANCE = {"hmc": 0.65, "metropolis": 0.23}

#: The factor by which an adapted step size grows (acceptance above target) or shrinks (below) per run.
_ADAPT_FACTOR = 1.05


@dataclass
class AISResult:
    r"""The outcome of one AIS run.

    Attributes:
        samples: the final states $x_K$, `(n, *event_shape)`, without gradients.
        log_w: their exact AIS log weights, float64 `(n,)` (`-inf` where the target's density is zero or NaN).
        log_Z: $\log \frac1n \sum_i w_i$, the estimate of $\log \int p^\alpha q^{1 - \alpha}$
            ($\log Z$ for `alpha=1`); see [`log_Z`][flowkit.sampling.log_Z].
        log_Z_error: its delta-method standard error.
        acceptance: the mean acceptance of the kernels at each intermediate distribution, float64 `(steps,)`.
        step_sizes: the step sizes for the next run (the ones used, adapted when `adapt=True`), float64 `(steps,)`.
        target_evaluations: configurations at which the target's energy (and force) was evaluated.
    """

    samples: Tensor
    log_w: Tensor
    log_Z: float
    log_Z_error: float
    acceptance: Tensor
    step_sizes: Tensor
    target_evaluations: int

    @property
    def ess(self) -> float:
        """The normalised Kish effective sample size of the weights, in `(0, 1]`."""
        return ess(self.log_w)


class _State(NamedTuple):
    """The energy, the flow's log density and (for HMC) their gradients at the chains' states."""

    u: Tensor
    log_q: Tensor
    grad_u: Tensor | None
    grad_log_q: Tensor | None

    def where(self, mask: Tensor, other: _State) -> _State:
        """`other` where `mask` (per chain), else `self`."""

        def pick(a: Tensor | None, b: Tensor | None) -> Tensor | None:
            if a is None or b is None:
                return None
            return torch.where(mask.reshape(-1, *(1,) * (a.dim() - 1)), b, a)

        return _State(*(pick(a, b) for a, b in zip(self, other, strict=True)))  # type: ignore[arg-type]


def _scaled(c: float, t: Tensor) -> Tensor:
    """`c * t` with `0 * inf = 0` (a term switched off at this point of the path)."""
    return t * c if c != 0 else torch.zeros_like(t)


def _schedule(betas: Tensor | None, steps: int) -> list[float]:
    if betas is None:
        return torch.linspace(0.0, 1.0, steps + 2, dtype=torch.float64).tolist()
    b = torch.as_tensor(betas, dtype=torch.float64).flatten()
    if b.numel() != steps + 2 or not bool(torch.isfinite(b).all()):
        raise ValueError(f"ais: betas must be {steps + 2} finite numbers (steps + 2, from 0 to 1), got {b.numel()}")
    if float(b[0]) != 0.0 or float(b[-1]) != 1.0 or not bool((b[1:] > b[:-1]).all()):
        raise ValueError("ais: betas must increase strictly from 0 to 1")
    return b.tolist()


def check_step_sizes(step_size: float | Tensor, steps: int) -> Tensor:
    """`step_size` (one number, or one per intermediate distribution) as `steps` float64 numbers; ValueError if bad."""
    t = torch.as_tensor(step_size, dtype=torch.float64).detach().cpu().flatten()
    if t.numel() == 1:
        t = t.expand(steps).clone()
    if t.numel() != steps:
        raise ValueError(f"ais: step_size must be a number or {steps} numbers (one per step), got {t.numel()}")
    if not bool((torch.isfinite(t) & (t > 0)).all()):
        raise ValueError(f"ais: step sizes must be finite and positive, got {t.tolist()}")
    return t


@torch.no_grad()
@contextlib.contextmanager
def _evaluation_mode(flow: FlowModel) -> Iterator[None]:
    """The flow in eval mode for one AIS run (its density deterministic: exact log-dets, no power-iteration steps)."""
    training = bool(getattr(flow, "training", False))
    if training:
        flow.eval()
    try:
        yield
    finally:
        if training:
            flow.train()


def ais(
    flow: FlowModel,
    target: Target,
    steps: int,
    n: int | None = None,
    *,
    z: Tensor | None = None,
    alpha: float = 1.0,
    transition: str = "hmc",
    step_size: float | Tensor = 0.1,
    n_leapfrog: int = 5,
    mcmc_steps: int = 1,
    jitter: float = 0.0,
    betas: Tensor | None = None,
    adapt: bool = False,
    target_acceptance: float | None = None,
    domain: Any = None,
    generator: torch.Generator | None = None,
) -> AISResult:
    r"""Annealed importance sampling from a flow to $p^\alpha q^{1-\alpha}$ (see the module's docstring).

    Arguments:
        flow: a flow with an exact density whose samples follow it
            ([`require_exact_weights`][flowkit.flows.base.require_exact_weights]), not trained here.
        target: the [`Target`][flowkit.targets.Target] $p \propto e^{-u}$.
        steps: the number $K \ge 1$ of intermediate distributions (one kernel application or more at each).
        n: the number of chains (samples), drawn from the flow; or give `z`.
        z: latent points `(n, *latent_shape)` whose images `flow.latent_to_data(z)` start the chains.
        alpha: the exponent of the end point $p^\alpha q^{1-\alpha}$ (1: the target; 2: FAB's $p^2/q$).
        transition: `"hmc"` (identity mass) or `"metropolis"` (random walk of the domain's symmetric proposal).
        step_size: the kernels' step size, one number or one per intermediate distribution (finite, positive).
        n_leapfrog: leapfrog steps per HMC trajectory.
        mcmc_steps: kernel applications per intermediate distribution.
        jitter: HMC's step-size jitter (see [`hmc`][flowkit.sampling.hmc]).
        betas: the schedule $\beta_0 = 0 < \dots < \beta_{K+1} = 1$ (`steps + 2` numbers; default linear).
        adapt: adapt the step sizes for the next run (returned in `step_sizes`): times 1.05 where the mean
            acceptance was above `target_acceptance`, else divided by 1.05.
        target_acceptance: default `TARGET_ACCEPTANCE[transition]`.
        domain: the [`Domain`][flowkit.domains.Domain] of the random-walk proposals (default the real line;
            e.g. `flowkit.distributions.rigid_domain(target.segments)` for rigid bodies).
        generator: random generator of the kernels (the flow's own samples use the global one).

    Returns:
        An [`AISResult`][flowkit.sampling.ais.AISResult].

    Raises:
        ValueError: for bad arguments, a flow without an exact density or whose samples do not follow it, or a
            target whose energy is NaN at every starting sample.
    """
    with _evaluation_mode(flow):
        where = "ais"
        check_target(flow, target, where)
        require_exact_weights(flow, where, density=True)
        steps = check_number(steps, "steps", where=where, integer=True, low=1)
        if transition not in TRANSITIONS:
            raise ValueError(f"ais: unknown transition {transition!r}; choose one of {TRANSITIONS}")
        alpha = check_number(alpha, "alpha", where=where, positive=True)
        n_leapfrog = check_number(n_leapfrog, "n_leapfrog", where=where, integer=True, low=1)
        mcmc_steps = check_number(mcmc_steps, "mcmc_steps", where=where, integer=True, low=1)
        jitter = check_number(jitter, "jitter", where=where, low=0, below=1)
        aim = TARGET_ACCEPTANCE[transition] if target_acceptance is None else target_acceptance
        aim = check_number(aim, "target_acceptance", where=where, positive=True, below=1)
        sizes = check_step_sizes(step_size, steps)
        gammas = [alpha * b for b in _schedule(betas, steps)]
        domain = Real() if domain is None else domain
        if transition == "hmc" and type(domain) is not Real:
            raise ValueError(f"ais: HMC moves on the real line; on {domain!r} use transition='metropolis'")
        if (z is None) == (n is None):
            raise ValueError("ais: give the number of samples n or the latent points z (one of them)")
        if z is not None:
            check_tensor(z, flow.base.event_shape, name="z", where=where)
            x = flow.latent_to_data(z.detach())[0].detach()
        else:
            n = check_number(n, "n", where=where, integer=True, low=2)
            x = flow.sample((n,)).detach()
        chains = x.shape[0]
        evaluations = 0
        with_grad = transition == "hmc"

        def evaluate(x: Tensor) -> _State:
            nonlocal evaluations
            evaluations += x.shape[0]
            if not with_grad:
                return _State(target.energy(x), flow.log_prob(x), None, None)
            log_q, grad_log_q = value_and_gradient(flow.log_prob, x)
            u, force = target.energy_and_force(x)
            return _State(u.detach(), log_q, -force, grad_log_q)

        state = evaluate(x)
        if bool(torch.isnan(state.u).all()):
            raise ValueError(
                f"ais: the target's energy ({type(target).__name__}) is NaN at every one of the {chains} flow samples"
            )
        log_w = torch.zeros(chains, dtype=torch.float64, device=x.device)
        acceptance = torch.zeros(steps, dtype=torch.float64)

        def increment(state: _State, delta: float) -> Tensor:
            return delta * (-state.u - state.log_q).double()

        for j in range(1, steps + 1):
            log_w += increment(state, gammas[j] - gammas[j - 1])
            x, state, accepted = _move(
                x, state, gammas[j], float(sizes[j - 1]), transition, n_leapfrog, mcmc_steps, jitter, domain, generator,
                evaluate,
            )  # fmt: skip
            acceptance[j - 1] = accepted
        log_w += increment(state, gammas[-1] - gammas[-2])
        log_w = torch.where(torch.isnan(log_w), torch.full_like(log_w, -math.inf), log_w)
        if not bool(torch.isfinite(log_w).any()):
            raise ValueError(
                f"ais: every one of the {chains} AIS weights is zero or NaN: the target's energy "
                f"({type(target).__name__}) or the flow's density is not finite at any of the samples"
            )
        if adapt:
            sizes = torch.where(acceptance > aim, sizes * _ADAPT_FACTOR, sizes / _ADAPT_FACTOR)
        if log_w.numel() >= 2:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # degenerate weights: the caller sees the ESS
                estimate, error = log_Z(log_w)
        else:
            estimate, error = float(log_w[0]), math.nan
        return AISResult(x, log_w, estimate, error, acceptance, sizes, evaluations)


def _move(
    x: Tensor,
    state: _State,
    gamma: float,
    step_size: float,
    transition: str,
    n_leapfrog: int,
    mcmc_steps: int,
    jitter: float,
    domain: Any,
    generator: torch.Generator | None,
    evaluate: Callable[[Tensor], _State],
) -> tuple[Tensor, _State, float]:
    r"""`mcmc_steps` kernel applications leaving $\pi_\gamma$ invariant; returns the states and the mean acceptance."""
    last: list[_State] = []

    def energy_of(s: _State) -> Tensor:
        return _scaled(gamma, s.u) - _scaled(1 - gamma, s.log_q)

    def gradient_of(s: _State) -> Tensor:
        assert s.grad_u is not None and s.grad_log_q is not None
        return _scaled(gamma, s.grad_u) - _scaled(1 - gamma, s.grad_log_q)

    def energy(y: Tensor) -> Tensor:
        last[:] = [evaluate(y)]
        return energy_of(last[0])

    def potential(y: Tensor) -> tuple[Tensor, Tensor]:
        return energy(y), gradient_of(last[0])

    accepted = 0.0
    for _ in range(mcmc_steps):
        if transition == "hmc":
            # The potential's last call is at the trajectory's end point: the proposal's state.
            x, _, _, accept, _ = hmc_transition(
                potential, x, energy_of(state), gradient_of(state), step_size, n_leapfrog, jitter, generator
            )
        else:
            x, _, accept = metropolis_transition(energy, x, energy_of(state), step_size, domain, generator)
        state = state.where(accept, last[0])
        accepted += float(accept.double().mean())
    return x, state, accepted / mcmc_steps
