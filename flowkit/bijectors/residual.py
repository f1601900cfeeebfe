r"""Invertible residual layers $z = x + g(x)$ with a contractive $g$ (i-ResNet, residual flows).

$g$ is a network of spectrally normalised linear layers and 1-Lipschitz activations, so
$\mathrm{Lip}(g) \le c < 1$: the map is invertible (Banach's fixed-point theorem) and
$\log|\det(I + J_g)| = \sum_{k \ge 1} (-1)^{k+1} \operatorname{tr}(J_g^k) / k$ converges.

References:
    Behrmann, Grathwohl, Chen, Duvenaud & Jacobsen, *Invertible Residual Networks*, ICML 2019
    (arXiv:1811.00995);
    Chen, Behrmann, Duvenaud & Jacobsen, *Residual Flows for Invertible Generative Modeling*,
    NeurIPS 2019 (arXiv:1906.02735).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .._validation import check_number
from ..root_finding import ConvergenceError
from ..root_finding import tolerance as root_tolerance
from .base import Bijector

__all__ = ["Residual", "LipSwish", "SpectralLinear"]

#: How `Residual` computes `log|det(I + J_g)|` in training mode.
LOGDET = ("exact", "series")
#: Distributions of the number of extra power-series terms (Russian roulette).
ESTIMATORS = ("geometric", "poisson")
#: The initial LipSwish slope parameter beta of `Residual` blocks (see `Residual`, "Initialisation").
_LIPSWISH_BETA = 32.0


class LipSwish(nn.Module):
    r"""The 1-Lipschitz Swish $\phi(x) = x \, \sigma(\beta x) / 1.1$ with a learned $\beta = \mathrm{softplus}(b) > 0$.

    $\max_x \frac{d}{dx}[x \sigma(\beta x)] \approx 1.0998$ for every $\beta$, so the division by 1.1
    makes $\phi$ 1-Lipschitz (Chen et al. 2019, section 4). $\phi_\beta(x) = \phi_1(\beta x) / \beta$ bends
    over a width of about $4 / \beta$ and is close to linear on smaller inputs
    (see [`Residual`][flowkit.bijectors.Residual], "Initialisation").

    Arguments:
        beta: the initial $\beta$ (positive); Chen et al. start from $\mathrm{softplus}(0.5) \approx 0.97$.
    """

    def __init__(self, beta: float = _LIPSWISH_BETA) -> None:
        super().__init__()
        check_number(beta, "beta", where="LipSwish", positive=True)
        raw = float(beta) + math.log(-math.expm1(-float(beta)))  # softplus^{-1}(beta), stable for large beta
        self.raw_beta = nn.Parameter(torch.tensor(raw))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(F.softplus(self.raw_beta) * x) / 1.1

    def with_derivative(self, x: Tensor) -> tuple[Tensor, Tensor]:
        r"""$(\phi(x), \phi'(x))$ with $\phi'(x) = [\sigma(y) + y \, \sigma(y)(1 - \sigma(y))] / 1.1$, $y = \beta x$."""
        y = F.softplus(self.raw_beta) * x
        s = torch.sigmoid(y)
        return x * s / 1.1, (s + y * s * (1 - s)) / 1.1

    def derivative(self, x: Tensor) -> Tensor:
        r"""$\phi'(x)$."""
        return self.with_derivative(x)[1]


class _Tanh(nn.Module):
    """`tanh` (1-Lipschitz) with its derivative."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x)

    def with_derivative(self, x: Tensor) -> tuple[Tensor, Tensor]:
        t = torch.tanh(x)
        return t, 1 - t**2


class _ELU(nn.Module):
    """ELU with `alpha = 1` (1-Lipschitz) with its derivative."""

    def forward(self, x: Tensor) -> Tensor:
        return F.elu(x)

    def with_derivative(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return F.elu(x), torch.where(x > 0, torch.ones_like(x), torch.exp(torch.clamp(x, max=0.0)))


#: The 1-Lipschitz activations `Residual` accepts.
ACTIVATIONS = {"lipswish": LipSwish, "tanh": _Tanh, "elu": _ELU}


#: Power iterations of a layer's first training-mode call, from random vectors.
_COLD_ITERATIONS = 100


class SpectralLinear(nn.Module):
    r"""A linear layer rescaled to spectral norm at most `coefficient`: $\tilde W = W / \max(1, \sigma(W) / c)$.

    With `iterations=None` (the default) $\sigma(W)$ is the exact largest singular value in every mode, so
    $\|\tilde W\|_2 \le c$ holds to rounding at every training step; the gradient flows through it
    ($\partial \sigma / \partial W = u_1 v_1^\top$), for an SVD per call.

    With an integer `iterations`, in training mode $\sigma(W)$ is the power-iteration estimate $u^\top W v$,
    `iterations` steps per call warm-started from the last call's vectors (100 on a layer's first call), with the
    gradient of `torch.nn.utils.spectral_norm` (Behrmann et al. 2019, algorithm 1). The estimate lags below $\sigma(W)$
    when the top singular values are close, as training makes them. In eval mode $\sigma(W)$ is exact. The vectors
    $u, v$ are saved buffers in both settings.

    Arguments:
        in_features: input size.
        out_features: output size.
        coefficient: the bound `c` on the spectral norm, in (0, 1).
        iterations: None for the exact $\sigma(W)$ in training too, or the power iterations per training-mode
            call (at least 1).

    References:
        Miyato, Kataoka, Koyama & Yoshida, *Spectral Normalization for Generative Adversarial
        Networks*, ICLR 2018 (arXiv:1802.05957); Behrmann et al. 2019 (algorithm 1).
    """

    def __init__(
        self, in_features: int, out_features: int, coefficient: float = 0.97, iterations: int | None = None
    ) -> None:
        super().__init__()
        where = "SpectralLinear"
        check_number(in_features, "in_features", where=where, integer=True, low=1)
        check_number(out_features, "out_features", where=where, integer=True, low=1)
        self.coefficient = check_number(coefficient, "coefficient", where=where, positive=True, below=1)
        if iterations is not None:
            check_number(iterations, "iterations", where=where, integer=True, low=1)
        self.iterations = iterations
        linear = nn.Linear(in_features, out_features)
        self.weight = nn.Parameter(linear.weight.detach().clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())
        self.register_buffer("u", F.normalize(torch.randn(out_features), dim=0))
        self.register_buffer("v", F.normalize(torch.randn(in_features), dim=0))
        self._cold = True  # the first training-mode call converges the vectors (_COLD_ITERATIONS steps)

    def _sigma(self, update: bool) -> Tensor:
        if not self.training or self.iterations is None:
            return torch.linalg.matrix_norm(self.weight, ord=2)
        with torch.no_grad():
            u, v, w = self.u, self.v, self.weight.detach()
            steps = (_COLD_ITERATIONS if self._cold else self.iterations) if update else 0
            self._cold = self._cold and not update
            for _ in range(steps):
                v = torch.mv(w.T, u)
                v = v / v.norm().clamp(min=1e-12)
                u = torch.mv(w, v)
                u = u / u.norm().clamp(min=1e-12)
            if update:  # new tensors, never written in place: the graph may hold the old ones
                self.u, self.v = u, v
        return torch.dot(u, self.weight @ v)

    def normalized_weight(self, update: bool = True) -> Tensor:
        r"""The rescaled weight $\tilde W$; `update=False` uses the stored power-iteration vectors as they are."""
        return self.weight / torch.clamp(self._sigma(update) / self.coefficient, min=1.0)

    def forward(self, x: Tensor, update: bool = True) -> Tensor:
        return F.linear(x, self.normalized_weight(update), self.bias)

    def extra_repr(self) -> str:
        out, inp = self.weight.shape
        return f"in_features={inp}, out_features={out}, coefficient={self.coefficient}"


def _check_fixed_point(where: str, what: str, steps: Tensor, start: Tensor, tolerance: float) -> None:
    r"""Raise `ConvergenceError` for a fixed-point iteration whose last `steps` are still large.

    Large: above `tolerance` and the rounding allowance [`tolerance`][flowkit.root_finding.tolerance] $\max(1, |v|)$.
    """
    floor = root_tolerance(start.dtype) * max(1.0, float(start.abs().max()))
    bound = max(tolerance, floor)
    if float(steps.max()) <= bound:
        return
    i = int(steps.reshape(-1).argmax())
    index = tuple(int(k) for k in torch.unravel_index(torch.tensor(i), steps.shape))
    raise ConvergenceError(
        f"{where}: {what} did not converge: {int((steps > bound).sum())} of {steps.numel()} elements still move "
        f"more than the tolerance {bound:.3g} per step; the worst, element {index} (of the input "
        f"{float(start.reshape(-1)[i]):.10g}), has residual {float(steps.reshape(-1)[i]):.3g} "
        "(a block that is not contractive, e.g. in training mode before the power iterations have converged, "
        "or too few max_iterations)"
    )


def _roulette_tail(estimator: str, parameter: float, m: int) -> float:
    """`P(N >= m)` for the number `N` of extra terms: geometric `P(N = n) = p (1 - p)^n` or Poisson."""
    if m <= 0:
        return 1.0
    if estimator == "geometric":
        return (1.0 - parameter) ** m
    # P(Poisson(rate) >= m) is the regularised lower incomplete gamma function P(m, rate).
    return float(torch.special.gammainc(*torch.tensor([float(m), parameter], dtype=torch.float64)))


class Residual(Bijector):
    r"""Invertible residual block $z = x + g(x)$ (i-ResNet / residual flow) on vectors of `features`.

    $g$ alternates `SpectralLinear` layers (spectral norm
    at most `coefficient` $= c < 1$, re-normalised at every call, so also after every training step)
    with 1-Lipschitz activations, hence $\mathrm{Lip}(g) \le c^{L} < 1$ for $L$ linear layers.

    **Log-determinant.** $\log|\det(I + J_g(x))|$ is computed

    - `logdet="exact"`: from the Jacobian
      $J_g = W_L \operatorname{diag}(\phi'(a_{L-1})) W_{L-1} \cdots \operatorname{diag}(\phi'(a_1)) W_1$ assembled layer
      by layer and `slogdet` (deterministic; costs $O(D^3)$ per point, meant for small $D$);
    - `logdet="series"` (training mode only): by the power series $\sum_{k \ge 1} (-1)^{k+1} v^\top J_g^k v / k$ with
      one Gaussian Hutchinson probe $v$, truncated after `exact_terms` $+ N$ terms where $N$ is drawn once per call
      (geometric, $P(N = n) = p(1-p)^n$, or Poisson with mean `rate`), term $k$ weighted by
      $1 / P(N \ge k - n_\text{exact})$: the Russian-roulette estimator, unbiased for the log-determinant (Chen et al.
      2019, theorem 1). With `neumann=True` its gradient comes from the Neumann series
      $\partial \log\det(I + J) = \sum_{m \ge 0} (-1)^m \operatorname{tr}(J^m \, \partial J)$ with the same weights,
      evaluated as one vector-Jacobian product with a graph, $w^\top \partial J \, v$ with
      $w^\top = \sum_m (-1)^m c_{m+1} v^\top J^m$ built without one: memory does not grow with the number of terms (Chen
      et al. 2019, section 3.2). With `neumann=False` autograd differentiates the truncated series itself.

    In eval mode (`flow.eval()`, as in `check_bijector`) the log-determinant is always the exact one, so
    `log_prob` is deterministic whatever `logdet` says.

    **Initialisation.** The last linear layer starts at a tenth of its default scale (near the identity) and every
    LipSwish at $\beta$ = `beta` = 32: $\phi_\beta(x) \approx x / 2.2 + \beta x^2 / 8.8$ for $|\beta x| \lesssim 1$, so
    at Chen et al.'s $\beta \approx 0.97$ the network is nearly linear on unit-scale data (and stayed at the Gaussian
    fit). $\beta$ does not change the Lipschitz bound.

    **Inverse.** The fixed-point iteration $x_{k+1} = z - g(x_k)$ from $x_0 = z$, a contraction with rate
    $\mathrm{Lip}(g) \le c$, runs until $\max |x_{k+1} - x_k| \le$ `tolerance` (or, below that, the dtype's rounding
    floor $8 \varepsilon \max(1, |z|)$), at most `max_iterations` times; the result is then within $c / (1 - c) \cdot$
    `tolerance` of the exact inverse. An iteration (or the backward pass's adjoint solve) still above its tolerance
    after `max_iterations` steps raises [`ConvergenceError`][flowkit.root_finding.ConvergenceError] naming the point.
    Gradients of the inverse are the implicit ones, $\partial x / \partial z = (I + J_g)^{-1}$ and
    $\partial x / \partial \theta = -(I + J_g)^{-1} \partial g / \partial \theta$, applied by the same fixed-point
    iteration on the incoming gradient.

    Arguments:
        features: number of features `D`.
        hidden: hidden sizes of $g$.
        coefficient: the spectral-norm bound `c` of every linear layer, in (0, 1).
        activation: `"lipswish"` (learned $\beta$), `"tanh"` or `"elu"`.
        logdet: `"exact"` or `"series"` (training mode; eval mode is always exact).
        estimator: distribution of the number of extra terms, `"geometric"` or `"poisson"`.
        p: success probability of the geometric distribution, in (0, 1) (mean $(1 - p) / p$ extra terms).
        rate: mean of the Poisson distribution (positive).
        exact_terms: terms always included before the roulette starts (non-negative).
        neumann: use the memory-efficient Neumann-series gradient.
        power_iterations: None for the exact spectral norm at every step, or the power iterations per
            training-mode call (cheaper for wide layers; see `flowkit.bijectors.residual.SpectralLinear`).
        tolerance: stopping tolerance of the fixed-point inverse (positive).
        max_iterations: the most fixed-point iterations.
        beta: the initial $\beta$ of the LipSwish activations (positive; only for `activation="lipswish"`).

    References:
        Behrmann et al., *Invertible Residual Networks*, ICML 2019 (arXiv:1811.00995);
        Chen et al., *Residual Flows for Invertible Generative Modeling*, NeurIPS 2019 (arXiv:1906.02735).
    """

    def __init__(
        self,
        features: int,
        hidden: Sequence[int] = (64, 64),
        coefficient: float = 0.97,
        activation: str = "lipswish",
        logdet: str = "exact",
        estimator: str = "geometric",
        p: float = 0.5,
        rate: float = 2.0,
        exact_terms: int = 2,
        neumann: bool = True,
        power_iterations: int | None = None,
        tolerance: float = 1e-10,
        max_iterations: int = 2000,
        beta: float = _LIPSWISH_BETA,
    ) -> None:
        super().__init__()
        where = "Residual"
        check_number(features, "features", where=where, integer=True, low=1)
        if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
            raise ValueError(f"{where}: hidden must be a sequence of layer sizes, got {hidden!r}")
        for size in hidden:
            check_number(size, "every hidden size", where=where, integer=True, low=1)
        self.coefficient = check_number(coefficient, "coefficient", where=where, positive=True, below=1)
        for name, value, choices in (
            ("activation", activation, tuple(ACTIVATIONS)),
            ("logdet", logdet, LOGDET),
            ("estimator", estimator, ESTIMATORS),
        ):
            if value not in choices:
                raise ValueError(f"{where}: {name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
        self.p = check_number(p, "p", where=where, positive=True, below=1)
        self.rate = check_number(rate, "rate", where=where, positive=True)
        self.exact_terms = check_number(exact_terms, "exact_terms", where=where, integer=True, low=0)
        if power_iterations is not None:
            check_number(power_iterations, "power_iterations", where=where, integer=True, low=1)
        self.tolerance = check_number(tolerance, "tolerance", where=where, positive=True)
        self.max_iterations = check_number(max_iterations, "max_iterations", where=where, integer=True, low=1)
        if not isinstance(neumann, bool):
            raise ValueError(f"{where}: neumann must be True or False, got {neumann!r}")
        self.event_shape = torch.Size((features,))
        self.logdet, self.estimator, self.neumann = logdet, estimator, neumann
        sizes = [features, *hidden, features]
        self.linears = nn.ModuleList(
            SpectralLinear(a, b, coefficient, power_iterations) for a, b in zip(sizes[:-1], sizes[1:], strict=False)
        )
        check_number(beta, "beta", where=where, positive=True)
        make = (lambda: LipSwish(beta)) if activation == "lipswish" else ACTIVATIONS[activation]
        self.activations = nn.ModuleList(make() for _ in hidden)
        with torch.no_grad():  # start near the identity
            self.linears[-1].weight.mul_(0.1)
            self.linears[-1].bias.zero_()

    # -- the network g and its Jacobian --------------------------------------------------------------------------

    def _weights(self, update: bool = True) -> list[Tensor]:
        """The normalised weight of every linear layer; `update=False` keeps the power-iteration vectors."""
        return [linear.normalized_weight(update) for linear in self.linears]

    def _network(self, x: Tensor, weights: list[Tensor]) -> Tensor:
        h = x
        for i, (linear, weight) in enumerate(zip(self.linears, weights, strict=True)):
            h = F.linear(h, weight, linear.bias)
            if i < len(self.activations):
                h = self.activations[i](h)
        return h

    def residual(self, x: Tensor) -> Tensor:
        """$g(x)$."""
        return self._network(x, self._weights())

    def _network_with_slopes(self, x: Tensor, weights: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
        r"""$g(x)$ and the activations' slopes $\phi'(a_i)$, one `(N, H_i)` tensor per hidden layer."""
        h, slopes = x, []
        for i, (linear, weight) in enumerate(zip(self.linears, weights, strict=True)):
            h = F.linear(h, weight, linear.bias)
            if i < len(self.activations):
                h, slope = self.activations[i].with_derivative(h)
                slopes.append(slope)
        return h, slopes

    @staticmethod
    def _vjp(u: Tensor, weights: list[Tensor], slopes: list[Tensor]) -> Tensor:
        r"""$u^\top J_g$: back through the layers, $u \leftarrow (u W_i) \odot \phi'(a_{i-1})$."""
        for i in reversed(range(len(weights))):
            u = u @ weights[i]
            if i:
                u = u * slopes[i - 1]
        return u

    @staticmethod
    def _jvp(v: Tensor, weights: list[Tensor], slopes: list[Tensor]) -> Tensor:
        r"""$J_g v$ (rows of `v`): forward through the layers, $v \leftarrow (v W_i^\top) \odot \phi'(a_i)$."""
        for i, weight in enumerate(weights):
            v = F.linear(v, weight)
            if i < len(slopes):
                v = v * slopes[i]
        return v

    def spectral_norms(self) -> Tensor:
        """Exact spectral norms of the weights $g$ uses in the current mode, one per linear layer (no update)."""
        with torch.no_grad():
            return torch.stack(
                [torch.linalg.matrix_norm(lin.normalized_weight(update=False), ord=2) for lin in self.linears]
            )

    # -- log-determinants ----------------------------------------------------------------------------------------

    def _exact(self, x: Tensor, weights: list[Tensor]) -> tuple[Tensor, Tensor]:
        g, slopes = self._network_with_slopes(x, weights)
        # J^T, (N, D, D): the rows of the identity pushed forward, one matrix product (N D, H) @ (H, H') a layer.
        eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)
        jac_t = self._jvp(eye, weights, [slope.unsqueeze(-2) for slope in slopes])
        if jac_t.dim() == 2:  # no hidden layer: J = W, the same for every point
            jac_t = jac_t.expand(x.shape[0], *jac_t.shape)
        if x.shape[-1] == 1:
            return g, torch.log1p(jac_t[:, 0, 0])  # 1 + g' > 0 (Lip(g) < 1)
        if x.shape[-1] == 2:  # det(I + J) > 0: the 2 x 2 determinant in closed form
            det = (1 + jac_t[:, 0, 0]) * (1 + jac_t[:, 1, 1]) - jac_t[:, 0, 1] * jac_t[:, 1, 0]
            return g, torch.log(det)
        return g, torch.linalg.slogdet(eye + jac_t)[1]  # det(I + J^T) = det(I + J)

    def _draw_terms(self) -> int:
        if self.estimator == "geometric":
            extra = int(torch.empty((), dtype=torch.float64).geometric_(self.p).item()) - 1
        else:
            extra = int(torch.poisson(torch.tensor(self.rate, dtype=torch.float64)).item())
        return self.exact_terms + extra

    def _weight(self, k: int) -> float:
        r"""The roulette weight $1 / P(N \ge k - n_\text{exact})$ of power-series term `k`."""
        parameter = self.p if self.estimator == "geometric" else self.rate
        return 1.0 / _roulette_tail(self.estimator, parameter, k - self.exact_terms)

    def _series(self, x: Tensor, weights: list[Tensor]) -> tuple[Tensor, Tensor]:
        g, slopes = self._network_with_slopes(x, weights)
        terms = self._draw_terms()
        v = torch.randn_like(x)
        ladj = x.new_zeros(x.shape[0])
        u = v
        if self.neumann:
            with torch.no_grad():
                fixed_weights = [weight.detach() for weight in weights]
                fixed_slopes = [slope.detach() for slope in slopes]
                adjoint = self._weight(1) * v  # w^T = sum_m (-1)^m c_{m+1} v^T J^m
                for k in range(1, terms + 1):
                    u = self._vjp(u, fixed_weights, fixed_slopes)  # v^T J^k
                    ladj = ladj + (-1) ** (k + 1) / k * self._weight(k) * (u * v).sum(-1)
                    if k < terms:
                        adjoint = adjoint + (-1) ** k * self._weight(k + 1) * u
            if terms > 0 and torch.is_grad_enabled():
                surrogate = (adjoint * self._jvp(v, weights, slopes)).sum(-1)  # w^T J v, its gradient only
                ladj = ladj + surrogate - surrogate.detach()
        else:
            for k in range(1, terms + 1):
                u = self._vjp(u, weights, slopes)
                ladj = ladj + (-1) ** (k + 1) / k * self._weight(k) * (u * v).sum(-1)
        return g, ladj

    def _residual_and_ladj(self, x: Tensor, update: bool = True) -> tuple[Tensor, Tensor]:
        flat = x.reshape(-1, x.shape[-1])
        series = self.training and self.logdet == "series"
        weights = self._weights(update)
        g, ladj = self._series(flat, weights) if series else self._exact(flat, weights)
        return g.reshape(x.shape), ladj.reshape(x.shape[:-1])

    # -- the bijector --------------------------------------------------------------------------------------------

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        g, ladj = self._residual_and_ladj(x)
        return x + g, ladj

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        return x + self.residual(x)

    def _fixed_point(self, z: Tensor) -> Tensor:
        with torch.no_grad():
            floor = 8 * torch.finfo(z.dtype).eps * max(1.0, float(z.abs().max())) if z.numel() else 0.0
            tolerance = max(self.tolerance, floor)
            weights = self._weights(update=False)
            x = z
            for _ in range(self.max_iterations):
                x_next = z - self._network(x, weights)
                steps = (x_next - x).abs()
                x = x_next
                if not z.numel() or float(steps.max()) <= tolerance:
                    return x
        _check_fixed_point("Residual.inverse", "the fixed-point iteration x = z - g(x)", steps, z, tolerance)
        return x

    def _implicit(self, z: Tensor, root: Tensor) -> Tensor:
        """`root` with the implicit gradients of $x = z - g(x)$ (a fixed-point solve of the adjoint in backward)."""
        if not (torch.is_grad_enabled() and (z.requires_grad or any(p.requires_grad for p in self.parameters()))):
            return root
        x0 = root.detach().requires_grad_(True)
        g = self._network(x0, self._weights(update=False))
        x = z - g
        if x.requires_grad:
            tolerance, iterations = self.tolerance, self.max_iterations

            def adjoint(grad: Tensor) -> Tensor:
                # u = grad - J_g^T u, i.e. u = (I + J_g)^{-T} grad, by the same contraction.
                u, bound = grad, tolerance * max(1.0, float(grad.abs().max())) if grad.numel() else 0.0
                for _ in range(iterations):
                    u_next = grad - torch.autograd.grad(g, x0, u, retain_graph=True)[0]
                    steps = (u_next - u).abs()
                    u = u_next
                    if not u.numel() or float(steps.max()) <= bound:
                        return u
                what = "the adjoint iteration u = v - J^T u"
                _check_fixed_point("Residual.inverse (backward)", what, steps, grad, bound)
                return u

            x.register_hook(adjoint)
        return x

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x = self._implicit(z, self._fixed_point(z))
        _, ladj = self._residual_and_ladj(x, update=False)
        return x, -ladj

    def inverse_call(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        return self._implicit(z, self._fixed_point(z))

    def extra_repr(self) -> str:
        hidden = tuple(lin.weight.shape[0] for lin in self.linears[:-1])
        return (
            f"features={self.event_shape[0]}, hidden={hidden}, coefficient={self.coefficient}, logdet={self.logdet!r}"
        )
