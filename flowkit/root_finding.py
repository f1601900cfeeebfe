r"""Root finders for monotone maps without closed-form inverses, with implicit gradients.

Two solvers and the step that gives both their derivatives:

- [`solve_monotone`][flowkit.root_finding.solve_monotone]: a fixed-step solve on `[0, 1]` (grid bracketing, bisection,
  safeguarded Newton) for maps that evaluate cheaply on a grid (smooth mixtures, the sphere's convex Moebius maps);
- [`monotone_inverse`][flowkit.root_finding.monotone_inverse]: safeguarded Newton (`rtsafe`) on a given bracket, for
  elementwise activations;
- [`expand_bracket`][flowkit.root_finding.expand_bracket]: a bracket for a map of unknown range, found by doubling a
  starting interval's width;
- [`implicit_newton_step`][flowkit.root_finding.implicit_newton_step]: one Newton step taken with the graph from a root
  found without one, whose derivatives are those of the implicit-function theorem,
  $\partial x / \partial \theta = -(\partial f / \partial \theta) / f'$.

Every loop runs a fixed number of steps on the whole tensor (no host synchronisation), so the solvers compile.

*Convergence.* At the end each solver checks its result (one host synchronisation; skipped while `torch.compile`
traces) and raises [`ConvergenceError`][flowkit.root_finding.ConvergenceError], naming the worst point, rather than
return a wrong answer. A root $x$ of $f(x) = y$ is accepted when its residual is within the rounding of $f$ near it,

$$
|f(x) - y| \le \tau \big(\max(1, |y|) + f'(x) \max(1, |x|)\big), \qquad \tau = 2^{10} \varepsilon
$$

(`tolerance(dtype)`: $2.3 \cdot 10^{-13}$ in float64, $1.2 \cdot 10^{-4}$ in float32), a backward-error test. The
*forward* error is then about $\tau \max(1, |y|) / f'(x)$: a flat map is ill conditioned.

References:
    Press, Teukolsky, Vetterling & Flannery, *Numerical Recipes*, 3rd ed., section 9.4 (`rtsafe`);
    Krantz & Parks, *The implicit function theorem*, Birkhaeuser 2002.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "ConvergenceError",
    "check_converged",
    "expand_bracket",
    "implicit_newton_step",
    "monotone_inverse",
    "solve_monotone",
    "tolerance",
]

#: The backward-error tolerance of the solvers, in units of the dtype's machine epsilon.
_TOLERANCE_EPS = 2.0**10


class ConvergenceError(RuntimeError):
    """A numerical inverse did not converge: its bracket did not hold the root, or it ran out of steps."""


def tolerance(dtype: torch.dtype) -> float:
    r"""The solvers' relative tolerance $\tau = 2^{10} \varepsilon$ of `dtype` (see the module docstring)."""
    return _TOLERANCE_EPS * torch.finfo(dtype).eps


def _worst(excess: Tensor) -> int:
    """The flat index of the largest entry of `excess` (a NaN first)."""
    flat = excess.detach().reshape(-1)
    return int(torch.where(torch.isnan(flat), torch.full_like(flat, math.inf), flat).argmax())


def check_converged(root: Tensor, target: Tensor, residual: Tensor, slope: Tensor, where: str) -> None:
    r"""Raise [`ConvergenceError`][flowkit.root_finding.ConvergenceError] unless every root passes the residual test.

    The test is the module docstring's; a NaN residual fails it. Skipped while `torch.compile` traces.

    Arguments:
        root: the roots $x$.
        target: the targets $y$ (broadcastable to `root`).
        residual: $r = f(x) - y$.
        slope: $f'(x)$ (non-negative; broadcastable to `root`).
        where: the solver's caller, for the message (`"BlockNeuralAutoregressive.inverse"`).

    Raises:
        ConvergenceError: naming how many points failed, the worst one's target, root, residual and bound.
    """
    if torch.compiler.is_compiling() or residual.numel() == 0:
        return
    with torch.no_grad():
        x, y, r = torch.broadcast_tensors(root.detach(), target.detach(), residual.detach())
        slope = torch.broadcast_to(slope.detach(), x.shape)
        bound = tolerance(x.dtype) * (y.abs().clamp_min(1) + slope.abs() * x.abs().clamp_min(1))
        excess = r.abs() / bound
        failed = ~(excess <= 1)
        if bool(failed.any()):
            i = _worst(excess)
            index = tuple(int(k) for k in torch.unravel_index(torch.tensor(i), x.shape))
            x, y, r, b = (float(t.reshape(-1)[i]) for t in (x, y, r, bound))
            raise ConvergenceError(
                f"{where}: the numerical inverse did not converge at {int(failed.sum())} of {failed.numel()} "
                f"elements; the worst, element {index}, target y = {y:.10g}: root x = {x:.10g} has residual "
                f"f(x) - y = {r:.3g}, above the tolerance {b:.3g} (2^10 eps (max(1, |y|) + f'(x) max(1, |x|)))"
            )


