"""Public correctness checks for bijectors and flows.

[`check_bijector`][flowkit.testing.check_bijector] verifies, in float64, a bijector's inverse, log-determinant
(against the autograd Jacobian, in tangent space on manifolds) and gradients, layer by layer in a chain;
[`check_flow`][flowkit.testing.check_flow] adds sampling checks and the total mass of the density. The test
suite runs `check_bijector` over one table of cases, at least one per public bijector, in `tests/cases.py`.

Examples:
    >>> import flowkit
    >>> report = flowkit.testing.check_bijector(flowkit.bijectors.LULinear(3))
    >>> report.passed
    True
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from ._validation import outermost
from .bijectors import Bijector, Chain, Invert
from .domains import Circle, Domain, Interval
from .flows import Flow

__all__ = ["CheckReport", "check_bijector", "check_flow", "randomize"]


@dataclass
class CheckReport:
    """Outcome of [`check_bijector`][flowkit.testing.check_bijector] or [`check_flow`][flowkit.testing.check_flow].

    One line per check. For a [`Chain`][flowkit.bijectors.Chain], a line covers every layer
    (and the whole chain where that comparison is meaningful) and its detail names the
    failing layers; `layers` then holds one report per layer, and printing the report lists
    what each failing layer fails.

    Attributes:
        name: what was checked (the class name).
        results: `(check, passed, detail)`, one per check.
        layers: for a chain, one report per layer in forward order, named by index and class
            (`layer 17 (LULinear)`, `layer 3.1 (Coupling)` inside a nested chain,
            `layer 2 (Invert(LULinear))` inside an inverted chain); empty otherwise.
    """

    name: str
    results: list[tuple[str, bool, str]] = field(default_factory=list)
    layers: list[CheckReport] = field(default_factory=list)

    def add(self, check: str, passed: bool, detail: str = "") -> None:
        self.results.append((check, bool(passed), detail))

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _ in self.results)

    @property
    def failures(self) -> list[str]:
        return [f"{check}: {detail}" for check, ok, detail in self.results if not ok]

    def __str__(self) -> str:
        lines = [f"{self.name}: {'PASS' if self.passed else 'FAIL'}"]
        lines += [_line(check, ok, detail, "  ") for check, ok, detail in self.results]
        for layer in self.layers:
            if not layer.passed:
                lines.append(f"  {layer.name}: FAIL")
                lines += [_line(check, ok, detail, "    ") for check, ok, detail in layer.results if not ok]
        return "\n".join(lines)


def _line(check: str, ok: bool, detail: str, indent: str) -> str:
    return f"{indent}[{'ok' if ok else 'FAIL'}] {check}" + (f" ({detail})" if detail else "")


def randomize(module: torch.nn.Module, scale: float = 0.3, seed: int = 0) -> torch.nn.Module:
    """Perturb every parameter by Gaussian noise, so that a freshly built layer is not the identity."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator).to(p))
    return module


_ROUND_TRIP = "round trip inverse(forward(x)) = x"
_INVERSE_LADJ = "inverse ladj = -forward ladj"
_CALL = "call(x) = forward(x)[0]"
_INVERSE_CALL = "inverse_call(z) = inverse(z)[0]"
_JACOBIAN = "ladj = log|det| of the autograd Jacobian"
_BATCH = "batch independence"
#: The pointwise checks, run on a bijector, or on every layer of a chain and on the chain as a whole.
_POINTWISE = (_ROUND_TRIP, _INVERSE_LADJ, _CALL, _INVERSE_CALL, _JACOBIAN, _BATCH)
_COMPOSITION = "chain = its layers in turn (z, and ladj = sum of the layers' ladjs)"


@dataclass
class _Layer:
    """A leaf of a (nested) chain in forward order, with the domains on either side."""

    name: str
    bijector: Bijector
    domain: Domain
    codomain: Domain


def _plain(b: Bijector, cls: type) -> bool:
    """Whether `b` is a `cls` whose maps are `cls`'s own, so that its layers are what it applies."""
    methods = ("forward", "inverse", "call", "inverse_call")
    return isinstance(b, cls) and all(getattr(type(b), m) is getattr(cls, m) for m in methods)


