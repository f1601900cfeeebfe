r"""Continuous normalizing flows: a bijector defined by an ODE, solved by flowkit's `dopri5` or `torchdiffeq`.

A [`ContinuousFlow`][flowkit.bijectors.ContinuousFlow] maps data $x$ to latent
$z = x(T)$ by integrating $\dot x = f(x, t, c)$ from $t = 0$ to $T$, with the
instantaneous change of variables (Chen et al. 2018)

$$
\frac{d}{dt} \log|\det \partial x(t)/\partial x(0)| = \operatorname{tr} \frac{\partial f}{\partial x}(x(t), t, c).
$$

Integrals along the same solve (the kinetic energy and Jacobian norm that the RNODE
regularisers of [`flowkit.train.continuous`][flowkit.train.continuous] weigh) are returned by
[`forward_with_integrals`][flowkit.bijectors.ContinuousFlow.forward_with_integrals]; the
bijector itself knows nothing of training.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torchdiffeq
from torch import Tensor, nn
from torchdiffeq._impl.odeint import SOLVERS  # torchdiffeq's table of solver names (pinned <0.3 in setup.cfg)
from torchdiffeq._impl.solvers import AdaptiveStepsizeODESolver

from .._validation import check_number
from ..root_finding import ConvergenceError
from ..utils import as_shape
from .base import Bijector
from .linear import _loaded
from .ode import dopri5

__all__ = ["ContinuousFlow", "TRACES", "PROBES", "trajectory_integrals", "function_evaluations", "continuous_layers"]

#: Estimators of the divergence: the exact trace (D vector-Jacobian products) or Hutchinson's (one).
TRACES = ("exact", "hutchinson")
#: Distributions of Hutchinson's probe.
PROBES = ("rademacher", "gaussian")
#: Integrals along the forward solve (see `ContinuousFlow.forward_with_integrals`).
INTEGRALS = ("kinetic", "jacobian", "hjb")
#: Up to this many dimensions the exact trace's vector-Jacobian products run in a loop rather than under vmap.
_LOOP_BELOW = 8
#: Activations with a kink (a discontinuous first derivative): an adaptive solver's error control assumes a smooth
#: field and takes tens to thousands of times more steps on one.
NON_SMOOTH_ACTIVATIONS = ("relu", "leaky_relu")
#: `solver_options` that are step sizes: positive and finite when given.
_STEP_OPTIONS = ("step_size", "first_step")
#: The adaptive (error-controlled) solvers among torchdiffeq's.
_ADAPTIVE = tuple(name for name, cls in SOLVERS.items() if issubclass(cls, AdaptiveStepsizeODESolver))


def continuous_layers(module: nn.Module) -> list[ContinuousFlow]:
    """The [`ContinuousFlow`][flowkit.bijectors.ContinuousFlow] layers inside `module` (itself included), in order."""
    return [m for m in module.modules() if isinstance(m, ContinuousFlow)]


def function_evaluations(module: nn.Module) -> int:
    """Vector-field evaluations of the last solve of every ContinuousFlow in `module`, summed (0 when none)."""
    return sum(layer.nfe for layer in continuous_layers(module))


@contextlib.contextmanager
def trajectory_integrals(
    module: nn.Module, names: Sequence[str] = ("kinetic", "jacobian")
) -> Iterator[list[dict[str, Tensor]]]:
    """Deprecated: the integrals `names` of the solves of `module`'s ContinuousFlow layers in the block (not nested).

    Use [`ContinuousFlow.forward_with_integrals`][flowkit.bijectors.ContinuousFlow.forward_with_integrals],
    or a flow's `path_log_likelihood_with_integrals`, which return them.
    """
    message = "trajectory_integrals is deprecated; ContinuousFlow.forward_with_integrals returns the integrals"
    warnings.warn(message, DeprecationWarning, stacklevel=3)
    _check_integrals(names)
    records: list[dict[str, Tensor]] = []
    layers, names = continuous_layers(module), tuple(names)
    for layer in layers:  # within the block, each layer's solves record their integrals
        layer.forward, layer.inverse = (functools.partial(_recorded, layer, r, names, records) for r in (False, True))
    try:
        yield records
    finally:
        for layer in layers:
            del layer.forward, layer.inverse


def _recorded(layer: ContinuousFlow, reverse: bool, names: tuple, records: list, x: Tensor, context: Any = None) -> Any:
    z, ladj, integrals = layer._solve(x, context, reverse, names)
    records.extend([integrals] if names else [])
    return z, ladj


def _check_integrals(names: Sequence[str]) -> None:
    unknown = [n for n in names if n not in INTEGRALS]
    if unknown:
        raise ValueError(f"ContinuousFlow: unknown integrals {unknown}; choose from {list(INTEGRALS)}")


class _Dynamics(nn.Module):
    r"""The augmented right-hand side in normalised time $s = t / T \in [0, 1]$, for one solve."""

    def __init__(self, flow: ContinuousFlow, context: Tensor | None, probe: Tensor | None, integrals: tuple) -> None:
        super().__init__()
        self.owner = [flow]  # a list: not a submodule (the adjoint gets its parameters explicitly)
        self.context, self.probe, self.integrals = context, probe, integrals
        self.evaluations = 0
        # The end time T scales the right-hand side; a fixed T = 1 (the default) needs no product.
        self.end = flow.t1
        self.scaled = bool(flow.t1.requires_grad) or float(flow.t1) != 1.0

    def forward(self, s: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        flow = self.owner[0]
        x = state[0]
        graph = torch.is_grad_enabled()
        self.evaluations += 1
        end = self.end
        if not flow._field_checked:
            flow._field(x, self.context, end * s)
        if self.probe is None and flow._forward_jacobian:
            squares = None
            if "jacobian" in self.integrals:
                velocity, jacobian = flow._field_and_jacobian(x, self.context, end * s, full=True)
                trace = torch.diagonal(jacobian, dim1=-2, dim2=-1).sum(-1)
                squares = jacobian.square().sum((-2, -1))
            else:
                velocity, trace = flow._field_and_jacobian(x, self.context, end * s, full=False)
        elif self.probe is not None and flow._forward_jacobian:
            velocity, jvp = flow.vector_field.velocity_and_jvp(x, self.probe, self.context, t=end * s)
            trace = (jvp * self.probe).sum(-1)
            squares = jvp.square().sum(-1)
        else:
            with torch.enable_grad():
                if not graph or not x.requires_grad:
                    # A fresh leaf: without a graph, the solver's state is a view of its flat state made
                    # under no_grad, through which autograd would not reach the field's input.
                    x = x.detach().clone().requires_grad_(True)
                velocity = flow._field(x, self.context, end * s)
                if self.probe is None:
                    trace, rows = _exact_trace(velocity, x, graph)
                    squares = rows.square().sum((0, -1))
                else:
                    vjp = torch.autograd.grad(velocity, x, self.probe, create_graph=graph)[0]
                    trace = (vjp * self.probe).sum(-1)
                    squares = vjp.square().sum(-1)
        out = [velocity, trace]
        for name in self.integrals:
            if name == "kinetic":
                out.append(velocity.square().sum(-1))
            elif name == "jacobian":
                out.append(squares)
            else:
                out.append(flow.vector_field.hjb_residual(x, self.context, t=end * s).abs())
        if self.scaled:
            out = [end * o for o in out]
        if not graph:
            out = [o.detach() for o in out]
        return tuple(out)


def _exact_trace(velocity: Tensor, x: Tensor, graph: bool) -> tuple[Tensor, Tensor]:
    """The divergence of `velocity` `(N, D)` in `x` from D batched VJPs, and the Jacobian rows `(D, N, D)`."""
    d = x.shape[-1]
    basis = torch.eye(d, dtype=x.dtype, device=x.device).unsqueeze(1).expand(d, *x.shape)
    try:
        if d <= _LOOP_BELOW:
            raise RuntimeError("a few rows: a loop is faster than vmap")
        rows = torch.autograd.grad(velocity, x, basis, create_graph=graph, is_grads_batched=True)[0]
    except RuntimeError:  # few rows, or a field vmap cannot batch over: one VJP per row
        rows = torch.stack(
            [torch.autograd.grad(velocity, x, basis[i], create_graph=graph, retain_graph=True)[0] for i in range(d)]
        )
    trace = torch.diagonal(rows, dim1=0, dim2=-1).sum(-1)
    return trace, rows


class ContinuousFlow(Bijector):
    r"""Continuous normalizing flow: the time-$T$ map of $\dot x = f(x, t, c)$ (FFJORD).

    `forward` maps data $x = x(0)$ to latent $z = x(T)$ and returns
    $\log|\det \partial z / \partial x| = \int_0^T \operatorname{tr} \partial_x f(x(t), t, c)\, dt$,
    solving the augmented ODE in normalised time $s = t/T \in [0, 1]$,

    $$
    \frac{d}{ds}\begin{pmatrix} x \\ \ell \end{pmatrix}
      = T \begin{pmatrix} f(x, sT, c) \\ \operatorname{tr} \partial_x f(x, sT, c) \end{pmatrix},
    $$

    so that the end time $T$ is an ordinary parameter (TO-FLOW learns it).
    `inverse` integrates the same system from $s = 1$ back to $0$.

    The trace is exact (from the Jacobian a [`VectorField`][flowkit.nn.VectorField] with a smooth activation
    propagates forward, else from `D` vector-Jacobian products; right for small `D`) or Hutchinson's unbiased
    estimate $\epsilon^\top \partial_x f\, \epsilon$ with one probe $\epsilon$ (Rademacher or Gaussian,
    $E[\epsilon\epsilon^\top] = I$) drawn per solve and held fixed along it (Grathwohl et al. 2019). With
    $S = (J + J^\top)/2$, the Gaussian probe's variance is $2\|S\|_F^2$ and the Rademacher probe's
    $2(\|S\|_F^2 - \sum_i J_{ii}^2)$, never larger (Hutchinson 1990).

    **Tolerances.** The solve is adaptive (`dopri5` by default) with local error control `atol + rtol |y|` on
    the state and the log-determinant; the round trip and log-determinant are accurate to about that times the
    number of steps. Tolerances below the machine epsilon of the input's dtype are raised to it. A fixed-step
    solver (`euler`, `rk4`, ...) takes `solver_options={"step_size": h}` and ignores the tolerances.

    **Solver.** `dopri5` without the adjoint runs flowkit's own [`dopri5`][flowkit.bijectors.ode.dopri5] (the
    error norm, step-size rule and first step of `torchdiffeq`'s, without its overheads; the last step ends on
    the end time); the other solvers, the adjoint and other `solver_options` than `first_step` run
    `torchdiffeq`. While training (the module in training mode, gradients on), a solve after an update of the
    parameters (an optimiser's step) starts with the step size that the previous solve in the same direction
    proposed after its first step, instead of estimating one (one evaluation, and a first step often several
    times too small); every step, the first included, is still accepted only within the tolerances. Solves
    with the same parameters take the same first step, so that the same input gives the same output.

    **Gradients.** `adjoint=False` backpropagates through the solver's operations (exact gradients of the
    discretised solve; memory grows with the steps); `adjoint=True` solves the adjoint ODE backwards (memory
    constant in the steps; gradients accurate to the tolerances; the seminorm of Kidger et al. 2021). Gradients
    reach the field's parameters, $T$, the inputs and the context.

    After each solve, `nfe` holds the number of evaluations of the field it took.

    Arguments:
        vector_field: the field, a module called as `vector_field(x, context, t=t)` with `x` of shape
            `(N, *event_shape)` returning the same shape (e.g. [`VectorField`][flowkit.nn.VectorField]).
        event_shape: the event shape (an int for vectors).
        t1: the end time $T > 0$.
        trace: `"exact"` or `"hutchinson"`.
        probe: Hutchinson's probe, `"rademacher"` or `"gaussian"`.
        solver: a `torchdiffeq` method name (`"dopri5"`, `"dopri8"`, `"bosh3"`, `"rk4"`, `"euler"`, ...).
        atol: absolute tolerance of the adaptive solver (positive, finite).
        rtol: relative tolerance of the adaptive solver (positive, finite).
        adjoint: gradients by the adjoint method instead of through the solver.
        solver_options: extra `options` for `torchdiffeq.odeint` (e.g. `{"step_size": 0.05}`).
        context: number of context features (default: the field's `context_features`, else 0).

    Raises:
        ValueError: for a non-finite or non-positive `t1`, `atol`, `rtol` or step size in `solver_options`,
            an unknown `trace`, `probe` or `solver`, a `vector_field` that is not a module or whose
            `in_features` is not the event size, and (at the first call) a field that fails on the points
            or whose output shape is not its input's; when loading weights, a non-positive `t1`.
        flowkit.root_finding.ConvergenceError: (a `RuntimeError`) when the adaptive solver's step
            underflows (a field too stiff or too fast for the tolerances).

    Examples:
        >>> import torch
        >>> from flowkit.nn import VectorField
        >>> flow = ContinuousFlow(VectorField(2, hidden=(16,)), 2, atol=1e-6, rtol=1e-6)
        >>> z, ladj = flow(torch.randn(4, 2))
        >>> x, ladj_inverse = flow.inverse(z)
        >>> z.shape, ladj.shape
        (torch.Size([4, 2]), torch.Size([4]))

    References:
        Chen, Rubanova, Bettencourt & Duvenaud, *Neural ordinary differential equations*,
        NeurIPS 2018 (arXiv:1806.07366). Grathwohl, Chen, Bettencourt, Sutskever & Duvenaud,
        *FFJORD*, ICLR 2019 (arXiv:1810.01367). Kidger, Chen & Lyons, *"Hey, that's not an ODE":
        faster ODE adjoints via seminorms*, ICML 2021.
    """

    def __init__(
        self,
        vector_field: nn.Module,
        event_shape: int | Sequence[int],
        t1: float = 1.0,
        *,
        trace: str = "exact",
        probe: str = "rademacher",
        solver: str = "dopri5",
        atol: float = 1e-5,
        rtol: float = 1e-5,
        adjoint: bool = False,
        solver_options: dict[str, Any] | None = None,
        context: int | None = None,
    ) -> None:
        super().__init__()
        where = "ContinuousFlow"
        if not isinstance(vector_field, nn.Module):
            raise ValueError(
                f"{where}: vector_field must be an nn.Module called as vector_field(x, context, t=t), "
                f"got {type(vector_field).__name__}"
            )
        t1 = check_number(t1, "t1", where=where, positive=True)
        atol = check_number(atol, "atol", where=where, positive=True)
        rtol = check_number(rtol, "rtol", where=where, positive=True)
        if trace not in TRACES:
            raise ValueError(f"{where}: trace must be one of {list(TRACES)}, got {trace!r}")
        if probe not in PROBES:
            raise ValueError(f"{where}: probe must be one of {list(PROBES)}, got {probe!r}")
        if solver not in SOLVERS:
            raise ValueError(f"{where}: unknown solver {solver!r}; choose one of {sorted(SOLVERS)}")
        if solver_options is not None and not isinstance(solver_options, dict):
            raise ValueError(f"{where}: solver_options must be a dict, got {type(solver_options).__name__}")
        solver_options = dict(solver_options or {})
        for name in _STEP_OPTIONS:
            if name in solver_options:
                solver_options[name] = check_number(
                    solver_options[name], f"solver_options[{name!r}]", where=where, positive=True
                )
        self.vector_field = vector_field
        self.event_shape = as_shape(event_shape)
        if any(n < 1 for n in self.event_shape):
            raise ValueError(f"{where}: event_shape must have positive sizes, got {tuple(self.event_shape)}")
        width = getattr(vector_field, "in_features", None)
        if len(self.event_shape) == 1 and isinstance(width, int) and width != self.event_shape[0]:
            raise ValueError(
                f"{where}: the vector field takes {width} features but the event has {self.event_shape[0]}"
            )
        kink = getattr(vector_field, "activation_name", None)
        if kink in NON_SMOOTH_ACTIVATIONS and solver in _ADAPTIVE:
            warnings.warn(
                f"{where}: the vector field's activation {kink!r} has a kink; the adaptive solver {solver!r} "
                "assumes a smooth field and may take many times more steps (use softplus, silu, tanh or elu)",
                stacklevel=2,
            )
        declared = getattr(vector_field, "context_features", 0)
        self.context_features = int(declared if context is None else context)
        if context is not None and declared and declared != context:
            raise ValueError(f"{where}: context={context} but the vector field has context_features={declared}")
        # The end time: a parameter that the fit loop's optimiser leaves alone (requires_grad False)
        # unless a caller such as flowkit.train.continuous.LearnEndTime turns it on.
        self.t1 = nn.Parameter(torch.tensor(t1, dtype=torch.get_default_dtype()), requires_grad=False)
        self.trace, self.probe, self.solver = trace, probe, solver
        self.atol, self.rtol, self.adjoint = atol, rtol, bool(adjoint)
        self.solver_options = solver_options
        self.nfe = 0
        self._field_checked = False
        # Per direction: the first step proposed, the parameters' versions, and the first step taken at them.
        self._first_steps: dict[bool, tuple[float, tuple[int, ...], float | None]] = {}

    @property
    def features(self) -> int:
        return math.prod(self.event_shape)

    @property
    def ladj_is_exact(self) -> bool:  # type: ignore[override]
        """Whether the log-determinant is exact (the exact trace), not Hutchinson's random estimate."""
        return self.trace == "exact"

    def _field(self, x: Tensor, context: Tensor | None, t: Tensor) -> Tensor:
        """The field at flat points `x` `(N, D)`, as `(N, D)`; its shape is checked at the first call."""
        points = x.reshape(x.shape[0], *self.event_shape)
        if self._field_checked:
            v = self.vector_field(points, context, t=t)
        else:
            try:
                v = self.vector_field(points, context, t=t)
            except RuntimeError as error:
                raise ValueError(
                    f"ContinuousFlow: the vector field fails on points of shape {tuple(points.shape)} "
                    f"(event shape {tuple(self.event_shape)}): {error}"
                ) from error
            if not isinstance(v, Tensor) or v.shape != (x.shape[0], *self.event_shape):
                shape = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
                raise ValueError(
                    f"ContinuousFlow: vector_field must return the shape of its input "
                    f"{(x.shape[0], *self.event_shape)}, got {shape}"
                )
            self._field_checked = True
        return v.reshape(x.shape[0], -1)

    @property
    def _forward_jacobian(self) -> bool:
        """Whether the field gives its Jacobian itself (a VectorField with a smooth activation on vectors)."""
        field = self.vector_field
        return self.event_dims == 1 and bool(getattr(field, "jacobian_available", False))

    def _field_and_jacobian(self, x: Tensor, context: Tensor | None, t: Tensor, full: bool) -> tuple[Tensor, Tensor]:
        """The field and its Jacobian `(N, D, D)` (`full`) or divergence `(N,)` at flat points `(N, D)`."""
        field = self.vector_field
        return field.velocity_and_jacobian(x, context, t=t) if full else field.velocity_and_divergence(x, context, t=t)

    def velocity(self, x: Tensor, s: Tensor, context: Tensor | None = None) -> Tensor:
        r"""$dx/ds = T f(x, sT, c)$ in normalised time $s \in [0, 1]$, for points `(N, *event_shape)` and times `(N,)`.

        What flow matching regresses ([`FlowMatching`][flowkit.train.continuous.FlowMatching]).
        """
        n = x.shape[0]
        return (self.t1 * self._field(x.reshape(n, -1), context, self.t1 * s)).view(x.shape)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        t1 = _loaded(self, state_dict, prefix, ("t1",)).get("t1")
        if t1 is not None and not float(t1) > 0:
            raise ValueError(f"ContinuousFlow: the loaded end time t1 must be positive, got {float(t1):g}")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def _native(self) -> bool:
        """Whether the solve runs [`dopri5`][flowkit.bijectors.ode.dopri5] (dopri5 through the solver's steps)."""
        return self.solver == "dopri5" and not self.adjoint and set(self.solver_options) <= {"first_step"}

    def _tolerances(self, dtype: torch.dtype) -> tuple[float, float]:
        floor = torch.finfo(dtype).eps
        return max(self.atol, floor), max(self.rtol, floor)

    def _solve(
        self, x: Tensor, context: Tensor | None, reverse: bool, integrals: tuple[str, ...] = ()
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """`(x(1) or x(0), log-determinant, {name: integral of the batch shape})` of one solve."""
        batch = x.shape[: x.dim() - self.event_dims]
        n = math.prod(batch)
        flat = x.reshape(n, self.features)
        if n == 0:  # nothing to solve
            return x, flat.new_zeros(batch), {name: flat.new_zeros(batch) for name in integrals}
        if context is not None:
            context = context.expand(*batch, context.shape[-1]).reshape(n, context.shape[-1])
        probe = None
        if self.trace == "hutchinson":
            if self.probe == "rademacher":
                probe = torch.randint(0, 2, flat.shape, device=flat.device).to(flat.dtype) * 2 - 1
            else:
                probe = torch.randn_like(flat)
        if "hjb" in integrals and not callable(getattr(self.vector_field, "hjb_residual", None)):
            raise ValueError(
                "ContinuousFlow: the 'hjb' integral needs a potential field with hjb_residual "
                f"(flowkit.nn.PotentialField), got {type(self.vector_field).__name__}"
            )
        dynamics = _Dynamics(self, context, probe, integrals)
        zeros = flat.new_zeros(n)
        state = (flat, zeros, *(zeros for _ in integrals))
        times = torch.tensor([1.0, 0.0] if reverse else [0.0, 1.0], dtype=flat.dtype, device=flat.device)
        atol, rtol = self._tolerances(flat.dtype)
        options = dict(method=self.solver, atol=atol, rtol=rtol, options=dict(self.solver_options) or None)
        try:
            if self._native:
                start, end = (1.0, 0.0) if reverse else (0.0, 1.0)
                first = self.solver_options.get("first_step")
                learning = self.training and torch.is_grad_enabled() and first is None
                versions = tuple(p._version for p in self.parameters()) if learning else ()
                record = self._first_steps.get(reverse) if learning else None
                if record is not None:  # the same parameters: the same first step; updated ones: the proposal
                    first = record[2] if record[1] == versions else record[0]
                native = dopri5(dynamics, state, start, end, atol=atol, rtol=rtol, first_step=first)
                if learning and native.next_first_step is not None and (record is None or record[1] != versions):
                    self._first_steps[reverse] = (native.next_first_step, versions, first)
                solution = [part.unsqueeze(0) for part in native.state]
            elif self.adjoint:
                params = tuple(p for p in self.parameters() if p.requires_grad)
                if context is not None and context.requires_grad:
                    params = (*params, context)
                solution = torchdiffeq.odeint_adjoint(
                    dynamics, state, times, adjoint_params=params, adjoint_options=dict(norm="seminorm"), **options
                )
            else:
                solution = torchdiffeq.odeint(dynamics, state, times, **options)
        except (AssertionError, ConvergenceError) as error:  # "underflow in dt": the step fell below what resolves t
            raise ConvergenceError(
                f"ContinuousFlow: the adaptive solver {self.solver!r} did not converge ({error}) after "
                f"{dynamics.evaluations} field evaluations at t1={float(self.t1):g}, atol={atol:g}, rtol={rtol:g}: "
                "the field is too stiff or too fast for these tolerances"
            ) from error
        self.nfe = dynamics.evaluations
        final = [part[-1] for part in solution]
        values = {name: final[2 + i].reshape(batch) for i, name in enumerate(integrals)}
        return final[0].reshape(*batch, *self.event_shape), final[1].reshape(batch), values

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._solve(x, context, reverse=False)[:2]

    def forward_with_integrals(
        self, x: Tensor, context: Tensor | None = None, *, names: Sequence[str] = ()
    ) -> tuple[Tensor, Tensor, list[dict[str, Tensor]]]:
        r"""`forward`, and per point the integrals `names` along the trajectory, as extra states of the same solve.

        - `"kinetic"`: $\int_0^T \|f(x(t), t)\|^2 \, dt$,
        - `"jacobian"`: $\int_0^T \|\partial f / \partial x\|_F^2 \, dt$ (exact with the
          exact trace; with Hutchinson's trace, $\|(\partial f / \partial x)\, \epsilon\|^2$ (a
          [`VectorField`][flowkit.nn.VectorField]'s forward JVP) or $\|\epsilon^\top \partial f / \partial x\|^2$
          (a VJP otherwise) with the solve's probe, both unbiased since $E[\epsilon \epsilon^\top] = I$),
        - `"hjb"`: $\int_0^T |\partial_t \Phi - \tfrac12 \|\nabla_x \Phi\|^2| \, dt$ for a potential field
          $f = -\nabla_x \Phi$ ([`PotentialField`][flowkit.nn.PotentialField]; Onken et al. 2021).

        Returns `(z, log|det dz/dx|, [{name: tensor of the batch shape}])`, the list empty without `names`
        (Finlay et al. 2020). Raises a ValueError for an unknown name, and `"hjb"` without a potential field.
        """
        _check_integrals(names)
        z, ladj, integrals = self._solve(x, context, False, tuple(names))
        return z, ladj, [integrals] if names else []

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self._solve(z, context, reverse=True)[:2]

    def extra_repr(self) -> str:
        return (
            f"event_shape={tuple(self.event_shape)}, t1={float(self.t1):.4g}, trace={self.trace!r}, "
            f"solver={self.solver!r}, atol={self.atol:g}, rtol={self.rtol:g}, adjoint={self.adjoint}"
        )
