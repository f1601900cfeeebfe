r"""An adaptive Dormand–Prince 5(4) solver for a tuple of tensors, lean enough for a training step.

[`dopri5`][flowkit.bijectors.ode.dopri5] integrates $\dot y = f(t, y)$ for a state $y$ that is a tuple of
tensors (a continuous flow's points, log-determinant and integrals) from $t_0$ to $t_1$ and returns
$y(t_1)$. It is Dormand and Prince's embedded Runge–Kutta pair of orders 5 and 4 with the first-same-as-last
property (six evaluations of $f$ a step), local extrapolation (the order-5 solution is kept) and the
step-size control of `torchdiffeq`'s `dopri5`, the same arithmetic of the error:

$$
r = \max_{c} \Bigl( \frac{1}{n_c} \sum_{i \in c}
    \Bigl( \frac{e_i}{\mathrm{atol} + \mathrm{rtol} \max(|y_i|, |y_i'|)} \Bigr)^2 \Bigr)^{1/2},
$$

the largest over the components $c$ of the tuple of the root mean square of the estimated local error $e$
scaled by the tolerance, where $y$ and $y'$ are the states before and after the step. A step is accepted when
$r \le 1$; the next step size is $h \min(10, \max(0.9\, r^{-1/5}, \cdot))$, never smaller after an accepted
step and at least $h / 5$ after a rejected one. The first step is Hairer, Nørsett & Wanner's estimate
(II.4), one extra evaluation. The last step ends on $t_1$ exactly (no interpolation).

What differs from `torchdiffeq.odeint(method="dopri5")`: only what costs time. The state stays a tuple (no
packing into one tensor and back at each evaluation), the stages are combined with a few fused additions,
no interpolating polynomial is fitted at each step, and the error estimate, its norm, the step-size rule and
the initial step run without an autograd graph. Gradients backpropagate through the accepted steps' stages:
the exact gradient of the discretised solve, as `torchdiffeq.odeint`'s.

References:
    Dormand & Prince, *A family of embedded Runge–Kutta formulae*, J. Comput. Appl. Math. 6 (1980).
    Hairer, Nørsett & Wanner, *Solving Ordinary Differential Equations I*, 2nd ed., Springer 1993, II.4.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from ..root_finding import ConvergenceError

__all__ = ["dopri5", "ODESolution"]

# Dormand–Prince 5(4): the stages' coefficients (rows of the Butcher tableau), the order-5 weights (the last
# stage's row: first same as last) and the error weights b - b* against the embedded order-4 solution.
_NODES = (1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0)
_STAGES = (
    (1 / 5,),
    (3 / 40, 9 / 40),
    (44 / 45, -56 / 15, 32 / 9),
    (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
    (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
    (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
)
_ERROR = (71 / 57600, 0.0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40)
_SAFETY, _GROWTH, _SHRINK, _EXPONENT = 0.9, 10.0, 0.2, 1 / 5

State = tuple[Tensor, ...]


class ODESolution(NamedTuple):
    """The state at the end time, the counts of steps and evaluations, and a first step for a solve like this one.

    `next_first_step` is the step size the controller proposed after the first accepted step (`None` when no
    step was taken).
    """

    state: State
    accepted: int
    rejected: int
    evaluations: int
    next_first_step: float | None = None


def _combine(y: State, dt: float, weights: Sequence[float], ks: Sequence[State]) -> State:
    """`y + dt * sum_j weights[j] * ks[j]`, component by component, skipping zero weights."""
    out = []
    for c, y_c in enumerate(y):
        acc = y_c
        for w, k in zip(weights, ks, strict=False):
            if w != 0.0:
                acc = torch.add(acc, k[c], alpha=dt * w)
        out.append(acc)
    return tuple(out)


def _rms(tensor: Tensor) -> float:
    return float(tensor.square().mean().sqrt()) if tensor.numel() else 0.0


def _error_ratio(y0: State, y1: State, dt: float, ks: Sequence[State], atol: float, rtol: float) -> float:
    """The scaled local error `r` of the step (see the module's docstring), without a graph."""
    ratio = 0.0
    for c in range(len(y0)):
        if not bool(torch.isfinite(y1[c]).all()):
            return math.inf
        error = ks[0][c] * (dt * _ERROR[0])
        for w, k in zip(_ERROR[1:], ks[1:], strict=True):
            if w != 0.0:
                error.add_(k[c], alpha=dt * w)
        tolerance = torch.maximum(y0[c].abs(), y1[c].abs()).mul_(rtol).add_(atol)
        ratio = max(ratio, _rms(error.div_(tolerance)))
    return ratio


def _initial_step(
    f: Callable[[float, State], State], t0: float, y0: State, f0: State, direction: float, atol: float, rtol: float
) -> float:
    """Hairer, Nørsett & Wanner's first step (II.4), in the mixed RMS norm; one evaluation of `f`."""
    scales = [y.abs() * rtol + atol for y in y0]
    d0 = max(_rms(y / s) for y, s in zip(y0, scales, strict=True))
    d1 = max(_rms(v / s) for v, s in zip(f0, scales, strict=True))
    h0 = 1e-6 if d0 < 1e-5 or d1 < 1e-5 else 0.01 * d0 / d1
    f1 = f(t0 + direction * h0, tuple(y + direction * h0 * v for y, v in zip(y0, f0, strict=True)))
    d2 = max(_rms((b - a) / s) for a, b, s in zip(f0, f1, scales, strict=True)) / h0
    if d1 <= 1e-15 and d2 <= 1e-15:
        h1 = max(1e-6, h0 * 1e-3)
    else:
        h1 = (0.01 / max(d1, d2)) ** _EXPONENT
    return min(100 * h0, h1)


def dopri5(
    f: Callable[[float, State], State],
    y0: Sequence[Tensor],
    t0: float,
    t1: float,
    *,
    atol: float,
    rtol: float,
    first_step: float | None = None,
    max_steps: int = 100_000,
) -> ODESolution:
    r"""$y(t_1)$ for $\dot y = f(t, y)$, $y(t_0) = y_0$, by adaptive Dormand–Prince 5(4) steps.

    Arguments:
        f: the right-hand side, called as `f(t, state)` with a Python float `t` and a tuple of tensors, returning
            a tuple of tensors of the same shapes.
        y0: the initial state, a sequence of tensors.
        t0: the initial time.
        t1: the end time (before `t0` to integrate backwards).
        atol: the absolute tolerance of the local error (positive).
        rtol: the relative tolerance of the local error (positive).
        first_step: the first step's size (default: Hairer's estimate, one evaluation of `f`).
        max_steps: the most steps, accepted or rejected.

    Returns:
        An [`ODESolution`][flowkit.bijectors.ode.ODESolution]: the state at `t1` and the counts of steps and
        evaluations.

    Raises:
        ValueError: for a non-positive tolerance or first step.
        flowkit.root_finding.ConvergenceError: when the step size underflows (the time no longer moves) or
            `max_steps` steps do not reach `t1`.

    Examples:
        >>> import torch
        >>> y0 = (torch.ones(3, dtype=torch.float64),)
        >>> solution = dopri5(lambda t, y: (-y[0],), y0, 0.0, 1.0, atol=1e-10, rtol=1e-10)
        >>> bool(torch.allclose(solution.state[0], torch.full((3,), torch.e**-1, dtype=torch.float64)))
        True
    """
    if not (atol > 0 and rtol > 0):
        raise ValueError(f"dopri5: atol and rtol must be positive, got atol={atol}, rtol={rtol}")
    if first_step is not None and not first_step > 0:
        raise ValueError(f"dopri5: first_step must be positive, got {first_step}")
    t0, t1 = float(t0), float(t1)
    y = tuple(y0)
    if t0 == t1:
        return ODESolution(y, 0, 0, 0, None)
    direction = 1.0 if t1 > t0 else -1.0
    k1 = f(t0, y)
    evaluations = 1
    if first_step is None:
        with torch.no_grad():
            h = _initial_step(f, t0, y, k1, direction, atol, rtol)
        evaluations += 1
    else:
        h = float(first_step)
    t, accepted, rejected = t0, 0, 0
    proposal = None
    while direction * (t1 - t) > 0:
        if accepted + rejected >= max_steps:
            raise ConvergenceError(f"dopri5: {max_steps} steps did not reach t1={t1:g} from t0={t0:g} (at t={t:g})")
        last = h >= abs(t1 - t)
        dt = direction * (abs(t1 - t) if last else h)
        if t + dt == t or not math.isfinite(h):
            raise ConvergenceError(f"dopri5: underflow in the step size ({h:g}) at t={t:g}")
        ks = [k1]
        for node, row in zip(_NODES, _STAGES, strict=False):
            ks.append(f(t + node * dt, _combine(y, dt, row, ks)))
        y1 = _combine(y, dt, _STAGES[-1], ks)
        ks.append(f(t1 if last else t + dt, y1))
        evaluations += 6
        with torch.no_grad():
            ratio = _error_ratio(y, y1, dt, ks, atol, rtol)
        if ratio <= 1.0:  # accepted (a NaN ratio is not)
            t, y, k1 = (t1 if last else t + dt), y1, ks[-1]
            accepted += 1
            factor = _GROWTH if ratio == 0.0 else min(_GROWTH, max(_SAFETY * ratio**-_EXPONENT, 1.0))
        else:
            rejected += 1
            factor = _SHRINK if not math.isfinite(ratio) else min(_GROWTH, max(_SAFETY * ratio**-_EXPONENT, _SHRINK))
        h = abs(dt) * factor
        if proposal is None and accepted:
            proposal = h
    return ODESolution(y, accepted, rejected, evaluations, proposal)
