r"""Constrained training by the Modified Differential Multiplier Method (MDMM), as an objective wrapper.

[`Constrained`][flowkit.train.Constrained] turns an objective $f(\theta)$ and constraints into the damped
Lagrangian of Platt & Barr (1988),

$$
\mathcal L(\theta, \lambda) = f(\theta) + \sum_k \lambda_k\, h_k(\theta, \lambda_k)
    + \frac{d_k}{2}\, h_k(\theta, \lambda_k)^2 ,
$$

minimised over the flow's parameters $\theta$ by [`fit`][flowkit.train.fit]'s optimiser and *maximised*
over the multipliers $\lambda_k$ by gradient ascent with their own learning rate $\eta$,
$\lambda_k \leftarrow \lambda_k + \eta\, \partial\mathcal L / \partial\lambda_k = \lambda_k + \eta\, h_k$,
taken inside [`loss`][flowkit.train.constraints.Constrained.loss] from the same batch as the flow's step. The damping
$d_k \ge 0$ makes the constrained optimum a local minimum of $\mathcal L$ in $\theta$ where the plain
Lagrangian has only a saddle, so gradient descent-ascent converges (Platt & Barr's theorem).

**Constraints.** With the constraint function $c_k(\theta)$ (a scalar of the flow and the batch):

- [`Equality`][flowkit.train.Equality] $c_k = a$: $h_k = g_k = c_k - a$;
- [`AtMost`][flowkit.train.AtMost] $c_k \le b$ and [`AtLeast`][flowkit.train.AtLeast] $c_k \ge b$:
  $g_k = c_k - b \le 0$ (resp. $b - c_k \le 0$), turned into the equality $g_k + s_k^2 = 0$ with a slack
  variable $s_k$. The slack is not a trained parameter: given $\theta$ and $\lambda_k$ the Lagrangian is a
  convex quadratic in $u = s_k^2 \ge 0$, minimised at $u = \max(0, -g_k - \lambda_k/d_k)$, so that
  $h_k = g_k + u = \max(g_k, -\lambda_k / d_k)$ (the classical elimination of the slack, Bertsekas 1982,
  §3.1). A slack constraint ($g_k < 0$) drives $\lambda_k$ to 0 and then exerts no force; an active one
  behaves as the equality $g_k = 0$. `form="max"` uses $h_k = \max(g_k, 0)$ instead (no slack: the
  multiplier only grows, while the constraint is violated).

**Sign convention.** The Lagrangian is $f + \lambda g$; at a constrained optimum
$\nabla f = -\lambda \nabla g$, and the multiplier of an active inequality is $\lambda \ge 0$: the rate at
which the best objective falls as the bound is relaxed. Minimising $x^2$ subject to $x = 1$ written as
`Equality("x", c, value=1.0)` ($g = x - 1$) ends at $\lambda = -2$; as `AtLeast("x", c, 1.0)` (active)
at $\lambda = 2$. (The `mdmm` package writes the infeasibility as $a - c$, so its multipliers are the
negatives of these for equalities.)

**State.** The multipliers are state: [`state_dict`][flowkit.train.constraints.Constrained.state_dict] holds them
(with the wrapped objective's own state), and the checkpoints of [`fit`][flowkit.train.fit] carry them, so
a resumed run repeats the uninterrupted one bit for bit. The history logs, at every step, the wrapped
objective's loss (`objective`), each constraint's value (`constraint_NAME`) and its multiplier
(`multiplier_NAME`, the one used in that step).

References:
    Platt & Barr, *Constrained differential optimization*, NeurIPS 1988;
    Bertsekas, *Constrained optimization and Lagrange multiplier methods*, Academic Press 1982;
    K. Crowson, `mdmm` (MIT), the PyTorch formulation with a negated learning rate for the multipliers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .._validation import check_number
from ..flows.base import FlowModel
from .objective import Objective, as_objective, check_state, objective_name

__all__ = ["Constraint", "Equality", "AtMost", "AtLeast", "Constrained"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

ConstraintFunction = Callable[[FlowModel, Any], Tensor]


class Constraint:
    r"""A named constraint on a scalar $c(\theta)$ = `fn(flow, batch)`; use a subclass.

    Arguments:
        name: a name for the history (letters, digits and underscores).
        fn: the constraint function, called as `fn(flow, batch)` with the batch of the step; it returns a
            scalar tensor that depends on the flow's parameters (a batch estimate is fine: the multiplier
            averages it over steps).
        damping: the damping $d \ge 0$ of the term $\frac{d}{2} h^2$ (positive for inequalities with a slack).

    Attributes:
        kind: `"equality"` or `"inequality"` ($g \le 0$).
    """

    kind: str = "equality"

    def __init__(self, name: str, fn: ConstraintFunction, damping: float = 1.0) -> None:
        where = type(self).__name__
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{where}: name must be letters, digits and underscores, got {name!r}")
        if not callable(fn):
            raise ValueError(f"{where}: fn must be callable as fn(flow, batch), got {type(fn).__name__}")
        self.name, self.fn = name, fn
        self.damping = float(check_number(damping, "damping", where=where, low=0.0))

    def violation(self, value: Tensor) -> Tensor:
        r"""$g$ from the constraint function's value $c$ (the constraint holds when $g = 0$, resp. $g \le 0$)."""
        raise NotImplementedError

    def infeasibility(self, g: Tensor, multiplier: Tensor) -> Tensor:
        """$h$, the term the multiplier multiplies: $g$ for an equality."""
        return g

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, damping={self.damping:g})"


