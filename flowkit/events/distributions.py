r"""Distributions of the next inter-event time $\tau > 0$ given a history vector $h$.

Each maps $h$ to its parameters with a [`Conditioner`][flowkit.nn.Conditioner] (an
[`MLP`][flowkit.nn.MLP] reading $h$ as its context) and gives `log_prob`, `log_survival`
($\log S(\tau) = \log P(T > \tau)$), exact `sample` and `mean`. Log inter-event times are standardised,
$y = (\log \tau - a) / b$, with $a, b$ from the training set (buffers set by
[`EventModel.standardize_`][flowkit.events.EventModel.standardize_]).

- [`LogNormalMixture`][flowkit.events.LogNormalMixture]: $y \sim \sum_k w_k \mathcal{N}(\mu_k, \sigma_k^2)$, so
  $$p(\tau) = \sum_k \frac{w_k}{\tau\, b \sigma_k \sqrt{2\pi}}
  \exp\Big(-\frac{(\log\tau - a - b\mu_k)^2}{2 b^2\sigma_k^2}\Big),\qquad
  S(\tau) = \sum_k w_k\, \Phi\Big(-\frac{y - \mu_k}{\sigma_k}\Big),\qquad
  \mathbb{E}\tau = \sum_k w_k \exp\big(a + b\mu_k + b^2\sigma_k^2/2\big).$$
- [`FlowInterEvent`][flowkit.events.FlowInterEvent]: $z = f_h(y)$, a stack of flowkit transformers (an affine map,
  then rational-quadratic splines or deep sigmoidal maps) with parameters from $h$, and $z \sim \mathcal{N}(0, 1)$:
  $\log p(\tau) = \log\varphi(z) + \log f_h'(y) - \log b - \log\tau$ and, $f_h$ being increasing,
  $S(\tau) = \Phi(-z)$; the mean is a 40-node Gauss-Hermite quadrature over $z$.
- [`Exponential`][flowkit.events.Exponential], [`Weibull`][flowkit.events.Weibull] and
  [`Gamma`][flowkit.events.Gamma]: the classical baselines, means in closed form.

References:
    Shchur, Biloš & Günnemann, *Intensity-free learning of temporal point processes*, ICLR 2020
    (arXiv:1909.12127).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.special import log_ndtr

from .._config import Configurable
from .._validation import check_number
from ..nn import MLP
from ..transformers import Affine, MonotonicMLP, RationalQuadraticSpline

__all__ = [
    "InterEventDistribution",
    "LogNormalMixture",
    "FlowInterEvent",
    "Exponential",
    "Weibull",
    "Gamma",
    "gamma_log_survival",
]

_LOG_2PI = math.log(2 * math.pi)


class InterEventDistribution(Configurable, nn.Module):
    r"""The contract of a conditional inter-event distribution (see the module `flowkit.events.distributions`).

    Arguments:
        history: the size `H` of the history vector.
        params: the number of parameters the conditioner gives per history vector.
        hidden: hidden layer sizes of the conditioner (empty: a linear map).
    """

    _flowkit_register = False

    def __init__(self, history: int, params: int, hidden: Sequence[int] = ()) -> None:
        super().__init__()
        self.history_features = check_number(history, "history", where=type(self).__name__, integer=True, low=1)
        self.conditioner = MLP(0, params, hidden=tuple(hidden), context=self.history_features)
        self.register_buffer("log_tau_mean", torch.zeros(()))
        self.register_buffer("log_tau_std", torch.ones(()))

    def params(self, h: Tensor) -> Tensor:
        """The conditioner's parameters `(..., P)` for history vectors `h` `(..., H)`."""
        return self.conditioner(h.new_zeros(*h.shape[:-1], 0), h)

    def standardized(self, tau: Tensor) -> Tensor:
        r"""$y = (\log\tau - a) / b$."""
        return (torch.log(tau) - self.log_tau_mean) / self.log_tau_std

    def log_prob(self, tau: Tensor, h: Tensor) -> Tensor:
        r"""$\log p(\tau \mid h)$, shape of `tau` (broadcast with `h.shape[:-1]`)."""
        raise NotImplementedError

    def log_survival(self, tau: Tensor, h: Tensor) -> Tensor:
        r"""$\log S(\tau \mid h) = \log P(T > \tau \mid h)$."""
        raise NotImplementedError

    def sample(self, h: Tensor) -> Tensor:
        """One exact draw per history vector, shape `h.shape[:-1]` (torch's global generator)."""
        raise NotImplementedError

    def mean(self, h: Tensor) -> Tensor:
        r"""$\mathbb{E}[\tau \mid h]$, shape `h.shape[:-1]`."""
        raise NotImplementedError


