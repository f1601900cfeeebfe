"""Public correctness checks for bijectors and flows.

[`check_bijector`][flowkit.testing.check_bijector] verifies, in float64, that a bijector is invertible,
that its log-determinant matches the autograd Jacobian (in tangent space on
manifolds), that the inverse log-determinant is minus the forward one, that
gradients are finite (also far outside spline bounds), and that points in a
batch do not influence each other. [`check_flow`][flowkit.testing.check_flow] adds sampling checks and,
in one or two dimensions, that the density integrates to one by quadrature.

The test suite runs `check_bijector` over one table of cases, at least one
per public bijector, in `tests/cases.py`.

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
from torch import Tensor

from .bijectors import Bijector
from .flows import Flow

__all__ = ["CheckReport", "check_bijector", "check_flow", "randomize"]


@dataclass
class CheckReport:
    """Outcome of [`check_bijector`][flowkit.testing.check_bijector] or [`check_flow`][flowkit.testing.check_flow].

    One line per check.
    """

    name: str
    results: list[tuple[str, bool, str]] = field(default_factory=list)

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
        lines += [
            f"  [{'ok' if ok else 'FAIL'}] {check}" + (f" ({detail})" if detail else "")
            for check, ok, detail in self.results
        ]
        return "\n".join(lines)


def randomize(module: torch.nn.Module, scale: float = 0.3, seed: int = 0) -> torch.nn.Module:
    """Perturb every parameter by Gaussian noise, so that a freshly built layer is not the identity."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator).to(p))
    return module


def _flat(x: Tensor, event_dims: int) -> Tensor:
    return x.reshape(*x.shape[: x.dim() - event_dims], -1)


def _jacobian_ladj(b: Bijector, x: Tensor, context: Tensor | None) -> Tensor:
    """log|det| of the autograd Jacobian of `b.forward` at each point of a batch (tangent space on manifolds)."""
    out = []
    event_dims = len(b.event_shape)
    codomain = getattr(b, "codomain", b.domain)
    for i in range(x.shape[0]):
        xi = x[i : i + 1]
        ci = None if context is None else context[i : i + 1]

        def f(v: Tensor, xi: Tensor = xi, ci: Tensor | None = ci) -> Tensor:
            return _flat(b(v.reshape(xi.shape), ci)[0], len(b.latent_shape))[0]

        jac = torch.autograd.functional.jacobian(f, _flat(xi, event_dims)[0])
        if b.domain.is_manifold or codomain.is_manifold:
            z = f(_flat(xi, event_dims)[0])
            e_in = b.domain.tangent_basis(_flat(xi, event_dims)[0])
            e_out = codomain.tangent_basis(z)
            jac = e_out.transpose(-1, -2) @ jac @ e_in
        out.append(torch.linalg.slogdet(jac)[1])
    return torch.stack(out)


