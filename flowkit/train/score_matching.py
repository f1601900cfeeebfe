r"""EBFlow: train a flow by score matching, without the log-determinants of its linear layers.

A flow's log density splits into a part that depends on `x` and a part that
does not:

$$
\log p(x) = \underbrace{\log p_Z(g(x)) + \sum_{i\,\text{varying}} \log|\det J_i(x)|}_{-E(x)}
          + \underbrace{\sum_{i\,\text{constant}} \log|\det J_i|}_{-\log Z},
$$

where the second sum runs over the layers with `ladj_is_constant` (dense and LU linear layers,
permutations, ActNorm). The score $s(x) = \nabla_x \log p(x) = -\nabla_x E(x)$ involves no `det W`, so
score matching trains a flow of dense `D x D` layers in $O(D^2)$ per point instead of $O(D^3)$.
[`ScoreMatching`][flowkit.train.ScoreMatching] is the objective; [`exact_log_prob`][flowkit.train.exact_log_prob]
evaluates the exact likelihood with the constant log-determinants computed once.

References:
    Chao, Sun, Hsu, Lee, Lee, *Training Energy-Based Normalizing Flow with
    Score-Matching Objectives*, NeurIPS 2023 (arXiv:2305.15267).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .._validation import check_point, outermost
from ..bijectors import Bijector, Chain
from ..bijectors.base import context_for
from ..flows import Flow
from ..flows.base import FlowModel
from ..utils import sum_event
from .batches import split_batch
from .objective import Objective

__all__ = ["ScoreMatching", "energy", "score", "exact_log_prob"]

_METHODS = ("ssm", "dsm", "fdsm")


def _walk(bijector: Bijector, x: Tensor, context: Tensor | None, constants: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Run `bijector` on `x`: `(z, sum of the varying ladjs, sum of the constant ladjs or 0)`."""
    batch = x.shape[: x.dim() - len(bijector.event_shape)]
    zero = x.new_zeros(batch)
    if bijector.ladj_is_constant:
        if constants:
            z, ladj = bijector(x, context)
            return z, zero, ladj
        return bijector.call(x, context), zero, zero
    if isinstance(bijector, Chain):
        varying, constant = zero, zero
        for layer in bijector:
            x, v, c = _walk(layer, x, context_for(layer, context), constants)
            varying, constant = varying + v, constant + c
        return x, varying, constant
    z, ladj = bijector(x, context)
    return z, ladj, zero


def _check_flow(flow: FlowModel, where: str) -> None:
    if not getattr(flow, "bijective", False):
        raise ValueError(
            f"{where}: expected a flowkit Flow (a bijector over a base), got {type(flow).__name__}"
            " (a stochastic flow has no energy to match)"
        )


def _energy_and_constant(
    flow: Flow, x: Tensor, context: Tensor | None, constants: bool, where: str
) -> tuple[Tensor, Tensor]:
    _check_flow(flow, where)
    with outermost() as check:
        if check:
            check_point(flow, x, context, "forward", where)
        z, varying, constant = _walk(flow.bijector, x, context, constants)
        return -(flow.base.log_prob(z) + varying), constant


def energy(flow: Flow, x: Tensor, context: Tensor | None = None) -> Tensor:
    """EBFlow energy `E(x) = -log p_Z(g(x)) - sum of the input-dependent log-determinants`.

    Layers with `ladj_is_constant` run through their `call()`: their determinants are never computed.

    Arguments:
        flow: a [`Flow`][flowkit.flows.Flow] (any bijector, any base).
        x: data of shape `(..., *event_shape)`.
        context: context of shape `(..., context_features)` for conditional flows.

    Returns:
        `E(x)` with the batch shape.
    """
    return _energy_and_constant(flow, x, context, False, "energy")[0]


def score(flow: Flow, x: Tensor, context: Tensor | None = None, *, create_graph: bool = False) -> Tensor:
    r"""Score `s(x) = -\nabla_x E(x) = \nabla_x \log p(x)`, computed without any constant log-determinant.

    Arguments:
        flow: a [`Flow`][flowkit.flows.Flow].
        x: data of shape `(..., *event_shape)`.
        context: context for conditional flows.
        create_graph: keep the graph, to differentiate the score again.

    Returns:
        The score, with the shape of `x`.
    """
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        e = energy(flow, x, context)
        return -torch.autograd.grad(e.sum(), x, create_graph=create_graph)[0]


