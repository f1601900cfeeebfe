"""Prepend a data standardisation to a flow, so that it trains on standardised data but reports original units."""

from __future__ import annotations

from torch import Tensor

from ..bijectors import Chain, Standardization
from ..flows import Flow, FreeFormFlow

__all__ = ["standardize"]


def standardize(flow: Flow | FreeFormFlow, x: Tensor, robust: bool = False) -> Flow | FreeFormFlow:
    r"""A flow `Flow(Chain(Standardization.from_data(x), flow.bijector), flow.base)`.

    The returned flow standardises each feature with the mean and standard
    deviation of `x` (the training data) before the original bijector, and
    adds the constant log-determinant $-\sum_i \log s_i$, so its
    `log_prob` is the density of the *original* data. The standardisation is
    saved with the model by [`flowkit.io.save`][flowkit.io.save].

    A [`FreeFormFlow`][flowkit.flows.FreeFormFlow] (no bijector to chain to) gets the standardisation as its
    `preprocessing`: the same networks, trained on standardised data, the density of the original data.

    Arguments:
        flow: an unconditional or conditional flow on vectors `(D,)`.
        x: training data of shape `(N, D)`.
        robust: standardise by the median and the interquartile range / 1.349 instead (the standard deviation
            of heavy-tailed data is dominated by its few largest points; see
            [`Standardization.from_data`][flowkit.bijectors.Standardization.from_data]).
    """
    if not isinstance(flow, (Flow, FreeFormFlow)):
        raise ValueError(f"standardize: flow must be a flowkit Flow or FreeFormFlow, got {type(flow).__name__}")
    if isinstance(flow, FreeFormFlow) and flow.preprocessing is not None:
        raise ValueError("standardize: the FreeFormFlow has a preprocessing already")
    if not isinstance(x, Tensor) or not x.is_floating_point():
        kind = f"a {x.dtype} tensor" if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"standardize: x must be a floating-point torch.Tensor, got {kind}")
    if len(flow.event_shape) != 1 or x.dim() != 2 or x.shape[1] != flow.event_shape[0]:
        raise ValueError(
            f"standardize: data of shape {tuple(x.shape)} do not fit a flow on events of shape "
            f"{tuple(flow.event_shape)}"
        )
    # The layer takes the flow's dtype and device (the statistics are exact in float64).
    scaling = Standardization.from_data(x, robust=robust).to(device=flow.base.device, dtype=flow.base.dtype)
    if isinstance(flow, FreeFormFlow):
        return FreeFormFlow(flow.encoder, flow.decoder, flow.features, flow.base, preprocessing=scaling)
    return Flow(Chain(scaling, flow.bijector), flow.base)