class LogNormalMixture(InterEventDistribution):
    r"""Mixture of `components` log-normals (the LogNormMix model of Shchur et al. 2020).

    Arguments:
        history: the size `H` of the history vector.
        components: the number $K$ of components (16 in the paper).
        hidden: hidden layer sizes of the conditioner (empty: linear, as in the paper).
        min_log_scale: lower bound of $\log\sigma_k$ (soft, keeps components from collapsing on one point).

    Examples:
        >>> import torch
        >>> d = LogNormalMixture(history=4, components=3)
        >>> h = torch.randn(5, 4)
        >>> d.log_prob(torch.ones(5), h).shape, d.mean(h).shape
        (torch.Size([5]), torch.Size([5]))
    """

    def __init__(
        self, history: int, components: int = 16, hidden: Sequence[int] = (), min_log_scale: float = -5.0
    ) -> None:
        k = check_number(components, "components", where="LogNormalMixture", integer=True, low=1)
        super().__init__(history, 3 * k, hidden)
        self.components = k
        self.min_log_scale = float(min_log_scale)
        with torch.no_grad():  # the components start spread over [-2, 2] in standardised log time
            bias = self.conditioner.last.bias
            bias[k : 2 * k] = torch.linspace(-2, 2, k) if k > 1 else 0.0
            bias[2 * k :] = math.log(0.5) if k > 1 else 0.0

    def mixture(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r"""Log-weights, means $\mu_k$ and log-scales $\log\sigma_k$ in standardised log time, `(..., K)` each."""
        logits, mu, log_sigma = self.params(h).split(self.components, dim=-1)
        floor = self.min_log_scale
        log_sigma = floor + nn.functional.softplus(log_sigma - floor)
        return torch.log_softmax(logits, -1), mu, log_sigma

    def log_prob(self, tau: Tensor, h: Tensor) -> Tensor:
        log_w, mu, log_sigma = self.mixture(h)
        y = self.standardized(tau)[..., None]
        z = (y - mu) * torch.exp(-log_sigma)
        log_py = torch.logsumexp(log_w - 0.5 * z * z - log_sigma - 0.5 * _LOG_2PI, dim=-1)
        return log_py - torch.log(self.log_tau_std) - torch.log(tau)

    def log_survival(self, tau: Tensor, h: Tensor) -> Tensor:
        log_w, mu, log_sigma = self.mixture(h)
        z = (self.standardized(tau)[..., None] - mu) * torch.exp(-log_sigma)
        return torch.logsumexp(log_w + log_ndtr(-z), dim=-1)

    def sample(self, h: Tensor) -> Tensor:
        log_w, mu, log_sigma = self.mixture(h)
        k = torch.distributions.Categorical(logits=log_w).sample()[..., None]
        y = mu.gather(-1, k)[..., 0] + torch.exp(log_sigma.gather(-1, k)[..., 0]) * torch.randn_like(mu[..., 0])
        return torch.exp(self.log_tau_mean + self.log_tau_std * y)

    def mean(self, h: Tensor) -> Tensor:
        log_w, mu, log_sigma = self.mixture(h)
        a, b = self.log_tau_mean, self.log_tau_std
        return torch.logsumexp(log_w + a + b * mu + 0.5 * (b * torch.exp(log_sigma)) ** 2, dim=-1).exp()


def _flow_transformer(name: str, bins: int, bound: float, hidden: int) -> nn.Module:
    if name == "spline":
        return RationalQuadraticSpline(bins=bins, bound=bound)
    if name == "sigmoidal":
        return MonotonicMLP(hidden=hidden)
    raise ValueError(f"FlowInterEvent: transformer must be 'spline' or 'sigmoidal', got {name!r}")


class FlowInterEvent(InterEventDistribution):
    r"""A normalizing flow over the standardised log inter-event time, conditioned on the history.

    $z = T_L \circ \dots \circ T_1 \circ A(y)$, with $A$ an [`Affine`][flowkit.transformers.Affine] map and $T_l$
    [`RationalQuadraticSpline`][flowkit.transformers.RationalQuadraticSpline]s (`transformer="spline"`) or
    deep sigmoidal [`MonotonicMLP`][flowkit.transformers.MonotonicMLP]s (`"sigmoidal"`, numerical inverse), all
    parametrised by one conditioner from $h$; the base is $\mathcal{N}(0, 1)$. It starts as the identity (the
    conditioner's last layer zeroed with the identity parameters as bias), i.e. a log-normal.

    Arguments:
        history: the size `H` of the history vector.
        transforms: the number $L$ of spline (or sigmoidal) layers.
        transformer: `"spline"` or `"sigmoidal"`.
        bins: spline bins.
        bound: the splines' interval $[-B, B]$ in standardised log time (linear tails outside).
        sigmoid_units: units of a deep sigmoidal layer.
        hidden: hidden layer sizes of the conditioner.

    Examples:
        >>> import torch
        >>> d = FlowInterEvent(history=4, transforms=2)
        >>> h = torch.randn(3, 4)
        >>> d.sample(h).shape
        torch.Size([3])
    """

    def __init__(
        self,
        history: int,
        transforms: int = 2,
        transformer: str = "spline",
        bins: int = 8,
        bound: float = 5.0,
        sigmoid_units: int = 8,
        hidden: Sequence[int] = (),
    ) -> None:
        n = check_number(transforms, "transforms", where="FlowInterEvent", integer=True, low=0)
        layers = [Affine()] + [_flow_transformer(transformer, bins, bound, sigmoid_units) for _ in range(n)]
        sizes = [t.params_per_element for t in layers]
        super().__init__(history, sum(sizes), hidden)
        self.transformers = nn.ModuleList(layers)
        self.sizes = sizes
        self.conditioner.zero_last(torch.cat([t.identity_params() for t in layers]))

    def _split(self, h: Tensor) -> list[Tensor]:
        return list(self.params(h).split(self.sizes, dim=-1))

    def _to_latent(self, tau: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        z = self.standardized(tau)
        shape = torch.broadcast_shapes(z.shape, h.shape[:-1])  # the transformers take parameters of z's shape
        z, params = z.expand(shape), self._split(h.expand(*shape, h.shape[-1]))
        total = torch.zeros_like(z)
        for transformer, p in zip(self.transformers, params, strict=True):
            z, ladj = transformer(z, p)
            total = total + ladj
        return z, total

    def log_prob(self, tau: Tensor, h: Tensor) -> Tensor:
        z, ladj = self._to_latent(tau, h)
        return -0.5 * z * z - 0.5 * _LOG_2PI + ladj - torch.log(self.log_tau_std) - torch.log(tau)

    def log_survival(self, tau: Tensor, h: Tensor) -> Tensor:
        return log_ndtr(-self._to_latent(tau, h)[0])

    def _from_latent(self, z: Tensor, h: Tensor) -> Tensor:
        shape = torch.broadcast_shapes(z.shape, h.shape[:-1])
        z, params = z.expand(shape), self._split(h.expand(*shape, h.shape[-1]))
        for transformer, p in zip(reversed(self.transformers), reversed(params), strict=True):
            z, _ = transformer.inverse(z, p)
        return torch.exp(self.log_tau_mean + self.log_tau_std * z)

    def sample(self, h: Tensor) -> Tensor:
        return self._from_latent(torch.randn(h.shape[:-1], dtype=h.dtype, device=h.device), h)

    def mean(self, h: Tensor) -> Tensor:
        nodes, weights = np.polynomial.hermite_e.hermegauss(40)
        z = torch.as_tensor(nodes, dtype=h.dtype, device=h.device)
        w = torch.as_tensor(weights / math.sqrt(2 * math.pi), dtype=h.dtype, device=h.device)
        hh = h[..., None, :].expand(*h.shape[:-1], len(nodes), h.shape[-1])
        tau = self._from_latent(z.expand(*h.shape[:-1], -1), hh)
        return (tau * w).sum(-1)


class Exponential(InterEventDistribution):
    r"""Exponential inter-event times with rate $\lambda(h)$: a piecewise-constant intensity.

    $\log p = \log\lambda - \lambda\tau$, $\log S = -\lambda\tau$, $\mathbb{E}\tau = 1/\lambda$.

    Arguments:
        history: the size `H` of the history vector.
        hidden: hidden layer sizes of the conditioner.

    Examples:
        >>> import torch
        >>> Exponential(history=2).log_survival(torch.ones(3), torch.zeros(3, 2)).shape
        torch.Size([3])
    """

    def __init__(self, history: int, hidden: Sequence[int] = ()) -> None:
        super().__init__(history, 1, hidden)

    def log_rate(self, h: Tensor) -> Tensor:
        r"""$\log\lambda(h)$ (the standardisation's $-a$ added, so that zero output means the typical rate)."""
        return self.params(h)[..., 0] - self.log_tau_mean

    def log_prob(self, tau: Tensor, h: Tensor) -> Tensor:
        log_rate = self.log_rate(h)
        return log_rate - torch.exp(log_rate) * tau

    def log_survival(self, tau: Tensor, h: Tensor) -> Tensor:
        return -torch.exp(self.log_rate(h)) * tau

    def sample(self, h: Tensor) -> Tensor:
        rate = torch.exp(self.log_rate(h))
        return torch.empty_like(rate).exponential_() / rate

    def mean(self, h: Tensor) -> Tensor:
        return torch.exp(-self.log_rate(h))


class Weibull(InterEventDistribution):
    r"""Weibull inter-event times with shape $k(h)$ and scale $\lambda(h)$.

    $\log S = -(\tau/\lambda)^k$, $\log p = \log k - \log\lambda + (k - 1)\log(\tau/\lambda) - (\tau/\lambda)^k$,
    $\mathbb{E}\tau = \lambda\,\Gamma(1 + 1/k)$.

    Arguments:
        history: the size `H` of the history vector.
        hidden: hidden layer sizes of the conditioner.

    Examples:
        >>> import torch
        >>> Weibull(history=2).mean(torch.zeros(3, 2)).shape
        torch.Size([3])
    """

    def __init__(self, history: int, hidden: Sequence[int] = ()) -> None:
        super().__init__(history, 2, hidden)

    def shape_scale(self, h: Tensor) -> tuple[Tensor, Tensor]:
        r"""$\log k$ and $\log\lambda$."""
        raw = self.params(h)
        return raw[..., 0].clamp(-5, 5), raw[..., 1] + self.log_tau_mean

    def log_prob(self, tau: Tensor, h: Tensor) -> Tensor:
        log_k, log_scale = self.shape_scale(h)
        u = torch.log(tau) - log_scale
        return log_k - log_scale + (torch.exp(log_k) - 1) * u - torch.exp(torch.exp(log_k) * u)

    def log_survival(self, tau: Tensor, h: Tensor) -> Tensor:
        log_k, log_scale = self.shape_scale(h)
        return -torch.exp(torch.exp(log_k) * (torch.log(tau) - log_scale))

    def sample(self, h: Tensor) -> Tensor:
        log_k, log_scale = self.shape_scale(h)
        e = torch.empty_like(log_k).exponential_()
        return torch.exp(log_scale + torch.log(e) / torch.exp(log_k))

    def mean(self, h: Tensor) -> Tensor:
        log_k, log_scale = self.shape_scale(h)
        return torch.exp(log_scale + torch.lgamma(1 + torch.exp(-log_k)))


class _GammaSurvival(torch.autograd.Function):
    """`log Q(alpha, x)` (the regularised upper incomplete gamma) with gradients in `x` (exact) and `alpha`."""

    @staticmethod
    def forward(alpha: Tensor, x: Tensor) -> Tensor:  # type: ignore[override]
        return torch.log(torch.special.gammaincc(alpha, x))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:  # type: ignore[override]
        ctx.save_for_backward(*inputs, output)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        alpha, x, log_q = ctx.saved_tensors
        # d/dx log Q = -x^(a-1) e^-x / (Gamma(a) Q)
        d_x = -torch.exp((alpha - 1) * torch.log(x) - x - torch.lgamma(alpha) - log_q)
        # d/d alpha: torch has no derivative of igammac in its first argument; a central difference in float64
        a64, x64 = alpha.double(), x.double()
        step = 1e-5 * a64.clamp(min=1.0)
        upper = torch.log(torch.special.gammaincc(a64 + step, x64))
        lower = torch.log(torch.special.gammaincc(a64 - step, x64))
        d_alpha = ((upper - lower) / (2 * step)).to(alpha.dtype)
        return grad * torch.nan_to_num(d_alpha), grad * torch.nan_to_num(d_x)


def gamma_log_survival(alpha: Tensor, x: Tensor) -> Tensor:
    r"""$\log Q(\alpha, x) = \log \Gamma(\alpha, x) / \Gamma(\alpha)$, differentiable in both arguments.

    The derivative in $x$ is exact; in $\alpha$ (which torch does not provide) it is a central difference in float64
    with a relative step $10^{-5}$.

    Examples:
        >>> import torch
        >>> float(gamma_log_survival(torch.tensor(1.0), torch.tensor(2.0)))  # exponential: -x
        -2.0
    """
    alpha, x = torch.broadcast_tensors(alpha, x)
    return _GammaSurvival.apply(alpha, x)


class Gamma(InterEventDistribution):
    r"""Gamma inter-event times with shape $\alpha(h)$ and rate $\beta(h)$.

    $\log p = \alpha\log\beta - \log\Gamma(\alpha) + (\alpha - 1)\log\tau - \beta\tau$,
    $S = Q(\alpha, \beta\tau)$ ([`gamma_log_survival`][flowkit.events.gamma_log_survival]),
    $\mathbb{E}\tau = \alpha/\beta$.

    Arguments:
        history: the size `H` of the history vector.
        hidden: hidden layer sizes of the conditioner.

    Examples:
        >>> import torch
        >>> Gamma(history=2).log_prob(torch.ones(3), torch.zeros(3, 2)).shape
        torch.Size([3])
    """

    def __init__(self, history: int, hidden: Sequence[int] = ()) -> None:
        super().__init__(history, 2, hidden)

    def shape_rate(self, h: Tensor) -> tuple[Tensor, Tensor]:
        r"""$\log\alpha$ and $\log\beta$."""
        raw = self.params(h)
        return raw[..., 0].clamp(-5, 5), raw[..., 1] - self.log_tau_mean

    def log_prob(self, tau: Tensor, h: Tensor) -> Tensor:
        log_a, log_b = self.shape_rate(h)
        a = torch.exp(log_a)
        return a * log_b - torch.lgamma(a) + (a - 1) * torch.log(tau) - torch.exp(log_b) * tau

    def log_survival(self, tau: Tensor, h: Tensor) -> Tensor:
        log_a, log_b = self.shape_rate(h)
        return gamma_log_survival(torch.exp(log_a), torch.exp(log_b) * tau)

    def sample(self, h: Tensor) -> Tensor:
        log_a, log_b = self.shape_rate(h)
        return torch._standard_gamma(torch.exp(log_a)) / torch.exp(log_b)

    def mean(self, h: Tensor) -> Tensor:
        log_a, log_b = self.shape_rate(h)
        return torch.exp(log_a - log_b)
