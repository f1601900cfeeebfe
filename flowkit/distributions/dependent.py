r"""A base for dependent data: standard normal marginals, and the dependence parameters saved with the model.

Flows for dependent data (Kirchler et al., ICML 2023) model the latents of all $n$ training points
jointly, $\operatorname{vec} Z \sim \mathcal N(0, \Sigma \otimes I)$, with $\Sigma$ set by a kinship matrix
and $\lambda$, or by equicorrelated groups and their $\rho$'s
([`DependentMaximumLikelihood`][flowkit.train.DependentMaximumLikelihood]). Each point is marginally
$\mathcal N(0, I)$, so this base's `log_prob` is the standard normal's: the model's density of one new,
unrelated point. It also holds the logits of $\lambda$ or the $\rho$'s as a buffer, so that
[`flowkit.io.save`][flowkit.io.save], [`load`][flowkit.io.load] and the checkpoints of
[`fit`][flowkit.train.fit] carry them with the flow's weights, and a resumed run goes on with the values it
had. The objective reads and writes them; build the base with
[`DependentMaximumLikelihood.base`][flowkit.train.dependent.DependentMaximumLikelihood.base], which sizes
it for the objective's structure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .._validation import check_number
from .normal import StandardNormal

__all__ = ["DependentNormal"]


class DependentNormal(StandardNormal):
    r"""$\mathcal N(0, I)$ marginals for points that depend on each other, with the dependence parameters.

    Arguments:
        event_shape: `D` or a shape such as `(C, H, W)`.
        parameters: how many dependence parameters: 1 ($\lambda$ of a kinship, or a shared $\rho$), or one
            per group or group size.
        value: their initial value, in $(0, 1)$.

    Examples:
        >>> import torch, flowkit
        >>> base = flowkit.distributions.DependentNormal(2, parameters=3, value=0.2)
        >>> base.values
        tensor([0.2000, 0.2000, 0.2000], dtype=torch.float64)
    """

    def __init__(self, event_shape: int | Sequence[int], parameters: int = 1, value: float = 0.5) -> None:
        super().__init__(event_shape)
        parameters = check_number(parameters, "parameters", where="DependentNormal", integer=True, low=1)
        value = check_number(value, "value", where="DependentNormal", positive=True, below=1)
        #: The logits of the dependence parameters (float64 until the model is cast).
        self.register_buffer("logits", torch.full((parameters,), math.log(value / (1 - value)), dtype=torch.float64))

    @property
    def values(self) -> Tensor:
        r"""The dependence parameters $\lambda$ or $\rho$, float64 `(parameters,)`."""
        return torch.sigmoid(self.logits.double())

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}, parameters={self.logits.numel()}"