def _layers(b: Bijector, path: tuple[int, ...] = (), inverted: bool = False) -> list[tuple[tuple[int, ...], _Layer]]:
    """The leaves of `b` through nested chains and inverted chains, in the order `b.forward` applies them."""
    if _plain(b, Invert):
        return _layers(b.bijector, path, not inverted)
    if _plain(b, Chain):
        order = reversed(range(len(b))) if inverted else range(len(b))
        return [leaf for i in order for leaf in _layers(b[i], (*path, i), inverted)]
    label = type(b).__name__
    name = f"layer {'.'.join(map(str, path))} ({f'Invert({label})' if inverted else label})"
    domain, codomain = b.domain, getattr(b, "codomain", b.domain)
    if inverted:
        return [(path, _Layer(name, Invert(b), codomain, domain))]
    return [(path, _Layer(name, b, domain, codomain))]


def _scale(x: Tensor) -> float:
    """`max(1, max|x|)`: errors of values are divided by it (a mixed absolute and relative tolerance)."""
    return max(1.0, x.detach().abs().max().item()) if x.numel() else 1.0


def _jacobians(layer: _Layer, x: Tensor, context: Tensor | None) -> list[Tensor]:
    """Autograd Jacobian of `forward` at each point of a flat batch, in tangent space on manifolds.

    Each point is repeated once per output element in one batch, and one backward pass
    takes row `k` of its Jacobian from copy `k`: exact for a batch-independent bijector
    (which the batch independence check tests), and much faster than a pass per row.
    """
    b = layer.bijector
    n, d_in, d_out = x.shape[0], math.prod(b.event_shape), math.prod(b.latent_shape)
    copies = x.unsqueeze(1).expand(n, d_out, *b.event_shape).reshape(n * d_out, *b.event_shape)
    copies = copies.detach().requires_grad_(True)
    ctx = None if context is None else context.repeat_interleave(d_out, dim=0)
    with torch.enable_grad():
        z = b(copies, ctx)[0].reshape(n, d_out, d_out)
        eye = torch.eye(d_out, dtype=z.dtype).expand(n, d_out, d_out)
        grad = torch.autograd.grad(z, copies, eye, allow_unused=True)[0] if z.requires_grad else None
    jac = torch.zeros(n, d_out, d_in, dtype=x.dtype) if grad is None else grad.reshape(n, d_out, d_in)
    if layer.domain.is_manifold or layer.codomain.is_manifold:
        e_in = layer.domain.tangent_basis(x.reshape(n, d_in))
        e_out = layer.codomain.tangent_basis(z[:, 0].detach())
        jac = e_out.transpose(-1, -2) @ jac @ e_in
    return list(jac.detach())


@dataclass
class _Pointwise:
    """The pointwise checks of one bijector at one batch: outputs, Jacobians, and `(error, tolerance)` per check.

    Errors of values are relative to `max(1, max|x|)`, errors of log-determinants absolute.
    """

    z: Tensor
    ladj: Tensor
    jacobians: list[Tensor] | None = None
    errors: dict[str, tuple[float, float]] = field(default_factory=dict)

    def report(self, name: str) -> CheckReport:
        report = CheckReport(name)
        for check, (err, tol) in self.errors.items():
            report.add(check, err < tol, f"max error {err:.2e}")
        return report


def _pointwise(layer: _Layer, x: Tensor, context: Tensor | None, atol: float, *, jacobian: bool = True) -> _Pointwise:
    """Run the pointwise checks of one bijector on a batch `x` (context of matching batch shape, or None)."""
    b = layer.bijector
    event = len(b.event_shape)
    batch = x.shape[: x.dim() - event]
    z, ladj = b(x, context)
    out = _Pointwise(z.detach(), ladj.detach())
    x_back, ladj_inv = b.inverse(z, context)
    out.errors[_ROUND_TRIP] = ((x_back - x).abs().max().item() / _scale(x), atol)
    out.errors[_INVERSE_LADJ] = ((ladj_inv + ladj).abs().max().item(), atol)
    out.errors[_CALL] = ((b.call(x, context) - z).abs().max().item() / _scale(z), atol)
    out.errors[_INVERSE_CALL] = ((b.inverse_call(z, context) - x_back).abs().max().item() / _scale(x), atol)
    if jacobian and math.prod(b.event_shape) <= 256 and x.dim() > event:
        flat = x.reshape(-1, *b.event_shape)
        ctx = None if context is None else context.expand(*batch, context.shape[-1]).reshape(-1, context.shape[-1])
        out.jacobians = _jacobians(layer, flat, ctx)
        expected = torch.stack([torch.linalg.slogdet(j)[1] for j in out.jacobians])
        out.errors[_JACOBIAN] = ((expected - ladj.reshape(-1)).abs().max().item(), atol * 10)
    if x.dim() > event and x.shape[0] > 1:
        singles = [b(x[i : i + 1], None if context is None else context[i : i + 1]) for i in range(x.shape[0])]
        err_z = (torch.cat([s[0] for s in singles]) - z).abs().max().item() / _scale(z)
        err_l = (torch.cat([s[1] for s in singles]) - ladj).abs().max().item()
        out.errors[_BATCH] = (max(err_z, err_l), atol)
    return out


