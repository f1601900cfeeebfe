r"""Noise-augmented maximum likelihood and FlowBack's feature alignment, for TarFlow-style image flows.

[`NoisyMaximumLikelihood`][flowkit.train.noisy.NoisyMaximumLikelihood] trains on $y = x + \sigma\varepsilon$, so that
the flow models the smoothed density $p_\sigma$ whose score denoises samples in one Tweedie step
([`tweedie_denoise`][flowkit.flows.tarflow.tweedie_denoise]).
[`FeatureAlignment`][flowkit.train.noisy.FeatureAlignment] adds to it a REPA-style alignment of the flow's intermediate
generative-pass features with those of a teacher network (FlowBack).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .._validation import check_number
from ..flows.base import FlowModel
from .batches import split_batch
from .objective import Objective

__all__ = ["NoisyMaximumLikelihood", "FeatureAlignment"]


class NoisyMaximumLikelihood(Objective):
    r"""Maximum likelihood of noisy data: $L = -\frac1B \sum_i \log q(x_i + \sigma \varepsilon_i \mid c_i)$.

    Fresh Gaussian noise at each batch (validation too). The flow then models $p_\sigma = p * \mathcal N(0,
    \sigma^2 I)$; samples are denoised with its score. TarFlow trains with $\sigma$ around 0.05 to 0.1 of the pixel
    range.

    Arguments:
        sigma: the noise level $\sigma \ge 0$ (0: plain maximum likelihood).

    Raises:
        ValueError: (in `loss`) for a flow whose `noise` attribute (TarFlow's) disagrees with `sigma`.

    Examples:
        >>> import torch, flowkit
        >>> flow = flowkit.flows.TarFlow((1, 4, 4), patch=2, blocks=1, width=8, layers=1, heads=2, alpha=None,
        ...                              noise=0.1)
        >>> history = flowkit.train.fit(flow, NoisyMaximumLikelihood(0.1), torch.rand(64, 1, 4, 4), steps=2,
        ...                             progress=False)
        >>> len(history.loss)
        2

    References:
        Zhai et al., *Normalizing Flows are Capable Generative Models*, arXiv:2412.06329 (2024).
    """

    def __init__(self, sigma: float) -> None:
        self.sigma = check_number(sigma, "sigma", where="NoisyMaximumLikelihood", low=0.0)

    def noisy(self, flow: FlowModel, batch: Any) -> tuple[Tensor, Tensor | None]:
        """The batch's points with noise added, and its context."""
        declared = getattr(flow, "noise", None)
        if declared is not None and float(declared) != self.sigma:
            raise ValueError(
                f"{type(self).__name__}: the flow declares noise={declared} but the objective adds sigma={self.sigma}"
            )
        x, context = split_batch(batch, type(self).__name__)
        return x + self.sigma * torch.randn_like(x), context

    def loss(self, flow: FlowModel, batch: Any) -> Tensor:
        y, context = self.noisy(flow, batch)
        return -flow.path_log_likelihood(y, context).mean()


class FeatureAlignment(NoisyMaximumLikelihood):
    r"""FlowBack's objective: (noisy) likelihood plus the alignment of generative-pass features with a teacher's.

    $$L = -\frac1B \sum_i \log q(y_i \mid c_i)
    + \lambda \frac1B \sum_i \Big(1 - \cos\big(g(\bar h(y_i)),\, f(x_i)\big)\Big),$$

    where $\bar h$ is the mean over tokens of the states after layer `layer` of the transformer of block `block`
    (the features the generative, reverse pass computes there while producing $y$), $g$ the flow's projection head
    (`flow.projection`, e.g. `TarFlow(..., features=D_f)`), and $f$ the frozen teacher's features `(B, D_f)` of the
    clean images. The teacher is any module (FlowBack uses a vision foundation model; a small classifier trained
    on the same data serves offline).

    Arguments:
        teacher: a module mapping images `(B, C, H, W)` to features `(B, D_f)`; run without gradients.
        weight: $\lambda$.
        sigma: the training noise level (as in [`NoisyMaximumLikelihood`][flowkit.train.noisy.NoisyMaximumLikelihood]).
        block: which transformer block, data side first (the last to run in the generative pass is 0).
        layer: after which of the block's layers (1 = the first).

    References:
        FlowBack, arXiv:2511.22345 (AAAI 2026); Yu et al., *Representation Alignment for Generation* (REPA),
        arXiv:2410.06940.
    """

    def __init__(
        self, teacher: nn.Module, weight: float = 0.5, sigma: float = 0.0, block: int = 0, layer: int = 1
    ) -> None:
        super().__init__(sigma)
        if not isinstance(teacher, nn.Module):
            raise ValueError(f"FeatureAlignment: teacher must be a torch module, got {type(teacher).__name__}")
        self.teacher = teacher
        self.weight = check_number(weight, "weight", where="FeatureAlignment", low=0.0)
        self.block = check_number(block, "block", where="FeatureAlignment", integer=True, low=0)
        self.layer = check_number(layer, "layer", where="FeatureAlignment", integer=True, low=1)
        self._last: dict[str, float] = {}

    def alignment(self, flow: FlowModel, y: Tensor, x: Tensor, context: Tensor | None) -> Tensor:
        """Mean `1 - cos` between the projected features of noisy `y` and the teacher's features of `x`."""
        projection = getattr(flow, "projection", None)
        if projection is None or not callable(getattr(flow, "hidden_states", None)):
            raise ValueError(
                "FeatureAlignment: the flow needs hidden_states and a projection head (TarFlow(features=...))"
            )
        blocks = len(flow.blocks)
        if self.block >= blocks:
            raise ValueError(f"FeatureAlignment: block {self.block} is not among the flow's {blocks} blocks")
        states = flow.hidden_states(y, context, self.block)
        if self.layer >= len(states):
            raise ValueError(f"FeatureAlignment: layer {self.layer} is not among the block's {len(states) - 1} layers")
        with torch.no_grad():
            was_training = self.teacher.training
            self.teacher.eval()
            target = self.teacher(x)
            self.teacher.train(was_training)
        if target.dim() != 2 or target.shape[0] != len(y):
            raise ValueError(f"FeatureAlignment: the teacher must return (batch, features), got {tuple(target.shape)}")
        predicted = projection(states[self.layer].mean(1))
        return (1 - F.cosine_similarity(predicted, target.to(predicted), dim=-1)).mean()

    def loss(self, flow: FlowModel, batch: Any) -> Tensor:
        y, context = self.noisy(flow, batch)
        x = split_batch(batch)[0]
        nll = -flow.path_log_likelihood(y, context).mean()
        align = self.alignment(flow, y, x, context)
        self._last = {"nll": nll.item(), "alignment": align.item()}
        return nll + self.weight * align

    def validation_loss(self, flow: FlowModel, batch: Any) -> Tensor:
        with torch.no_grad():  # the likelihood alone, comparable across weights
            return NoisyMaximumLikelihood.loss(self, flow, batch)

    def metrics(self) -> dict[str, float]:
        return dict(self._last)