def exact_log_prob(
    flow: Flow,
    x: Tensor,
    context: Tensor | None = None,
    *,
    preprocessing: Bijector | None = None,
    batch_size: int = 4096,
) -> Tensor:
    """Exact `log p(x)`, with the constant log-determinants computed once for all of `x`.

    `log p(x) = -E(x) + sum_constant log|det J_i|`, without gradients. With `preprocessing` (e.g.
    [`Logit`][flowkit.bijectors.Logit]) the flow models `y = h(x)` and
    `log p(x) = log p_flow(h(x)) + log|det J_h(x)|`.

    Arguments:
        flow: a [`Flow`][flowkit.flows.Flow].
        x: raw data of shape `(N, *event_shape)`.
        context: context of shape `(N, context_features)` for conditional flows.
        preprocessing: a bijector applied to `x` before the flow, outside the model.
        batch_size: points per pass.

    Returns:
        `log p(x)`, of shape `(N,)`.
    """
    if batch_size < 1:
        raise ValueError(f"exact_log_prob: batch_size must be positive, got {batch_size}")
    out = []
    constant = None
    with torch.no_grad():
        for start in range(0, x.shape[0], batch_size):
            xb = x[start : start + batch_size]
            cb = None if context is None else context[start : start + batch_size]
            ladj_pre = 0.0
            if preprocessing is not None:
                xb, ladj_pre = preprocessing(xb, cb)
            if constant is None:
                first = _energy_and_constant(flow, xb[:1], None if cb is None else cb[:1], True, "exact_log_prob")
                constant = first[1].reshape(-1)[0]
            e = energy(flow, xb, cb)
            out.append(-e + constant + ladj_pre)
    if not out:
        raise ValueError("exact_log_prob: x holds no points")
    return torch.cat(out)


def _repeat(t: Tensor | None, times: int) -> Tensor | None:
    if t is None or times == 1:
        return t
    return t.repeat(times, *([1] * (t.dim() - 1)))