class Equality(Constraint):
    r"""The equality $c(\theta) = a$: $g = c - a$.

    Arguments:
        name: a name for the history.
        fn: the constraint function `fn(flow, batch) -> scalar tensor`.
        value: the target $a$.
        damping: the damping $d \ge 0$.

    Examples:
        >>> import torch
        >>> from flowkit.train import Equality
        >>> Equality("mean_zero", lambda flow, x: flow(x)[0].mean(), value=0.0).violation(torch.tensor(0.25))
        tensor(0.2500)
    """

    kind = "equality"

    def __init__(self, name: str, fn: ConstraintFunction, value: float = 0.0, damping: float = 1.0) -> None:
        super().__init__(name, fn, damping)
        self.value = float(check_number(value, "value", where="Equality"))

    def violation(self, value: Tensor) -> Tensor:
        return value - self.value


class _Inequality(Constraint):
    kind = "inequality"

    def __init__(
        self, name: str, fn: ConstraintFunction, bound: float, damping: float = 1.0, form: str = "slack"
    ) -> None:
        where = type(self).__name__
        super().__init__(name, fn, damping)
        self.bound = float(check_number(bound, "bound", where=where))
        if form not in ("slack", "max"):
            raise ValueError(f"{where}: form must be 'slack' or 'max', got {form!r}")
        if form == "slack" and self.damping == 0:
            raise ValueError(f"{where}: the slack form needs a positive damping (it sets the slack's optimum)")
        self.form = form

    def infeasibility(self, g: Tensor, multiplier: Tensor) -> Tensor:
        if self.form == "max":
            return g.clamp(min=0)
        return torch.maximum(g, -multiplier / self.damping)  # g + s^2 at the slack's optimum


class AtMost(_Inequality):
    r"""The inequality $c(\theta) \le b$: $g = c - b \le 0$.

    Arguments:
        name: a name for the history.
        fn: the constraint function `fn(flow, batch) -> scalar tensor`.
        bound: the bound $b$.
        damping: the damping $d$ (positive for the slack form).
        form: `"slack"` (a slack variable, eliminated in closed form) or `"max"` ($h = \max(g, 0)$).
    """

    def violation(self, value: Tensor) -> Tensor:
        return value - self.bound