def solve_monotone(
    fn: Any, target: Tensor, grid: int, bisection_steps: int, newton_steps: int, where: str = "solve_monotone"
) -> Tensor:
    r"""The root $u \in [0, 1]$ of $f(u)$ = `target` for increasing `fn`, with a fixed number of steps.

    The root must lie in `[0, 1]`. The bracket comes from counting the grid values below the target, `bisection_steps`
    halve it, and `newton_steps` safeguarded Newton steps finish (a step that leaves the bracket becomes its midpoint).
    Runs without gradients; the root is then checked ([`check_converged`][flowkit.root_finding.check_converged]).

    Arguments:
        fn: `fn(u, cells, slope)` returns `(f(u), f'(u))` (`f'` only when `slope`, else None) for `u` of
            the shape of `target` with (`cells` > 0) or without (`cells` = 0) a trailing grid dimension.
        target: the values to invert.
        grid: number of bracketing cells `M` (the bracket starts `1/M` wide).
        bisection_steps: number of halvings.
        newton_steps: number of Newton steps.
        where: the caller, named in the error.

    Returns:
        The roots, with the shape of `target`.

    Raises:
        ConvergenceError: where a root fails the residual test (a target outside `[f(0), f(1)]`, too few steps).
    """
    with torch.no_grad():
        if grid > 1:
            nodes = torch.arange(1, grid, dtype=target.dtype, device=target.device) / grid
            values, _ = fn(nodes.expand(*target.shape, grid - 1), grid - 1, False)
            k = (values <= target.unsqueeze(-1)).sum(-1).to(target.dtype)
            lo, hi = k / grid, (k + 1) / grid
        else:
            lo, hi = torch.zeros_like(target), torch.ones_like(target)
        for _ in range(bisection_steps):
            mid = 0.5 * (lo + hi)
            below = fn(mid, 0, False)[0] <= target
            lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
        u = 0.5 * (lo + hi)
        for _ in range(newton_steps):
            value, slope = fn(u, 0, True)
            below = value <= target
            lo, hi = torch.where(below, u, lo), torch.where(below, hi, u)
            step = u - (value - target) / slope
            # A root at an end of the bracket (a grid node or bisection point hit exactly) draws Newton
            # steps just outside it: within a bracket's width they are clamped onto the bracket, not
            # replaced by its midpoint (which would halve the error per step instead of squaring it).
            width = hi - lo
            near = (step >= lo - width) & (step <= hi + width)
            u = torch.where(near, torch.minimum(torch.maximum(step, lo), hi), 0.5 * (lo + hi))
        value, slope = fn(u, 0, True)
        check_converged(u, target, value - target, slope, where)
        return u


def implicit_newton_step(root: Tensor, residual: Tensor, slope: Tensor, low: Tensor, high: Tensor) -> Tensor:
    r"""One Newton step from a root found without gradients, carrying the graph: the implicit derivatives.

    With `residual` $= f(x^*) - y$ and `slope` $= f'(x^*)$ evaluated *with* their graph at the detached root $x^*$, the
    result $x^* - r / f'$ has value $\approx x^*$ and the derivatives
    $\partial x / \partial \theta = -(\partial f / \partial \theta) / f'$ of the implicit-function rule. Where the step
    would leave the bracket `[low, high]` (a solve cut short) or $f'$ is not positive, the value stays `root` and only
    the graph of the step is kept; both branches stay finite, so neither poisons the other's gradient.

    Arguments:
        root: the root $x^*$, without a graph.
        residual: $f(x^*) - y$, with its graph.
        slope: $f'(x^*)$, with its graph.
        low: lower ends of the brackets.
        high: upper ends of the brackets.
    """
    usable = slope > 0
    step = residual / torch.where(usable, slope, torch.ones_like(slope))
    newton = root - step
    inside = usable & (newton >= low) & (newton <= high)
    return torch.where(inside, newton, root - (step - step.detach()))