def _chain_rule(jacobians: list[list[Tensor]]) -> list[Tensor]:
    """A chain's Jacobian at each point: the product of its layers' Jacobians at the points they see."""
    out = []
    for per_point in zip(*jacobians, strict=True):
        jac = per_point[0]
        for j in per_point[1:]:
            jac = j @ jac
        out.append(jac)
    return out


def _condition_bound(jacobians: list[Tensor]) -> float:
    """`eps cond(J) D`, the expected error of `slogdet` of a Jacobian `J` of size `D`, the worst over the points."""
    worst = 0.0
    for jac in jacobians:
        if jac.numel():
            cond = torch.linalg.cond(jac).item()
            worst = max(worst, cond * jac.shape[-1] if not math.isnan(cond) else math.inf)
    return torch.finfo(torch.float64).eps * worst


def _check_chain(
    report: CheckReport, b: Bijector, leaves: list[_Layer], x: Tensor, context: Tensor | None, atol: float
) -> None:
    """The pointwise checks of a chain: every layer at the points it sees, the sum, the whole where well conditioned."""
    h, results = x, []
    with outermost():  # inside a chain, layers take their inputs unchecked, and the context if they are conditional
        for leaf in leaves:
            results.append(_pointwise(leaf, h, context if leaf.bijector.context_features else None, atol))
            report.layers.append(results[-1].report(leaf.name))
            h = results[-1].z
    whole = _pointwise(_Layer(report.name, b, b.domain, b.domain), x, context, atol, jacobian=False)
    bound, why = None, ""
    if all(r.jacobians is not None for r in results):
        jacobians = _chain_rule([r.jacobians for r in results])  # type: ignore[misc]
        bound = _condition_bound(jacobians)
        if bound <= atol:
            expected = torch.stack([torch.linalg.slogdet(j)[1] for j in jacobians])
            whole.errors[_JACOBIAN] = ((expected - whole.ladj.reshape(-1)).abs().max().item(), atol * 10)
        else:
            why = f"not compared, ill-conditioned: eps cond(J) D = {bound:.1e} > atol"
    conditioned = not why
    total = results[0].ladj
    for r in results[1:]:  # added in turn, as Chain does: the same rounding, so an exact chain agrees exactly
        total = total + r.ladj
    err = max((h - whole.z).abs().max().item() / _scale(whole.z), (total - whole.ladj).abs().max().item())
    report.add(_COMPOSITION, err < atol, f"max error {err:.2e}")
    for check in _POINTWISE:
        per_layer = [
            (leaf.name, *r.errors[check]) for leaf, r in zip(leaves, results, strict=True) if check in r.errors
        ]
        if not per_layer and check not in whole.errors:
            continue
        failing = [f"{name}: max error {err:.2e}" for name, err, tol in per_layer if not err < tol]
        ok = not failing
        if failing:
            detail = "; ".join(failing[:3]) + (f"; and {len(failing) - 3} more layers" if len(failing) > 3 else "")
        elif per_layer:
            detail = f"{len(per_layer)} layers: max error {max(err for _, err, _ in per_layer):.2e}"
        else:
            detail = ""
        if check in whole.errors:
            err, tol = whole.errors[check]
            ok = ok and (err < tol or not conditioned)
            chain = f"max error {err:.2e}" + ("" if conditioned else f", {why}")
            detail += f"{'; ' if detail else ''}whole chain: {chain}"
        elif check == _JACOBIAN and not conditioned:
            detail += f"; whole chain {why}"
        report.add(check, ok, detail)


