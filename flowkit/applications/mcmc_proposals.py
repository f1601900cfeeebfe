r"""Flow proposals against flow reparametrisation in MCMC (Grenioux, Durmus, Moulines & Gabrié, ICML 2023).

A flow $q$ fitted to a target $\pi$ serves MCMC in two ways, both already in
[`flowkit.sampling`][flowkit.sampling]:

- as an **independence proposal**
  ([`independent_metropolis`][flowkit.sampling.independent_metropolis], IMH): a fresh $x' \sim q$ replaces
  $x$ with probability $\min(1, w(x')/w(x))$, $w = \pi / q$. The proposal is global, so the chain jumps
  between modes; but in high dimension the weights degenerate and the chain sticks;
- as a **reparametrisation** ([`neutra_mala`][flowkit.sampling.neutra_mala], NeuTra): MALA (a local move) on
  the pulled-back target $\tilde\pi(z) = \pi(T(z))\,|\det J_T(z)|$ in the flow's latent space. It never jumps
  between modes that the flow keeps apart, but a rough flow still helps it in high dimension.

This module holds the study's tools: the IMH mixing bound
[`imh_tv_bound`][flowkit.applications.mcmc_proposals.imh_tv_bound], the exact total variation of a 1-D IMH
chain by quadrature [`imh_tv_by_quadrature`][flowkit.applications.mcmc_proposals.imh_tv_by_quadrature]
(to check the bound), and the chain summaries the comparison needs
([`chain_mean`][flowkit.applications.mcmc_proposals.chain_mean],
[`ess_per_evaluation`][flowkit.applications.mcmc_proposals.ess_per_evaluation]), the paper's family of
imperfect flows for the funnel [`FunnelTransport`][flowkit.applications.mcmc_proposals.FunnelTransport], and NeuTra
with its step tuned towards an acceptance rate during a warm-up
([`adapted_neutra_mala`][flowkit.applications.mcmc_proposals.adapted_neutra_mala]). The targets are
[`BimodalGaussian`][flowkit.targets.funnel.BimodalGaussian] and [`NealFunnel`][flowkit.targets.funnel.NealFunnel].

**The bound.** If $w(x) \le W$ for every $x$ (with $\pi$ and $q$ normalised, so $W \ge 1$), the IMH kernel
satisfies $P(x, A) \ge \pi(A)/W$ (a Doeblin minorisation), so from any start

$$
\| P^n(x, \cdot) - \pi \|_{TV} \le \left(1 - \frac1W\right)^n
$$

(Mengersen & Tweedie 1996; Grenioux et al., Proposition 1). The rate is exact: from the point where $w = W$,
the chain stays put with probability exactly $1 - 1/W$ per step.

References:
    Grenioux, Durmus, Moulines & Gabrié, *On sampling with approximate transport maps*, ICML 2023
    (arXiv:2302.04763);
    Mengersen & Tweedie, *Rates of convergence of the Hastings and Metropolis algorithms*, Annals of
    Statistics 24 (1996).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from .._validation import check_number
from ..bijectors import Bijector
from ..flows import Flow
from ..sampling import Chains, integrated_autocorrelation_time, neutra_mala
from ..targets import Target

__all__ = [
    "imh_tv_bound",
    "imh_tv_by_quadrature",
    "chain_mean",
    "ess_per_evaluation",
    "FunnelTransport",
    "adapted_neutra_mala",
]


class FunnelTransport(Bijector):
    r"""The transport map of Neal's funnel, exact or off by a factor in the mouth's widths (Grenioux et al.'s family).

    The sampling direction (latent $z$ to data $x$, the [`inverse`][flowkit.bijectors.Bijector.inverse]) is

    $$
    v = \sigma z_1, \qquad x_i = \beta^{-1/2} e^{v/2} z_i \quad (i = 2, \dots, d),
    $$

    which pushes $N(0, I)$ exactly onto [`NealFunnel(d, scale=σ)`][flowkit.targets.funnel.NealFunnel] for
    $\beta = 1$; any other $\beta$ gives a flow whose widths given $v$ are off by $\beta^{-1/2}$ in every one of
    the $d - 1$ mouth coordinates: the paper's imperfect flows (their $\beta$ runs over $[0.1, 10]$, $\sigma^2 = 3$).
    Pulled back through it the funnel is the Gaussian $N(0, \mathrm{diag}(1, \beta, \dots, \beta))$, easy for
    MALA in any dimension, while the importance weights $\pi/q$ of the flow degrade exponentially with $d$.
    $\log|\det \partial z/\partial x| = -\log\sigma + (d - 1)(\tfrac12\log\beta - v/2)$.

    Arguments:
        dim: dimension $d \ge 2$.
        scale: the standard deviation $\sigma$ of $v$.
        beta: the quality $\beta > 0$ (1: the exact map).

    Examples:
        >>> import torch
        >>> from flowkit.applications.mcmc_proposals import FunnelTransport
        >>> t = FunnelTransport(3, beta=4.0)
        >>> x, _ = t.inverse(torch.tensor([[0.0, 1.0, -1.0]]))
        >>> x.tolist()
        [[0.0, 0.5, -0.5]]

    References:
        Grenioux, Durmus, Moulines & Gabrié, *On sampling with approximate transport maps*, ICML 2023, Section 4.
    """

    def __init__(self, dim: int, scale: float = math.sqrt(3.0), beta: float = 1.0) -> None:
        super().__init__()
        where = "FunnelTransport"
        self.dim = check_number(dim, "dim", where=where, integer=True, low=2)
        self.scale = check_number(scale, "scale", where=where, positive=True)
        self.beta = check_number(beta, "beta", where=where, positive=True)
        self.event_shape = torch.Size([self.dim])

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        v = x[..., :1]
        log_width = 0.5 * v - 0.5 * math.log(self.beta)  # log of x_i / z_i
        z = torch.cat([v / self.scale, x[..., 1:] * torch.exp(-log_width)], -1)
        return z, -math.log(self.scale) - (self.dim - 1) * log_width[..., 0]

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        v = self.scale * z[..., :1]
        log_width = 0.5 * v - 0.5 * math.log(self.beta)
        x = torch.cat([v, z[..., 1:] * torch.exp(log_width)], -1)
        return x, math.log(self.scale) + (self.dim - 1) * log_width[..., 0]


def imh_tv_bound(max_weight_ratio: float, n_steps: int) -> float:
    r"""The IMH bound: total variation after `n_steps` at most $(1 - 1/W)^n$ when $\pi/q \le W$ everywhere.

    Arguments:
        max_weight_ratio: $W = \sup_x \pi(x)/q(x)$ of normalised densities ($W \ge 1$).
        n_steps: the number of IMH steps $n \ge 0$.

    Returns:
        $(1 - 1/W)^n$.

    Raises:
        ValueError: for $W < 1$ (normalised densities cannot have a smaller supremum) or a negative `n_steps`.

    Examples:
        >>> from flowkit.applications.mcmc_proposals import imh_tv_bound
        >>> imh_tv_bound(2.0, 3)
        0.125
    """
    w = check_number(max_weight_ratio, "max_weight_ratio", where="imh_tv_bound", low=1)
    n = check_number(n_steps, "n_steps", where="imh_tv_bound", integer=True, low=0)
    return (1.0 - 1.0 / w) ** n


def imh_tv_by_quadrature(
    log_target: Callable[[np.ndarray], np.ndarray],
    log_proposal: Callable[[np.ndarray], np.ndarray],
    start: float,
    n_steps: int,
    grid: np.ndarray,
) -> np.ndarray:
    r"""The exact total variation to the target of a 1-D IMH chain after $1, \dots, n$ steps, by quadrature.

    The chain starts at the point `start`. After $n$ steps its law is an atom of mass $m_n$ at `start` plus a
    density $f_n$; with $a(x, y) = \min(1, w(y)/w(x))$ and the rejection probability
    $r(x) = 1 - \int q(y)\,a(x, y)\,dy$,

    $$
    m_{n+1} = m_n\, r(x_0), \qquad
    f_{n+1}(y) = q(y) \int f_n(x)\, a(x, y)\, dx + f_n(y)\, r(y) + m_n\, q(y)\, a(x_0, y),
    $$

    and $\|P^n(x_0, \cdot) - \pi\|_{TV} = \frac12\big(m_n + \int |f_n - \pi|\big)$. The integrals are trapezoid
    sums on `grid` (dense and wide enough to hold both densities: the error is $O(h^2)$), no sampling noise.

    Arguments:
        log_target: normalised $\log \pi$ of a NumPy array of points.
        log_proposal: normalised $\log q$, the same way.
        start: the chain's starting point $x_0$.
        n_steps: the number of steps $n \ge 1$.
        grid: increasing, evenly spaced quadrature points (at least 3).

    Returns:
        The total variations after $1, \dots, n$ steps, float64 `(n_steps,)`.

    Raises:
        ValueError: for a grid that is not increasing and evenly spaced, or densities that are not finite on it.

    Examples:
        >>> import numpy as np
        >>> from scipy.stats import norm
        >>> from flowkit.applications.mcmc_proposals import imh_tv_by_quadrature, imh_tv_bound
        >>> grid = np.linspace(-20, 20, 1601)
        >>> tv = imh_tv_by_quadrature(norm.logpdf, lambda x: norm.logpdf(x, scale=2.0), 0.0, 3, grid)
        >>> bool(np.allclose(tv, [imh_tv_bound(2.0, n) for n in (1, 2, 3)], atol=1e-6))
        True
    """
    where = "imh_tv_by_quadrature"
    n_steps = check_number(n_steps, "n_steps", where=where, integer=True, low=1)
    start = check_number(start, "start", where=where)
    x = np.asarray(grid, dtype=np.float64)
    if x.ndim != 1 or x.size < 3:
        raise ValueError(f"{where}: grid must be a 1-D array of at least 3 points")
    h = np.diff(x)
    if not (h > 0).all() or not np.allclose(h, h[0], rtol=1e-9, atol=0):
        raise ValueError(f"{where}: grid must be increasing and evenly spaced")
    weights = np.full(x.size, h[0])  # trapezoid rule
    weights[[0, -1]] *= 0.5
    log_pi, log_q = np.asarray(log_target(x), np.float64), np.asarray(log_proposal(x), np.float64)
    start_log = np.asarray(log_target(np.array([start])), np.float64) - np.asarray(
        log_proposal(np.array([start])), np.float64
    )
    if not (np.isfinite(log_pi).all() and np.isfinite(log_q).all() and np.isfinite(start_log).all()):
        raise ValueError(f"{where}: log_target and log_proposal must be finite on the grid and at start")
    pi, q, log_w = np.exp(log_pi), np.exp(log_q), log_pi - log_q
    accept = np.exp(np.minimum(0.0, log_w[None, :] - log_w[:, None]))  # a(x_i, y_j)
    kernel = accept * (q * weights)[None, :]  # accepted moves x_i -> y_j, as quadrature masses
    reject = 1.0 - kernel.sum(1)  # r(x_i)
    from_start = np.exp(np.minimum(0.0, log_w - start_log[0]))  # a(x_0, y_j)
    reject_start = 1.0 - float((q * from_start * weights).sum())
    atom, density = 1.0, np.zeros_like(x)
    out = np.empty(n_steps)
    for n in range(n_steps):
        moved = (density * weights) @ accept * q  # q(y) * int f(x) a(x, y) dx
        density = moved + density * reject + atom * q * from_start
        atom *= reject_start
        out[n] = 0.5 * (atom + float((np.abs(density - pi) * weights).sum()))
    return out


def chain_mean(values: Tensor, burn_in: int = 0) -> tuple[float, float]:
    r"""The mean of a statistic over a batch of independent chains, and its standard error.

    Each chain's time average is one estimate; the chains are independent, so the standard error is the
    standard deviation of the chain averages over $\sqrt{\text{chains}}$ (honest whatever the autocorrelation:
    a chain stuck in one mode makes its average 0 or 1 and the spread shows it).

    Arguments:
        values: the statistic along the chains, `(n_steps, chains)` (at least 2 chains).
        burn_in: the first steps to drop.

    Returns:
        `(mean, standard_error)`.

    Examples:
        >>> import torch
        >>> from flowkit.applications.mcmc_proposals import chain_mean
        >>> chain_mean(torch.tensor([[0.0, 1.0], [0.0, 1.0]]))
        (0.5, 0.5)
    """
    where = "chain_mean"
    burn_in = check_number(burn_in, "burn_in", where=where, integer=True, low=0)
    if not isinstance(values, Tensor) or values.dim() != 2 or values.shape[1] < 2 or values.shape[0] <= burn_in:
        raise ValueError(f"{where}: values must be (n_steps, chains) with chains >= 2 and n_steps > burn_in")
    per_chain = values[burn_in:].double().mean(0)
    return float(per_chain.mean()), float(per_chain.std() / math.sqrt(per_chain.numel()))


def ess_per_evaluation(values: Tensor, evaluations_per_step: float = 1.0, burn_in: int = 0) -> float:
    r"""Effective sample size of a statistic along a batch of chains, per target evaluation.

    $\mathrm{ESS} = N / (2\tau_{int})$ for $N$ states in all and the integrated autocorrelation time
    $\tau_{int}$ of [`integrated_autocorrelation_time`][flowkit.sampling.integrated_autocorrelation_time]
    (chains pooled); divided by the target evaluations spent, `evaluations_per_step` per state of each chain
    (IMH: one energy; MALA: one energy with its gradient).

    Arguments:
        values: the statistic along the chains, `(n_steps, chains)`.
        evaluations_per_step: target evaluations (energy or energy and gradient) per step and chain.
        burn_in: the first steps to drop.

    Returns:
        ESS per evaluation (0 when the chains never move, `tau` infinite or the statistic constant).

    Examples:
        >>> import torch
        >>> from flowkit.applications.mcmc_proposals import ess_per_evaluation
        >>> round(ess_per_evaluation(torch.randn(2000, 4, generator=torch.Generator().manual_seed(0))), 1)
        1.0
    """
    where = "ess_per_evaluation"
    evaluations_per_step = check_number(evaluations_per_step, "evaluations_per_step", where=where, positive=True)
    burn_in = check_number(burn_in, "burn_in", where=where, integer=True, low=0)
    if not isinstance(values, Tensor) or values.dim() != 2 or values.shape[0] - burn_in < 2:
        raise ValueError(f"{where}: values must be (n_steps, chains) with at least 2 steps after burn_in")
    kept = values[burn_in:]
    tau = integrated_autocorrelation_time(kept)
    if not math.isfinite(tau):
        return 0.0
    return kept.numel() / (2.0 * tau) / (kept.numel() * evaluations_per_step)


def adapted_neutra_mala(
    flow: Flow,
    target: Target,
    n_steps: int,
    z0: Tensor,
    warmup: int = 200,
    target_acceptance: float = 0.75,
    step_size: float = 0.5,
    generator: torch.Generator | None = None,
) -> tuple[Chains, float, int]:
    r"""NeuTra MALA whose step size is tuned during a warm-up towards an acceptance rate, then fixed.

    The paper's MALA adapts its step towards an acceptance of 0.75 as it runs; here the adaptation is confined to
    `warmup` steps (blocks of 10: the step times 1.25 after a block whose mean acceptance over the chains was above
    `target_acceptance`, else over 1.25), so that the kept `n_steps` are a Markov chain with a fixed kernel,
    started where the warm-up ended.

    Arguments:
        flow: the bijective flow whose latent space the chains run in.
        target: the target.
        n_steps: the kept steps per chain.
        z0: latent starting points `(chains, *event_shape)`.
        warmup: adaptation steps (0: none; rounded down to a multiple of 10).
        target_acceptance: the acceptance aimed at, in $(0, 1)$.
        step_size: the first Langevin step size.
        generator: random generator of the chains.

    Returns:
        `(chains, step_size, diverged)`: the kept [`Chains`][flowkit.sampling.Chains], the step they ran at and the
        warm-up's proposals rejected for a non-finite energy or gradient (large trial steps; not warned about).

    Examples:
        >>> import torch, flowkit
        >>> from flowkit.applications.mcmc_proposals import FunnelTransport, adapted_neutra_mala
        >>> flow = flowkit.flows.Flow(FunnelTransport(3), flowkit.distributions.StandardNormal(3))
        >>> run, step, _ = adapted_neutra_mala(flow, flowkit.targets.NealFunnel(3, scale=3**0.5), 50, torch.zeros(4, 3))
        >>> run.samples.shape, step > 0
        (torch.Size([50, 4, 3]), True)
    """
    where = "adapted_neutra_mala"
    warmup = check_number(warmup, "warmup", where=where, integer=True, low=0)
    target_acceptance = check_number(target_acceptance, "target_acceptance", where=where, positive=True, below=1)
    eps = check_number(step_size, "step_size", where=where, positive=True)
    z, diverged = z0, 0
    for _ in range(warmup // _ADAPT_EVERY):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            run = neutra_mala(flow, target, _ADAPT_EVERY, z0=z, step_size=eps, generator=generator)
        diverged += sum(_diverged_count(str(w.message)) for w in caught)
        z = run.latent[-1]
        eps = eps * _ADAPT_FACTOR if run.mean_acceptance > target_acceptance else eps / _ADAPT_FACTOR
    return neutra_mala(flow, target, n_steps, z0=z, step_size=eps, generator=generator), eps, diverged


_ADAPT_EVERY, _ADAPT_FACTOR = 10, 1.25


def _diverged_count(message: str) -> int:
    """The count in a sampler's "N of M proposals diverged" warning, else 0."""
    found = re.search(r"(\d+) of \d+ proposals diverged", message)
    return int(found.group(1)) if found else 0
