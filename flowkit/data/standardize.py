"""Prepend a data standardisation to a flow, so that it trains on standardised data but reports original units."""

from __future__ import annotations

from torch import Tensor

from ..flows.base import FlowModel

__all__ = ["standardize"]


def standardize(flow: FlowModel, x: Tensor, robust: bool = False) -> FlowModel:
    r"""A flow `Flow(Chain(Standardization.from_data(x), flow.bijector), flow.base)`.

    The returned flow standardises each feature with the mean and standard
    deviation of `x` (the training data) before the original bijector, and
    adds the constant log-determinant $-\sum_i \log s_i$, so its
    `log_prob` is the density of the *original* data. The standardisation is
    saved with the model by [`flowkit.io.save`][flowkit.io.save].

    A [`FreeFormFlow`][flowkit.flows.FreeFormFlow] (no bijector to chain to) gets the standardisation as its
    `preprocessing`: the same networks, trained on standardised data, the density of the original data.
    Other models say whether they can ([`FlowModel.standardized`][flowkit.flows.base.FlowModel.standardized]).

    Arguments:
        flow: an unconditional or conditional flow on vectors `(D,)`.
        x: training data of shape `(N, D)`.
        robust: standardise by the median and the interquartile range / 1.349 instead (the standard deviation
            of heavy-tailed data is dominated by its few largest points; see
            [`Standardization.from_data`][flowkit.bijectors.Standardization.from_data]).
    """
    if not hasattr(flow, "standardized"):  # not a flowkit model (FlowModel)
        raise ValueError(f"standardize: flow must be a flowkit Flow or FreeFormFlow, got {type(flow).__name__}")
    return flow.standardized(x, robust)
