"""Maximum likelihood: minimise the negative log-likelihood of data under the flow."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .batches import split_batch
from .objective import Objective

__all__ = ["MaximumLikelihood"]


class MaximumLikelihood(Objective):
    r"""Maximum likelihood (forward KL from the data distribution to the flow).

    For a batch :math:`x_1, \dots, x_B` (with contexts :math:`c_i` for a conditional flow)

    .. math:: L(\theta) = -\frac{1}{B} \sum_{i=1}^B \log q_\theta(x_i \mid c_i),

    an unbiased estimate of :math:`\mathrm{KL}(p \,\|\, q_\theta) + H(p)`. For a
    flow with stochastic blocks, whose exact density is intractable, the loss
    is the negative mean of ``flow.path_log_likelihood(x, context)``, the
    log path weight of the stochastic normalizing flow (Wu, Köhler & Noé 2020).

    Arguments:
        target: optional :class:`~flowkit.targets.Target`; when given, the loss
            uses the forward-KL *path gradient* estimator (Vaitl et al. 2024),
            provided by :meth:`path_gradient_loss`.

    Example:
        >>> import torch, flowkit
        >>> from flowkit.train import MaximumLikelihood, fit
        >>> flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(16,))
        >>> history = fit(flow, MaximumLikelihood(), torch.randn(512, 2), steps=5, progress=False)
        >>> len(history.loss)
        5
    """

    needs_data = True

    def __init__(self, target: Any = None) -> None:
        from .pathgrad import ForwardKLPathGradient

        self.target = target
        # The forward-KL path gradient, with its checks of the target, the flow and the batch.
        self._path_gradient = None if target is None else ForwardKLPathGradient(target)

    @staticmethod
    def negative_log_likelihood(flow: Any, batch: Any) -> Tensor:
        """Mean negative log-likelihood (path log-likelihood for a stochastic flow) of a batch."""
        x, context = split_batch(batch)
        if getattr(flow, "stochastic", False):
            return -flow.path_log_likelihood(x, context).mean()
        return -flow.log_prob(x, context).mean()

    def loss(self, flow: Any, batch: Any) -> Tensor:
        if self.target is not None:
            x, context = split_batch(batch)
            return self.path_gradient_loss(flow, x, context)
        return self.negative_log_likelihood(flow, batch)

    def path_gradient_loss(self, flow: Any, x: Tensor, context: Tensor | None) -> Tensor:
        """Surrogate loss whose gradient is the forward-KL path gradient, using ``self.target``'s forces.

        The estimator of Vaitl et al. 2024 (the recursion run in the inverse
        direction), as in :class:`~flowkit.train.ForwardKLPathGradient`;
        override this method to plug in another. Its value need not be the
        NLL, which is why :meth:`validation_loss` reports the plain NLL.
        """
        if context is not None:
            raise ValueError("MaximumLikelihood(target=...): the forward-KL path gradient takes samples x without context")
        return self._path_gradient.loss(flow, x)

    def validation_loss(self, flow: Any, batch: Any) -> Tensor:
        """The plain mean negative log-likelihood, without gradients."""
        with torch.no_grad():
            return self.negative_log_likelihood(flow, batch)
