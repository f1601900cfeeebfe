"""The objective interface: a loss of a flow on a batch, and nothing about a particular bijector."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._config import Configurable
from ..flows.base import FlowModel

__all__ = ["Objective", "as_objective", "objective_name"]


class Objective(Configurable):
    """A training objective for [`fit`][flowkit.train.fit].

    Subclasses implement [`loss`][flowkit.train.objective.Objective.loss]; the other
    hooks have defaults. The fit loop knows nothing of a particular objective:
    it hands each batch to `loss`, minimises the returned scalar, logs
    `metrics()` and validates with `validation_loss`.

    Attributes:
        needs_data: True when the objective learns from data (the loop feeds
            batches of the data); False for energy-based objectives, for which
            the loop draws a batch of latent points `z` from the flow's base
            and passes it as `batch`, so that two estimators can be compared
            on the same `z`.
        default_clip: the gradient-norm clip [`fit`][flowkit.train.fit] uses when it is given
            `clip=None` (None: no clipping). Energy-based objectives set one: the reverse KL's gradients
            are heavy-tailed early on, and unclipped steps leave the flow far from the target.
        progress_metrics: names of `metrics()` entries that the progress bar shows beside the
            loss (the number of function evaluations of a continuous flow, for instance).
    """

    _flowkit_register = False
    needs_data: bool = True
    default_clip: float | None = None
    progress_metrics: tuple[str, ...] = ()

    def check_data(self, points: int | None) -> None:
        """Called by [`fit`][flowkit.train.fit] with the number of training points (None when unknown).

        The default accepts any; an objective that holds something per point raises a `ValueError` here
        when its size is not the data's.
        """

    def loss(self, flow: FlowModel, batch: Any) -> Tensor:
        """Scalar loss of `flow` on `batch` (a tensor `x`, a pair `(x, context)`, or latent `z`)."""
        raise NotImplementedError

    def validation_loss(self, flow: FlowModel, batch: Any) -> Tensor:
        """Scalar loss reported on validation data (the flow in eval mode).

        By default [`loss`][flowkit.train.objective.Objective.loss] under `torch.no_grad()`.
        """
        with torch.no_grad():
            return self.loss(flow, batch)

    def metrics(self) -> dict[str, float]:
        """Extra numbers from the last `loss` call, logged by the fit loop (none by default)."""
        return {}


class _Adapted(Objective):
    """An object with a `loss(flow, batch)` method seen as an [`Objective`][flowkit.train.Objective].

    Its own `needs_data`, `validation_loss` and `metrics` where it has them, the defaults otherwise.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.needs_data = bool(getattr(inner, "needs_data", True))
        self.default_clip = getattr(inner, "default_clip", None)
        self.progress_metrics = tuple(getattr(inner, "progress_metrics", ()))

    def loss(self, flow: FlowModel, batch: Any) -> Tensor:
        return self.inner.loss(flow, batch)

    def validation_loss(self, flow: FlowModel, batch: Any) -> Tensor:
        custom = getattr(self.inner, "validation_loss", None)
        return custom(flow, batch) if callable(custom) else super().validation_loss(flow, batch)

    def metrics(self) -> dict[str, float]:
        custom = getattr(self.inner, "metrics", None)
        return dict(custom()) if callable(custom) else {}


def as_objective(objective: Any, where: str = "fit") -> Objective:
    """`objective` itself if it is an [`Objective`][flowkit.train.Objective], else wrapped as one.

    Any object with a `loss(flow, batch)` method is accepted; its `needs_data`, `default_clip`,
    `validation_loss` and `metrics` are used where it has them.

    Raises:
        ValueError: if `objective` has no `loss` method.
    """
    if isinstance(objective, Objective):
        return objective
    if callable(getattr(objective, "loss", None)):
        return _Adapted(objective)
    raise ValueError(f"{where}: objective must have a loss(flow, batch) method, got {type(objective).__name__}")


def objective_name(objective: Any) -> str:
    """The class name of `objective`, or of the object an adapted objective wraps (for error messages)."""
    return type(objective.inner if isinstance(objective, _Adapted) else objective).__name__
