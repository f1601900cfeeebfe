"""The energy of anything that has one: a target, or a distribution through its log density."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..distributions import Distribution

__all__ = ["energy_of"]


def energy_of(model: Any, x: Tensor, event_dims: int, where: str = "energy") -> Tensor:
    """Energy (negative unnormalised log density) of `x` under `model`, with the batch shape.

    `model` is anything with an `energy(x)` method (a flowkit target), or a flowkit
    [`Distribution`][flowkit.distributions.Distribution], whose energy is `-log_prob(x)`.

    Raises:
        ValueError: when the model has neither, or its energy does not have the batch shape.
    """
    if hasattr(model, "energy"):
        u = model.energy(x)
    elif isinstance(model, Distribution):
        event = tuple(model.event_shape)
        if len(event) != event_dims or tuple(x.shape[x.dim() - event_dims :]) != event:
            raise ValueError(
                f"{where}: {type(model).__name__} has event shape {event} but the points have shape {tuple(x.shape)}"
            )
        u = -model.log_prob(x)
    else:
        raise ValueError(f"{where}: {type(model).__name__} has no energy(x) method and is not a flowkit Distribution")
    batch = x.shape[: x.dim() - event_dims]
    if not isinstance(u, Tensor) or tuple(u.shape) != tuple(batch):
        shape = tuple(u.shape) if isinstance(u, Tensor) else type(u).__name__
        raise ValueError(
            f"{where}: {type(model).__name__}.energy returned {shape} for inputs of shape {tuple(x.shape)}; "
            f"expected one energy per event, of shape {tuple(batch)}"
        )
    return u