def monotone_inverse(
    f: Callable[[Tensor], Tensor],
    df: Callable[[Tensor], Tensor],
    y: Tensor,
    low: Tensor,
    high: Tensor,
    iterations: int,
    start: Tensor | None = None,
    *,
    where: str = "monotone_inverse",
    check: bool = True,
) -> Tensor:
    """Solve `f(x) = y` elementwise for a strictly increasing `f` with `low < x < high`.

    Safeguarded Newton (Numerical Recipes' `rtsafe`): each step keeps a bracket `[low, high]` around the
    root, takes the Newton step when it lands inside and shrinks at least twice as fast as bisection, and
    bisects otherwise: at least one bit per two steps, quadratic near the root. The solve runs without
    autograd; one final [`implicit_newton_step`][flowkit.root_finding.implicit_newton_step] with it gives
    the implicit derivatives `dx/dy = 1 / f'(x)` (and those of `f`'s parameters). The root is then checked
    ([`check_converged`][flowkit.root_finding.check_converged]).

    Arguments:
        f: the increasing map, elementwise.
        df: its derivative `f'` (positive).
        y: targets.
        low: lower bounds of the roots (broadcastable to `y`).
        high: upper bounds of the roots.
        iterations: number of safeguarded Newton steps.
        start: first guess (default: the middle of the bracket).
        where: the caller, named in the error.
        check: check the roots (turn off only to inspect an unfinished solve).

    Returns:
        `x` with `f(x) = y` to the precision of the dtype after enough steps.

    Raises:
        ConvergenceError: where a root fails the residual test (the bracket did not hold it, too few steps).
    """
    with torch.no_grad():
        yd = y.detach()
        low = torch.broadcast_to(low.detach(), y.shape).clone()
        high = torch.broadcast_to(high.detach(), y.shape).clone()
        x = 0.5 * (low + high) if start is None else torch.broadcast_to(start.detach(), y.shape).clone()
        dx_old = dx = high - low
        for _ in range(iterations):
            r = f(x) - yd
            above = r > 0
            high = torch.where(above, x, high)
            low = torch.where(above, low, x)
            newton = r / df(x)
            # Newton only when it stays in the bracket and shrinks faster than bisection would.
            use_newton = (x - newton > low) & (x - newton < high) & (2 * newton.abs() < dx_old.abs())
            dx_old, dx = dx, torch.where(use_newton, newton, x - 0.5 * (low + high))
            x = x - dx
    residual, slope = f(x) - y, df(x)
    if check:
        check_converged(x, y, residual, slope, where)
    return implicit_newton_step(x, residual, slope, low, high)


def expand_bracket(
    f: Callable[[Tensor], Tensor], y: Tensor, low: Tensor, high: Tensor, steps: int, where: str = "expand_bracket"
) -> tuple[Tensor, Tensor]:
    r"""A bracket `[low, high]` with `f(low) <= y <= f(high)` for an increasing `f`, by doubling its width.

    Where `f(low) > y` the interval becomes $[\ell - 2w, \ell]$ (alike above, $[h, h + 2w]$): the width
    doubles per step, and a root at distance $r$ is bracketed after about $\log_2(r / w_0)$ steps. Runs
    without gradients; the bracket is then checked.

    Arguments:
        f: the increasing map, elementwise.
        y: targets.
        low: lower ends of the starting intervals (broadcastable to `y`).
        high: upper ends (greater than `low`).
        steps: number of doubling steps.
        where: the caller, named in the error.

    Returns:
        `(low, high)`, of the shape of `y`.

    Raises:
        ConvergenceError: where `steps` doublings found no bracket (a target beyond the map's range, or
            beyond $2^{\text{steps}+1} w_0$ from the start), naming the element.
    """
    with torch.no_grad():
        yd = y.detach()
        low = torch.broadcast_to(low.detach(), y.shape).clone()
        high = torch.broadcast_to(high.detach(), y.shape).clone()
        for _ in range(steps):
            width = high - low
            too_high, too_low = f(low) > yd, f(high) < yd
            low, high = (
                torch.where(too_high, low - 2 * width, torch.where(too_low, high, low)),
                torch.where(too_low, high + 2 * width, torch.where(too_high, low, high)),
            )
        if not torch.compiler.is_compiling() and yd.numel():
            f_low, f_high = f(low), f(high)
            failed = ~((f_low <= yd) & (yd <= f_high))
            if bool(failed.any()):
                i = int(failed.reshape(-1).to(torch.uint8).argmax())
                index = tuple(int(k) for k in torch.unravel_index(torch.tensor(i), yd.shape))
                lo, hi, fl, fh, target = (float(t.reshape(-1)[i]) for t in (low, high, f_low, f_high, yd))
                raise ConvergenceError(
                    f"{where}: no bracket of the root at {int(failed.sum())} of {failed.numel()} elements after "
                    f"{steps} doublings; element {index}, target y = {target:.10g}: the last interval "
                    f"[{lo:.6g}, {hi:.6g}] maps to [{fl:.6g}, {fh:.6g}] (the map may not reach y)"
                )
    return low, high