class AtLeast(_Inequality):
    r"""The inequality $c(\theta) \ge b$: $g = b - c \le 0$.

    Arguments:
        name: a name for the history.
        fn: the constraint function `fn(flow, batch) -> scalar tensor`.
        bound: the bound $b$.
        damping: the damping $d$ (positive for the slack form).
        form: `"slack"` (a slack variable, eliminated in closed form) or `"max"` ($h = \max(g, 0)$).
    """

    def violation(self, value: Tensor) -> Tensor:
        return self.bound - value


class Constrained(Objective):
    r"""Any objective under equality and inequality constraints, trained by MDMM in the one fit loop.

    The loss is the damped Lagrangian of the module docstring
    ([`flowkit.train.constraints`][flowkit.train.constraints]); each training call of `loss` also takes
    the multipliers' ascent step $\lambda_k \leftarrow \lambda_k + \eta h_k$ (skipped when a value is not
    finite; under `torchrun` the $h_k$ are averaged over the processes first, so every rank keeps the same
    multipliers). [`fit`][flowkit.train.fit] needs to know nothing of it.

    Arguments:
        objective: the objective $f$ (an [`Objective`][flowkit.train.Objective] or any object with
            `loss(flow, batch)`).
        constraints: the [`Equality`][flowkit.train.Equality], [`AtMost`][flowkit.train.AtMost] and
            [`AtLeast`][flowkit.train.AtLeast] constraints, with distinct names.
        lr: the multipliers' learning rate $\eta > 0$ (plain gradient ascent).
        multipliers: their initial values (default 0).

    Attributes:
        multipliers: the current $\lambda_k$ (float64, in the order of `constraints`).

    References:
        Platt & Barr, *Constrained differential optimization*, NeurIPS 1988.

    Examples:
        Minimise $x^2$ subject to $x = 1$: the multiplier tends to $-2$ ($\nabla f = -\lambda \nabla g$).

        >>> import torch
        >>> from flowkit.train import Constrained, Equality, fit
        >>> point = torch.nn.Linear(1, 1, bias=False)  # its weight is x
        >>> square = type("Square", (), {"loss": lambda self, m, batch: m.weight.square().sum()})()
        >>> objective = Constrained(square, [Equality("x", lambda m, batch: m.weight.sum(), value=1.0)], lr=0.05)
        >>> history = fit(point, objective, torch.zeros(8, 1), steps=2000, batch_size=8, lr=0.05,
        ...               optimizer="sgd", schedule=None, progress=False)
        >>> round(point.weight.item(), 3), round(objective.multipliers[0].item(), 3)
        (1.0, -2.0)
        >>> sorted(history.metrics)
        ['constraint_x', 'multiplier_x', 'objective']
    """

    def __init__(
        self,
        objective: Any,
        constraints: Sequence[Constraint],
        lr: float = 1e-2,
        multipliers: Sequence[float] | None = None,
    ) -> None:
        where = "Constrained"
        self.objective = as_objective(objective, where)
        constraints = list(constraints)
        bad = [type(c).__name__ for c in constraints if not isinstance(c, Constraint)]
        if bad or not constraints:
            raise ValueError(f"{where}: constraints must be a non-empty list of Equality/AtMost/AtLeast, got {bad}")
        names = [c.name for c in constraints]
        if len(set(names)) != len(names):
            raise ValueError(f"{where}: constraint names must be distinct, got {names}")
        self.constraints = constraints
        self.lr = float(check_number(lr, "lr", where=where, positive=True))
        start = [0.0] * len(constraints) if multipliers is None else [float(m) for m in multipliers]
        if len(start) != len(constraints) or not all(math.isfinite(m) for m in start):
            raise ValueError(f"{where}: multipliers must be {len(constraints)} finite numbers, got {multipliers}")
        self.multipliers = torch.tensor(start, dtype=torch.float64)
        self.needs_data = self.objective.needs_data
        self.default_clip = self.objective.default_clip
        self.progress_metrics = self.objective.progress_metrics
        self._metrics: dict[str, float] = {}

    def check_data(self, points: int | None) -> None:
        self.objective.check_data(points)

    def terms(self, flow: FlowModel, batch: Any) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The wrapped objective's loss, the constraint values $c_k$, the violations $g_k$ and the $h_k$.

        The multipliers are not changed; $h_k$ uses their current values.
        """
        base = self.objective.loss(flow, batch)
        values = [c.fn(flow, batch) for c in self.constraints]
        for constraint, value in zip(self.constraints, values, strict=True):
            if not isinstance(value, Tensor) or value.numel() != 1:
                shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(
                    f"Constrained: constraint {constraint.name!r} must return a scalar tensor, got {shape}"
                )
        value = torch.stack([v.reshape(()).to(base.dtype) for v in values])
        lam = self.multipliers.to(device=base.device, dtype=base.dtype)
        g = torch.stack([c.violation(v) for c, v in zip(self.constraints, value, strict=True)])
        h = torch.stack([c.infeasibility(gk, lk) for c, gk, lk in zip(self.constraints, g, lam, strict=True)])
        return base, value, g, h

    def lagrangian(self, base: Tensor, h: Tensor) -> Tensor:
        r"""$f + \sum_k \lambda_k h_k + \frac{d_k}{2} h_k^2$ with the current multipliers."""
        lam = self.multipliers.to(device=h.device, dtype=h.dtype)
        damping = torch.tensor([c.damping for c in self.constraints], device=h.device, dtype=h.dtype)
        return base + (lam * h + 0.5 * damping * h.square()).sum()

    def loss(self, flow: FlowModel, batch: Any) -> Tensor:
        """The damped Lagrangian on `batch`; then the multipliers' ascent step."""
        base, value, _, h = self.terms(flow, batch)
        total = self.lagrangian(base, h)
        step = h.detach().to(torch.float64).cpu()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            step = _mean_over_ranks(step, h.device)
        used = self.multipliers.clone()
        if bool(torch.isfinite(step).all()) and bool(torch.isfinite(total.detach())):
            self.multipliers = self.multipliers + self.lr * step
        self._metrics = {"objective": float(base.detach())}
        for constraint, v, lam in zip(self.constraints, value.detach().tolist(), used.tolist(), strict=True):
            self._metrics[f"constraint_{constraint.name}"] = v
            self._metrics[f"multiplier_{constraint.name}"] = lam
        return total

    def validation_loss(self, flow: FlowModel, batch: Any) -> Tensor:
        """The wrapped objective's validation loss (the quantity minimised; the multipliers do not move)."""
        return self.objective.validation_loss(flow, batch)

    def metrics(self) -> dict[str, float]:
        """The wrapped objective's metrics, its loss (`objective`), and each `constraint_NAME`, `multiplier_NAME`."""
        return {**self.objective.metrics(), **self._metrics}

    def state_dict(self) -> dict[str, Any]:
        """The multipliers (a copy) and the wrapped objective's state."""
        return {"multipliers": self.multipliers.clone(), "objective": self.objective.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a [`state_dict`][flowkit.train.constraints.Constrained.state_dict].

        Raises:
            ValueError: if `state` is not one of this objective (another number of constraints included).
        """
        multipliers, inner = check_state(state, ("multipliers", "objective"), "Constrained")
        if not isinstance(multipliers, Tensor) or multipliers.shape != self.multipliers.shape:
            shape = tuple(multipliers.shape) if isinstance(multipliers, Tensor) else type(multipliers).__name__
            raise ValueError(
                f"Constrained: the state holds multipliers of shape {shape}, "
                f"this objective has {len(self.constraints)} constraints"
            )
        self.objective.load_state_dict(inner)
        self.multipliers = multipliers.detach().to(torch.float64).cpu().clone()

    def __repr__(self) -> str:
        return f"Constrained({objective_name(self.objective)}, {self.constraints}, lr={self.lr:g})"


def _mean_over_ranks(values: Tensor, device: torch.device) -> Tensor:
    """The mean of `values` over the processes of the default group (on `device`: NCCL needs CUDA tensors)."""
    buffer = values.to(device)
    torch.distributed.all_reduce(buffer)
    return buffer.cpu() / torch.distributed.get_world_size()
