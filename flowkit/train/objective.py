"""The objective interface: a loss of a flow on a batch, and nothing about a particular bijector."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .._config import Configurable
from ..flows.base import FlowModel

__all__ = ["Objective", "as_objective", "objective_name", "check_state"]


class Objective(Configurable):
    """A training objective for [`fit`][flowkit.train.fit].

    Subclasses implement [`loss`][flowkit.train.objective.Objective.loss]; the other
    hooks have defaults. The fit loop knows nothing of a particular objective:
    it hands each batch to `loss`, minimises the returned scalar, logs
    `metrics()` and validates with `validation_loss`.

    **State.** An objective may keep state: anything besides the flow and the optimiser that its
    future losses or metrics depend on, such as buffers of samples, adaptive step sizes, counters,
    caches of latents or RNG-dependent draws kept from one step to the next
    ([`FAB`][flowkit.train.FAB]'s replay buffer, AIS step sizes and evaluation count;
    [`DependentMaximumLikelihood`][flowkit.train.DependentMaximumLikelihood]'s dependence parameters and
    control-variate cache). Such an objective returns it from
    [`state_dict`][flowkit.train.objective.Objective.state_dict] and takes it back in
    [`load_state_dict`][flowkit.train.objective.Objective.load_state_dict]; the checkpoints of
    [`fit`][flowkit.train.fit] carry it (tensors in the safetensors file, numbers and strings in its JSON
    header, nothing pickled), so that a resumed run repeats the uninterrupted one exactly. Its
    configuration (the constructor's arguments) and what one `loss` call leaves for the `metrics()` of
    the same step are not state. Most objectives have none: the default is an empty dict.

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

    def state_dict(self) -> dict[str, Any]:
        """The objective's state (see the class docstring); empty by default.

        A dict with string keys whose values are tensors, numbers, strings, None, or lists, tuples and
        dicts of them: what a [checkpoint][flowkit.train.checkpoint.save_state] can hold. As with a
        module's `state_dict`, the tensors may be the objective's own: clone them to keep a copy that
        later steps do not change.
        """
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a [`state_dict`][flowkit.train.objective.Objective.state_dict] (its tensors are copied).

        Raises:
            ValueError: if `state` is not one this objective wrote (the default accepts an empty dict only).
        """
        check_state(state, (), type(self).__name__)


class _Adapted(Objective):
    """An object with a `loss(flow, batch)` method seen as an [`Objective`][flowkit.train.Objective].

    Its own `needs_data`, `validation_loss`, `metrics` and state where it has them, the defaults otherwise.
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

    def state_dict(self) -> dict[str, Any]:
        custom = getattr(self.inner, "state_dict", None)
        return dict(custom()) if callable(custom) else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        custom = getattr(self.inner, "load_state_dict", None)
        if callable(custom):
            custom(state)
        else:
            super().load_state_dict(state)


def as_objective(objective: Any, where: str = "fit") -> Objective:
    """`objective` itself if it is an [`Objective`][flowkit.train.Objective], else wrapped as one.

    Any object with a `loss(flow, batch)` method is accepted; its `needs_data`, `default_clip`,
    `validation_loss`, `metrics`, `state_dict` and `load_state_dict` are used where it has them.

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


def check_state(state: Any, keys: Sequence[str], where: str) -> tuple[Any, ...]:
    """The values of `state` at `keys`, in that order, when it is a dict with exactly those keys.

    For `load_state_dict` methods: `x, log_w = check_state(state, ("x", "log_w"), "MyObjective")`.

    Raises:
        ValueError: naming the missing or unexpected keys (`where` starts the message).
    """
    if not isinstance(state, dict):
        raise ValueError(f"{where}: a state must be a dict, got {type(state).__name__}")
    expected = set(keys)
    missing, unexpected = sorted(expected - set(state)), sorted(map(str, set(state) - expected))
    if missing or unexpected:
        raise ValueError(f"{where}: not a state of this objective (missing {missing}, unexpected {unexpected})")
    return tuple(state[key] for key in keys)
