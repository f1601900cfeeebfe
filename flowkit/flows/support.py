r"""Flows on the bounded support of a prior: [`bounded`][flowkit.flows.bounded].

A flow for the posterior of parameters whose prior lives in a box (or on a half-line) gets
[`BoundedSupport`][flowkit.bijectors.BoundedSupport] as its first, data-side layer: every sample lies inside the
support and `log_prob` is $-\infty$ outside it (see the bijector for the maths).
"""

from __future__ import annotations

from typing import Any

from ..bijectors import BoundedSupport, Chain
from .base import FlowModel
from .embedded import EmbeddedFlow
from .flow import Flow

__all__ = ["bounded"]


def bounded(flow: FlowModel, prior: Any = None, *, low: Any = None, high: Any = None) -> FlowModel:
    r"""`flow` mapped onto the support of `prior` (or the box `low`, `high`) by a final elementwise bijection.

    Returns `Flow(Chain(BoundedSupport(low, high), flow.bijector), flow.base)`, which shares the layers of `flow`:
    its samples are `BoundedSupport`'s inverse of `flow`'s, inside the support, and its density has no mass outside.
    An [`EmbeddedFlow`][flowkit.flows.EmbeddedFlow] keeps its embedding around the bounded flow. The layers
    of `flow` then model the unbounded coordinates (the logit of a box coordinate, the inverse softplus of a positive
    one), which is where a standardisation of the data belongs.

    Arguments:
        flow: a [`Flow`][flowkit.flows.Flow] on vectors (a bijector over a base), or an `EmbeddedFlow` of one.
        prior: a `torch.distributions` prior whose `support` gives the bounds (sbi's `BoxUniform`, a `LogNormal`,
            sbi's `MultipleIndependent` of these, ...; see [`support_bounds`][flowkit.bijectors.support_bounds]).
        low: the lower bounds instead of a prior (`(D,)`, a number, `None` entries unbounded).
        high: the upper bounds instead of a prior.

    Raises:
        ValueError: for a prior without bounds on any feature, both a prior and bounds (or neither), a model that is
            not a bijective flow on vectors, or bounds of another size than the flow's features.

    Examples:
        >>> import torch, flowkit
        >>> prior = torch.distributions.Independent(torch.distributions.Uniform(torch.zeros(2), torch.ones(2)), 1)
        >>> flow = flowkit.flows.bounded(flowkit.flows.NSF(2, transforms=2, hidden=(16,)), prior)
        >>> x = flow.sample((1000,))
        >>> bool(((x > 0) & (x < 1)).all()), flow.log_prob(torch.tensor([[0.5, 1.5]]))
        (True, tensor([-inf], grad_fn=<AddBackward0>))
    """
    where = "bounded"
    if isinstance(flow, EmbeddedFlow):
        return EmbeddedFlow(bounded(flow.flow, prior, low=low, high=high), flow.embedding)
    if not getattr(flow, "bijective", False) or not isinstance(flow, Flow):
        raise ValueError(
            f"{where}: the model must be a flowkit Flow (a bijector over a base) or an EmbeddedFlow of one, "
            f"got {type(flow).__name__}"
        )
    if len(flow.event_shape) != 1:
        raise ValueError(f"{where}: the flow's events must be vectors (D,), got {tuple(flow.event_shape)}")
    features = flow.event_shape[0]
    given = low is not None or high is not None
    if (prior is None) == (not given):
        raise ValueError(
            f"{where}: give either a prior or the bounds low= and high=, not {'both' if given else 'neither'}"
        )
    if prior is not None:
        shape = tuple(getattr(prior, "event_shape", (features,)))
        if shape != (features,):
            raise ValueError(f"{where}: the prior's events {shape} are not the flow's ({features},)")
        support = BoundedSupport.from_prior(prior, features)
    else:
        support = BoundedSupport(low, high, features)
    dtype = flow.base.dtype if hasattr(flow.base, "dtype") else None
    device = flow.base.device if hasattr(flow.base, "device") else None
    return Flow(Chain(support.to(device=device, dtype=dtype), flow.bijector), flow.base)