class ScoreMatching(Objective):
    r"""Score-matching objective of EBFlow: fit the flow's score, never its constant log-determinants.

    The score `s = -\nabla_x E` ([`energy`][flowkit.train.score_matching.energy]) is matched to the data by one
    of three estimators of the Fisher divergence (up to a constant), each divided by the event size `D`:

    - `"ssm"`, sliced score matching with variance reduction:
      $\frac1D\,\mathbb E\big[v^\top \nabla_x (v^\top s(x)) + \tfrac12 |s(x)|^2\big]$ with Rademacher slices
      `v` (`slices` per point; one more backward pass);
    - `"dsm"`, denoising score matching with noise level `sigma`:
      $\frac1D\,\mathbb E\,\tfrac12\,|s(x + \sigma n) + n / \sigma|^2$, `n ~ N(0, I)` (the score of the data
      smoothed by `N(0, sigma^2 I)`: `sigma` sets a bias);
    - `"fdsm"`, finite-difference sliced score matching with `v` uniform on the sphere of radius `epsilon`:
      $\mathbb E\big[(E(x+v) - E(x-v))^2/8 + 2E(x) - E(x+v) - E(x-v)\big] / \epsilon^2$, no second
      derivative (it estimates the SSM objective divided by `D`).

    The SSM expectation is exactly `(1/D) E_data[1/2 |s|^2 + tr(grad s)]`. With `preprocessing` the batch is
    raw data, preprocessed without gradients before matching (MaP), and the validation loss is the raw data's
    exact NLL.

    Arguments:
        method: `"ssm"`, `"dsm"` or `"fdsm"`.
        sigma: noise level of DSM.
        epsilon: step of FDSM.
        slices: Rademacher slices per point for SSM.
        energy_weight: weight of the `mean(E)` regulariser (0 for none).
        preprocessing: a bijector applied to the data outside the model, or None.

    Examples:
        >>> import torch, flowkit
        >>> from flowkit.bijectors import Chain, Linear, SmoothLeakyReLU
        >>> flow = flowkit.Flow(Chain(Linear(4), SmoothLeakyReLU(4), Linear(4)),
        ...                     flowkit.distributions.StandardNormal(4))
        >>> from flowkit.train import ScoreMatching
        >>> objective = ScoreMatching("ssm")
        >>> objective.loss(flow, torch.randn(100, 4)).shape
        torch.Size([])

    References:
        Chao et al., *Training Energy-Based Normalizing Flow with Score-Matching
        Objectives*, NeurIPS 2023 (arXiv:2305.15267); Song et al., *Sliced Score
        Matching*, UAI 2019; Vincent, *A Connection Between Score Matching and
        Denoising Autoencoders*, Neural Computation 2011; Pang et al., *Efficient
        Learning of Generative Models via Finite-Difference Score Matching*, NeurIPS 2020.
    """

    def __init__(
        self,
        method: str = "ssm",
        sigma: float = 0.1,
        epsilon: float = 0.1,
        slices: int = 1,
        energy_weight: float = 0.0,
        preprocessing: Bijector | None = None,
    ) -> None:
        if method not in _METHODS:
            raise ValueError(f"ScoreMatching: method must be one of {_METHODS}, got {method!r}")
        if not sigma > 0:
            raise ValueError(f"ScoreMatching: sigma must be positive, got {sigma}")
        if not epsilon > 0:
            raise ValueError(f"ScoreMatching: epsilon must be positive, got {epsilon}")
        if int(slices) != slices or slices < 1:
            raise ValueError(f"ScoreMatching: slices must be a positive integer, got {slices}")
        if energy_weight < 0:
            raise ValueError(f"ScoreMatching: energy_weight must be non-negative, got {energy_weight}")
        if preprocessing is not None and not isinstance(preprocessing, Bijector):
            raise ValueError(
                f"ScoreMatching: preprocessing must be a flowkit Bijector, got {type(preprocessing).__name__}"
            )
        self.method = method
        self.sigma = float(sigma)
        self.epsilon = float(epsilon)
        self.slices = int(slices)
        self.energy_weight = float(energy_weight)
        self.preprocessing = preprocessing
        self._last_energy: Tensor | None = None

    def _prepare(self, batch: Any, where: str) -> tuple[Tensor, Tensor | None]:
        x, context = split_batch(batch, where)
        if self.preprocessing is not None:
            with torch.no_grad():
                x = self.preprocessing.call(x, context)
        return x.detach(), context

    def loss(self, flow: Flow, batch: Any) -> Tensor:
        """The score-matching loss of `flow` on `batch` (`x` or `(x, context)`), divided by `D`."""
        x, context = self._prepare(batch, "ScoreMatching.loss")
        _check_flow(flow, "ScoreMatching.loss")
        dims = len(flow.event_shape)
        d = math.prod(flow.event_shape)
        with torch.enable_grad():
            if self.method == "ssm":
                x = _repeat(x, self.slices).requires_grad_(True)
                context = _repeat(context, self.slices)
                e = energy(flow, x, context)
                s = -torch.autograd.grad(e.sum(), x, create_graph=True)[0]
                v = torch.empty_like(x).bernoulli_(0.5).mul_(2).sub_(1)
                hvp = torch.autograd.grad((s * v).sum(), x, create_graph=True)[0]
                per_point = sum_event(v * hvp + 0.5 * s.square(), dims) / d
            elif self.method == "dsm":
                noise = torch.randn_like(x)
                x = (x + self.sigma * noise).requires_grad_(True)
                e = energy(flow, x, context)
                s = -torch.autograd.grad(e.sum(), x, create_graph=True)[0]
                per_point = 0.5 * sum_event((s + noise / self.sigma).square(), dims) / d
            else:
                v = torch.randn_like(x)
                norm = sum_event(v.square(), dims).sqrt().reshape(*v.shape[: v.dim() - dims], *([1] * dims))
                v = v / norm * self.epsilon
                ctx3 = None if context is None else torch.cat([context] * 3)
                e_all = energy(flow, torch.cat([x, x + v, x - v]), ctx3)
                e, e_plus, e_minus = e_all.chunk(3)
                per_point = ((e_plus - e_minus).square() / 8 + 2 * e - e_plus - e_minus) / self.epsilon**2
            loss = per_point.mean()
            if self.energy_weight:
                loss = loss + self.energy_weight * e.mean()
        self._last_energy = e.detach().mean()
        return loss

    def validation_loss(self, flow: Flow, batch: Any) -> Tensor:
        """Exact negative log-likelihood per point of the raw `batch` (the preprocessing's log-det added back)."""
        x, context = split_batch(batch, "ScoreMatching.validation_loss")
        return -exact_log_prob(flow, x, context, preprocessing=self.preprocessing).mean()

    def metrics(self) -> dict[str, float]:
        """The mean energy of the last batch."""
        return {} if self._last_energy is None else {"energy": float(self._last_energy)}