def check_bijector(
    bijector: Bijector,
    x: Tensor | None = None,
    context: Tensor | None = None,
    *,
    atol: float = 1e-6,
    far: float = 50.0,
    raise_on_failure: bool = True,
) -> CheckReport:
    """Check a bijector's inverse, log-determinant and gradients in float64.

    The bijector is copied to the CPU and converted to float64; the original is not touched.

    Checks: output shapes; round trip `inverse(forward(x)) = x`; `forward`'s
    log-determinant against `log|det|` of the autograd Jacobian (tangent
    space on manifolds, skipped above 256 elements per event); inverse
    log-determinant equals minus the forward one; `call` agrees with
    `forward`; finite gradients with respect to inputs and parameters, also
    at points `far` times further out for unbounded domains (spline tails);
    batch independence (a batch gives what each point gives alone).

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
    x_back, ladj_inv = b.inverse(z, context)
    err = (x_back - x).abs().max().item()
    report.add("round trip inverse(forward(x)) = x", err < atol, f"max error {err:.2e}")
    err = (ladj_inv + ladj).abs().max().item()
    report.add("inverse ladj = -forward ladj", err < atol, f"max error {err:.2e}")
    err = (b.call(x, context) - z).abs().max().item()
    report.add("call(x) = forward(x)[0]", err < atol, f"max error {err:.2e}")
    err = (b.inverse_call(z, context) - x_back).abs().max().item()
    report.add("inverse_call(z) = inverse(z)[0]", err < atol, f"max error {err:.2e}")
    if math.prod(b.event_shape) <= 256 and x.dim() > len(b.event_shape):
        flat = x.reshape(-1, *b.event_shape)
        ctx = None if context is None else context.expand(*batch, context.shape[-1]).reshape(-1, context.shape[-1])
        expected = _jacobian_ladj(b, flat, ctx)
        err = (expected - ladj.reshape(-1)).abs().max().item()
        report.add("ladj = log|det| of the autograd Jacobian", err < atol * 10, f"max error {err:.2e}")
    if x.dim() > len(b.event_shape) and x.shape[0] > 1:
        singles = [b(x[i : i + 1], None if context is None else context[i : i + 1]) for i in range(x.shape[0])]
        err_z = (torch.cat([s[0] for s in singles]) - z).abs().max().item()
        err_l = (torch.cat([s[1] for s in singles]) - ladj).abs().max().item()
        report.add("batch independence", max(err_z, err_l) < atol, f"max error {max(err_z, err_l):.2e}")

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


def _quadrature_mass(flow: Flow, samples: Tensor, points: int) -> float:
    """Total mass by the midpoint rule after the map `x = c + s tan(pi u / 2)`, `u` in (-1, 1)^d.

    The tangent map spreads the grid over heavy tails; `c` and `s` are the
    samples' median and half inter-quartile range per dimension.
    """
    q = torch.quantile(samples, torch.tensor([0.25, 0.5, 0.75], dtype=samples.dtype), dim=0)
    center, scale = q[1], ((q[2] - q[0]) / 2).clamp_min(1e-3)
    u = (torch.arange(points, dtype=torch.float64) + 0.5) / points * 2 - 1
    grid_u = torch.stack(torch.meshgrid(*[u] * samples.shape[1], indexing="ij"), dim=-1).reshape(-1, samples.shape[1])
    x = center + scale * torch.tan(math.pi * grid_u / 2)
    log_jac = (scale * math.pi / 2 / torch.cos(math.pi * grid_u / 2).square()).log().sum(-1)
    with torch.no_grad():
        logp = torch.cat([flow.log_prob(chunk) for chunk in x.split(65536)])
    return float(torch.exp(logp + log_jac).sum() * (2 / points) ** samples.shape[1])


def check_flow(
    flow: Flow,
    context: Tensor | None = None,
    *,
    n: int = 2000,
    atol: float = 1e-6,
    mass_tol: float = 1e-2,
    raise_on_failure: bool = True,
) -> CheckReport:
    """Check a flow: its bijector (see [`check_bijector`][flowkit.testing.check_bijector]), sampling, and normalisation.

    On a CPU float64 copy: samples have the event shape and finite log density;
    `rsample_and_log_prob` agrees with `log_prob` on the same points; for
    unconditional flows with one- or two-dimensional events, the density
    integrates to 1 within `mass_tol` by grid quadrature.

    Arguments:
        flow: the flow.
        context: a single context vector for conditional flows (random when None).
        n: number of samples.
        atol: tolerance of the pointwise comparisons.
        mass_tol: tolerance on the total probability mass.
        raise_on_failure: raise `AssertionError` listing the failures.
    """
    report = CheckReport(type(flow).__name__)
    if not isinstance(flow, Flow):
        report.add("a Flow", False, f"a {type(flow).__name__} has no exact density to check")
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
    with torch.no_grad():
        x, log_q = f.sample_and_log_prob((n,), context)
        report.add("sample shape", tuple(x.shape) == (n, *f.event_shape), f"{tuple(x.shape)}")
        report.add("finite samples and log densities", bool(torch.isfinite(x).all() and torch.isfinite(log_q).all()))
        err = (f.log_prob(x, context) - log_q).abs().max().item()
        report.add("sample_and_log_prob agrees with log_prob", err < max(atol, 1e-5), f"max error {err:.2e}")
    numel = math.prod(f.event_shape)
    if numel <= 2 and context is None:
        mass = _quadrature_mass(f, x.reshape(n, numel), 4000 if numel == 1 else 500)
        report.add("density integrates to 1", abs(mass - 1) < mass_tol, f"mass {mass:.4f}")
    return _finish(report, raise_on_failure)
