"""Maximum likelihood: minimise the negative log-likelihood of data under the flow."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._validation import check_tensor
from ..flows.base import FlowModel
from ..targets import Target
from .batches import split_batch
from .objective import Objective
from .pathgrad import _check_flow, forward_kl_loss

__all__ = ["MaximumLikelihood", "ForwardKLPathGradient"]


class MaximumLikelihood(Objective):
    r"""Maximum likelihood (forward KL from the data distribution to the flow).

    For a batch $x_1, \dots, x_B$ (with contexts $c_i$ for a conditional flow)

    $$
    L(\theta) = -\frac{1}{B} \sum_{i=1}^B \log q_\theta(x_i \mid c_i),
    $$

    an unbiased estimate of $\mathrm{KL}(p \,\|\, q_\theta) + H(p)$. The loss
    is minus the mean of `flow.path_log_likelihood(x, context)`: `log_prob` for a
    [`Flow`][flowkit.flows.Flow], the log path weight for a
    [`StochasticFlow`][flowkit.flows.StochasticFlow], whose exact density is intractable
    (Wu, Köhler & Noé 2020).

    Arguments:
        target: optional [`Target`][flowkit.targets.Target]; when given, the loss
            uses the forward-KL *path gradient* estimator (Vaitl et al. 2024),
            provided by [`path_gradient_loss`][flowkit.train.likelihood.MaximumLikelihood.path_gradient_loss].

    Examples:
        >>> import torch, flowkit
        >>> from flowkit.train import MaximumLikelihood, fit
        >>> flow = flowkit.flows.RealNVP(2, transforms=2, hidden=(16,))
        >>> history = fit(flow, MaximumLikelihood(), torch.randn(512, 2), steps=5, progress=False)
        >>> len(history.loss)
        5
    """

    needs_data = True

    def __init__(self, target: Any = None) -> None:
        if target is not None and not isinstance(target, Target):
            raise ValueError(
                f"{type(self).__name__}: target must be a flowkit.targets.Target, got {type(target).__name__}"
            )
        self.target = target

    @staticmethod
    def negative_log_likelihood(flow: FlowModel, batch: Any) -> Tensor:
        """Mean negative log-likelihood (path log-likelihood for a stochastic flow) of a batch."""
        x, context = split_batch(batch)
        return -flow.path_log_likelihood(x, context).mean()

    def loss(self, flow: FlowModel, batch: Any) -> Tensor:
        if self.target is not None:
            x, context = split_batch(batch)
            return self.path_gradient_loss(flow, x, context)
        return self.negative_log_likelihood(flow, batch)

    def path_gradient_loss(self, flow: FlowModel, x: Tensor, context: Tensor | None) -> Tensor:
        """Surrogate loss whose gradient is the forward-KL path gradient, using `self.target`'s forces.

        The estimator of Vaitl et al. 2024 (the recursion run in the inverse
        direction, [`forward_kl_loss`][flowkit.train.pathgrad.forward_kl_loss]);
        override this method to plug in another. Its value is the NLL.
        """
        where = type(self).__name__
        if context is not None:
            raise ValueError(f"{where}(target=...): the forward-KL path gradient takes samples x without context")
        _check_flow(flow, self.target, where)
        check_tensor(x, flow.event_shape, name="x", dtype=flow.base.dtype, where=where)
        return forward_kl_loss(flow, self.target, x)

    def validation_loss(self, flow: FlowModel, batch: Any) -> Tensor:
        """The plain mean negative log-likelihood, without gradients."""
        with torch.no_grad():
            return self.negative_log_likelihood(flow, batch)


class ForwardKLPathGradient(MaximumLikelihood):
    r"""Maximum likelihood on target samples with the forward-KL path gradient (GDReG).

    The same objective as `MaximumLikelihood(target=target)`, under the name of
    its estimator. With $z = f_\theta(x)$ the normalizing map,
    $KL(p \| q_\theta) = KL(f_\theta{}_\# p \| q_0)$, whose path gradient is

    $$
    \nabla_\theta \approx E_{x \sim p}\big[(\nabla_z \log p_Z(z) - \nabla_z \log q_0(z))
    \cdot \partial_\theta f_\theta(x)\big],
    $$

    where $\nabla_z \log p_Z$ is carried along the normalizing pass from the
    target's force $\nabla_x \log p = -\nabla u$ by
    [`forward_with_score`][flowkit.train.score_rules.forward_with_score] (Vaitl et
    al. 2024, the recursion run in the inverse direction). The forces act as a
    regulariser; the expected gradient equals maximum likelihood's. The loss
    value is the negative log-likelihood `mean(-log q(x))`.

    Arguments:
        target: the target whose samples the batches are (its forces are used).
    """

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        if target is None:
            raise ValueError("ForwardKLPathGradient: target must be a flowkit.targets.Target, got None")

    def loss(self, flow: FlowModel, batch: Any) -> Tensor:
        if isinstance(batch, (tuple, list)):
            raise ValueError("ForwardKLPathGradient: batches are samples x only (targets have no context)")
        return super().loss(flow, batch)