def check_bijector(
    bijector: Bijector,
    x: Tensor | None = None,
    context: Tensor | None = None,
    *,
    atol: float = 1e-6,
    far: float = 50.0,
    raise_on_failure: bool = True,
) -> CheckReport:
    r"""Check a bijector's inverse, log-determinant and gradients in float64.

    The bijector is copied to the CPU and converted to float64; the original is not touched.

    Checks: output shapes; round trip `inverse(forward(x)) = x`; `forward`'s
    log-determinant against `log|det|` of the autograd Jacobian (tangent
    space on manifolds, skipped above 256 elements per event); inverse
    log-determinant equals minus the forward one; `call` agrees with
    `forward`; finite gradients with respect to inputs and parameters, also
    at points `far` times further out for unbounded domains (spline tails);
    batch independence (a batch gives what each point gives alone).
    Errors of values are relative to `max(1, max|x|)` and compared with `atol`,
    errors of log-determinants are absolute (`10 atol` against the Jacobian).

    A [`Chain`][flowkit.bijectors.Chain] (nested chains and
    [`Invert`][flowkit.bijectors.Invert] of a chain included) is checked layer by
    layer: each layer at the points it sees (the inputs pushed through the layers
    before it), and the chain's output and ladj against its layers applied in
    turn and the sum of their ladjs. The whole-chain comparisons are made where
    they are meaningful: `slogdet` of a Jacobian $J$ of size $D$ loses about
    $\epsilon \operatorname{cond}(J) D$ to rounding (and a round trip about as
    much), so when that bound, with $J$ the product of the layers' Jacobians,
    exceeds `atol` the report shows the whole chain's errors without counting
    them. A failing layer is named by index and class.

    Arguments:
        bijector: the bijector to check.
        x: input points of shape `(N, *event_shape)`; drawn from the
            bijector's domain when None.
        context: context of shape `(N, context_features)` for conditional
            bijectors; random when None.
        atol: absolute tolerance of the comparisons.
        far: scale of the far-out points in the gradient check.
        raise_on_failure: raise `AssertionError` listing the failures.

    Returns:
        A [`CheckReport`][flowkit.testing.CheckReport].
    """
    name = type(bijector).__name__
    if not isinstance(bijector, Bijector):
        raise ValueError(f"check_bijector: {name} is not a flowkit Bijector")
    report = CheckReport(name)
    b = copy.deepcopy(bijector).to(device="cpu", dtype=torch.float64).eval()
    generator = torch.Generator().manual_seed(0)
    if x is None:
        x = b.domain.sample((4, *b.event_shape), generator=generator)
    x = x.detach().to(device="cpu", dtype=torch.float64)
    if b.context_features and context is None:
        context = torch.randn(x.shape[0], b.context_features, generator=generator, dtype=torch.float64)
    if context is not None:
        context = context.detach().to(device="cpu", dtype=torch.float64)
    batch = x.shape[: x.dim() - len(b.event_shape)]
    z, ladj = b(x, context)
    report.add(
        "output shapes",
        tuple(z.shape) == tuple(batch) + tuple(b.latent_shape) and tuple(ladj.shape) == tuple(batch),
        f"z {tuple(z.shape)}, ladj {tuple(ladj.shape)}",
    )
    leaves = _layers(b)
    if leaves[0][0]:
        _check_chain(report, b, [leaf for _, leaf in leaves], x, context, atol)
    else:
        whole = _Layer(name, b, b.domain, getattr(b, "codomain", b.domain))
        report.results += _pointwise(whole, x, context, atol).report(name).results

    points = [("inside", x)]
    if not b.domain.is_manifold and type(b.domain).__name__ == "Real":
        points.append(("far outside", x * far + far))
    for where, pts in points:
        b.zero_grad()
        pts = pts.clone().requires_grad_(True)
        z, ladj = b(pts, context)
        zi, ladji = b.inverse(z.detach(), context)
        (z.square().mean() + ladj.mean() + zi.square().mean() + ladji.mean()).backward()
        grads = [pts.grad] + [p.grad for p in b.parameters() if p.grad is not None]
        finite_out = bool(torch.isfinite(z).all() and torch.isfinite(ladj).all())
        finite_grad = all(bool(torch.isfinite(g).all()) for g in grads if g is not None)
        report.add(f"finite values and gradients ({where})", finite_out and finite_grad)
    return _finish(report, raise_on_failure)


