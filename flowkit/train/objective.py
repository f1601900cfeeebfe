"""The objective interface: a loss of a flow on a batch, and nothing about a particular bijector."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .._config import Configurable

__all__ = ["Objective"]


class Objective(Configurable):
    """A training objective for :func:`flowkit.train.fit`.

    Subclasses implement :meth:`loss`. The fit loop knows nothing of a
    particular objective: it hands each batch to :meth:`loss` and
    minimises the returned scalar.

    Attributes:
        needs_data: True when the objective learns from data (the loop feeds
            batches of the data); False for energy-based objectives, for which
            the loop draws a batch of latent points ``z`` from the flow's base
            and passes it as ``batch``, so that two estimators can be compared
            on the same ``z``.
    """

    _flowkit_register = False
    needs_data: bool = True

    def loss(self, flow: Any, batch: Any) -> Tensor:
        """Scalar loss of ``flow`` on ``batch`` (a tensor ``x``, a pair ``(x, context)``, or latent ``z``)."""
        raise NotImplementedError

    def metrics(self) -> dict[str, float]:
        """Extra numbers from the last :meth:`loss` call, logged by the fit loop (none by default)."""
        return {}