def _finish(report: CheckReport, raise_on_failure: bool) -> CheckReport:
    if raise_on_failure and not report.passed:
        raise AssertionError(f"{report.name} failed its checks:\n" + "\n".join(report.failures))
    return report


@torch.no_grad()
def _log_prob_in_chunks(flow: Flow, x: Tensor, chunk: int = 65536) -> Tensor:
    """`flow.log_prob(x)` without gradients, `chunk` points at a time (quadrature grids hold millions)."""
    return torch.cat([flow.log_prob(part) for part in x.split(chunk)])


def _quadrature_mass(flow: Flow, samples: Tensor, points: int, interval: Interval | None = None) -> float:
    """Total mass by the midpoint rule after the map `y = c + s tan(pi u / 2)`, `u` in (-1, 1)^d.

    The tangent map spreads the grid over heavy tails; `c` and `s` are the
    samples' median and half inter-quartile range per dimension. On a bounded
    `interval` the grid lives in logit coordinates, `x = low + (high - low) sigmoid(y)`,
    so that it follows the samples there too and never leaves the interval.
    """
    d = samples.shape[1]
    if interval is not None:  # to logit coordinates
        width = interval.high - interval.low
        samples = torch.logit(((samples - interval.low) / width).clamp(1e-12, 1 - 1e-12))
    q = torch.quantile(samples, torch.tensor([0.25, 0.5, 0.75], dtype=samples.dtype), dim=0)
    center, scale = q[1], ((q[2] - q[0]) / 2).clamp_min(1e-3)
    u = (torch.arange(points, dtype=torch.float64) + 0.5) / points * 2 - 1
    grid_u = torch.stack(torch.meshgrid(*[u] * d, indexing="ij"), dim=-1).reshape(-1, d)
    y = center + scale * torch.tan(math.pi * grid_u / 2)
    log_jac = (scale * math.pi / 2 / torch.cos(math.pi * grid_u / 2).square()).log().sum(-1)
    if interval is not None:  # back to the interval
        x = interval.low + width * torch.sigmoid(y)
        log_jac = log_jac + (math.log(width) + F.logsigmoid(y) + F.logsigmoid(-y)).sum(-1)
        inside = ((x > interval.low) & (x < interval.high)).all(-1)  # nodes rounded onto an end carry no mass
        x, log_jac = x[inside], log_jac[inside]
    else:
        x = y
    logp = _log_prob_in_chunks(flow, x.reshape(-1, *flow.event_shape))
    return float(torch.exp(logp + log_jac).sum() * (2 / points) ** d)


def check_flow(
    flow: Flow,
    context: Tensor | None = None,
    *,
    n: int = 2000,
    atol: float = 1e-6,
    mass_tol: float = 1e-2,
    raise_on_failure: bool = True,
) -> CheckReport:
    r"""Check a flow: its bijector (see [`check_bijector`][flowkit.testing.check_bijector]), sampling, normalisation.

    On a CPU float64 copy: samples have the event shape and finite log density;
    `rsample_and_log_prob` agrees with `log_prob` on the same points; for
    unconditional flows with one- or two-dimensional events, the density
    integrates to 1 within `mass_tol` by grid quadrature (over the real line, or over
    the box when the flow's domain is a bounded interval or a circle); on a manifold of finite
    volume (the bijector's or the base's domain, e.g. `S^3`), within
    `max(mass_tol, 3 SE)` by Monte Carlo over `20 n` uniform points
    ($\mathrm{vol}(M)\, E_{U(M)}[p] = 1$, so $2\pi^2 E_{U(S^3)}[p] = 1$).

    Arguments:
        flow: the flow.
        context: a single context vector for conditional flows (random when None).
        n: number of samples.
        atol: tolerance of the pointwise comparisons.
        mass_tol: tolerance on the total probability mass.
        raise_on_failure: raise `AssertionError` listing the failures.
    """
    report = CheckReport(type(flow).__name__)
    if not getattr(flow, "bijective", False):
        report.add("a Flow", False, f"a {type(flow).__name__} is no bijector over a base to check")
        return _finish(report, raise_on_failure)
    f = copy.deepcopy(flow).to(device="cpu", dtype=torch.float64).eval()
    if f.context_features and context is None:
        context = torch.randn(f.context_features, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    if context is not None:
        context = context.to(device="cpu", dtype=torch.float64)
    sub = check_bijector(
        f.bijector, context=None if context is None else context.expand(4, -1), atol=atol, raise_on_failure=False
    )
    report.results += [(f"bijector: {c}", ok, d) for c, ok, d in sub.results]
    report.layers = sub.layers
    with torch.no_grad():
        x, log_q = f.sample_and_log_prob((n,), context)
        report.add("sample shape", tuple(x.shape) == (n, *f.event_shape), f"{tuple(x.shape)}")
        report.add("finite samples and log densities", bool(torch.isfinite(x).all() and torch.isfinite(log_q).all()))
        err = (f.log_prob(x, context) - log_q).abs().max().item()
        report.add("sample_and_log_prob agrees with log_prob", err < max(atol, 1e-5), f"max error {err:.2e}")
    numel = math.prod(f.event_shape)
    domain = _finite_domain(f)
    if isinstance(domain, Interval) and numel <= 2 and context is None:
        points = 4000 if numel == 1 else 500
        if isinstance(domain, Circle):  # periodic: the midpoint rule over the box
            mass = _box_mass(f, domain, points)
        else:
            mass = _quadrature_mass(f, x.reshape(n, numel), points, interval=domain)
        report.add("density integrates to 1", abs(mass - 1) < mass_tol, f"mass {mass:.4f} (quadrature on {domain!r})")
    elif domain is not None and context is None:
        mass, err = _uniform_mass(f, domain, 20 * n)
        ok = abs(mass - 1) < max(mass_tol, 3 * err)
        report.add("density integrates to 1", ok, f"mass {mass:.4f} +- {err:.4f} (Monte Carlo, uniform on {domain!r})")
    elif numel <= 2 and context is None:
        mass = _quadrature_mass(f, x.reshape(n, numel), 4000 if numel == 1 else 500)
        report.add("density integrates to 1", abs(mass - 1) < mass_tol, f"mass {mass:.4f}")
    return _finish(report, raise_on_failure)


def _finite_domain(flow: Flow) -> Domain | None:
    """The domain of finite volume the flow's data live in (its bijector's, or its base's), else None.

    A manifold (sphere, circle, product) or a bounded interval: there the density
    is integrated over the domain itself, never over the real line (whose points
    outside the domain the flow refuses).
    """
    for domain in (flow.domain, getattr(flow.base, "domain", None)):
        if isinstance(domain, Domain) and domain.log_volume(tuple(flow.event_shape)) is not None:
            return domain
    return None


def _box_mass(flow: Flow, domain: Interval, points: int) -> float:
    """Total mass over the box `(low, high)^d` (`d` of 1 or 2) by the midpoint rule on `points` nodes per axis.

    For a periodic domain (a circle or torus), where the rule converges fast for smooth densities.
    """
    numel = math.prod(flow.event_shape)
    width = domain.high - domain.low
    u = domain.low + width * (torch.arange(points, dtype=torch.float64) + 0.5) / points
    grid = torch.stack(torch.meshgrid(*[u] * numel, indexing="ij"), dim=-1).reshape(-1, *flow.event_shape)
    logp = _log_prob_in_chunks(flow, grid)
    return float(torch.exp(logp).sum() * (width / points) ** numel)


def _uniform_mass(flow: Flow, domain: Domain, n: int, seed: int = 1) -> tuple[float, float]:
    r"""Total mass $\mathrm{vol}(M)\, E_{U(M)}[p]$ by Monte Carlo over uniform points, and its standard error."""
    generator = torch.Generator().manual_seed(seed)
    u = domain.uniform((n, *flow.event_shape), generator=generator)
    logp = _log_prob_in_chunks(flow, u)
    p = torch.exp(logp + domain.log_volume(tuple(flow.event_shape)))
    return float(p.mean()), float(p.std() / math.sqrt(n))
