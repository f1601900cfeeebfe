r"""Score rules: how a score is carried through each bijector, for the fast path gradient.

If $s = \nabla_x \log r(x)$ is the score of some density $r$ at $x$ and
$z = f(x)$, the score of $r$ pushed forward through $f$ is

$$
\nabla_z \log r_Z(z) = J_{f^{-1}}(z)^\top s + \nabla_z \log|\det J_{f^{-1}}(z)|,
$$

the recursion $g \leftarrow (g - \nabla \log|\det J|)\, J^{-1}$ of Vaitl et al. (2024).
[`forward_with_score`][flowkit.train.score_rules.forward_with_score] runs it along the normalizing direction,
[`inverse_with_score`][flowkit.train.score_rules.inverse_with_score] along the sampling direction; each returns
the mapped point and its log-determinant with their graphs, and the carried score without one.

The rules are looked up by the bijector's type (as `functools.singledispatch` does). Every bijector has the
generic rule (one vector-Jacobian product through the opposite direction); [`Chain`][flowkit.bijectors.Chain],
[`Invert`][flowkit.bijectors.Invert], [`Reshape`][flowkit.bijectors.Reshape], the linear layers, permutations
and couplings have closed-form ones. A faster rule is registered with
[`register_score_rule`][flowkit.train.score_rules.register_score_rule], without touching the bijector.

A coupling's rule needs, of its transformer, the output, the elementwise log-derivative $L$ and
$\partial L / \partial x$: [`forward_and_ladj_derivative`][flowkit.train.score_rules.forward_and_ladj_derivative] (and
its inverse twin), in closed form for [`Affine`][flowkit.transformers.Affine] and the splines, by autograd otherwise.

References:
    Vaitl, Winkler, Richter & Kessel, *Fast and unified path gradient estimators
    for normalizing flows*, ICLR 2024 (arXiv:2403.15881).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import singledispatch

import torch
from torch import Tensor

from .._validation import check_point, check_tensor, outermost
from ..bijectors import Chain, Coupling, Invert, Linear, LULinear, MaskedCoupling, Permutation, Reshape
from ..bijectors.base import Bijector, context_for
from ..transformers import Affine, CircularSpline, RationalQuadraticSpline, Transformer
from ..utils import broadcast_shapes

__all__ = [
    "forward_with_score",
    "inverse_with_score",
    "register_score_rule",
    "has_score_rule",
    "generic_forward_with_score",
    "generic_inverse_with_score",
    "forward_and_ladj_derivative",
    "inverse_and_ladj_derivative",
    "params_cotangent",
    "ScoreRule",
]

#: A rule ``rule(bijector, y, score, context) -> (y_out, ladj, score_out)``.
ScoreRule = Callable[[Bijector, Tensor, Tensor, "Tensor | None"], tuple[Tensor, Tensor, Tensor]]


def _pulled_score(back: Callable, y: Tensor, score: Tensor, context: Tensor | None) -> Tensor:
    """`J_back(y)^T score + grad_y ladj_back(y)` by one autograd call, without a graph on the result."""
    with torch.enable_grad():
        leaf = y.detach().requires_grad_(True)
        y_back, ladj_back = back(leaf, context)
        if score.shape != y_back.shape:
            raise ValueError(f"score has shape {tuple(score.shape)} but the point has shape {tuple(y_back.shape)}")
        (pulled,) = torch.autograd.grad((y_back * score.detach()).sum() + ladj_back.sum(), leaf)
    return pulled


def generic_forward_with_score(
    bijector: Bijector, x: Tensor, score: Tensor, context: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """The rule every bijector has: the forward map, then one vector-Jacobian product through the inverse."""
    z, ladj = bijector(x, context)
    return z, ladj, _pulled_score(bijector.inverse, z, score, context)


def generic_inverse_with_score(
    bijector: Bijector, z: Tensor, score: Tensor, context: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """The rule every bijector has: the inverse map, then one vector-Jacobian product through the forward map."""
    x, ladj = bijector.inverse(z, context)
    return x, ladj, _pulled_score(bijector.forward, x, score, context)


_forward_rule = singledispatch(generic_forward_with_score)
_inverse_rule = singledispatch(generic_inverse_with_score)


def register_score_rule(cls: type, *, forward: ScoreRule | None = None, inverse: ScoreRule | None = None) -> None:
    """Register closed-form score rules for a bijector type (and its subclasses).

    Arguments:
        cls: the bijector class.
        forward: rule along the normalizing direction, called as
            `forward(bijector, x, score, context)` and returning `(z, ladj, score_z)`.
        inverse: rule along the sampling direction, `(x, ladj, score_x)` from `(z, score)`.
    """
    if not (isinstance(cls, type) and issubclass(cls, Bijector)):
        raise ValueError(f"register_score_rule: {cls!r} is not a Bijector class")
    if forward is not None:
        _forward_rule.register(cls)(forward)
    if inverse is not None:
        _inverse_rule.register(cls)(inverse)


def has_score_rule(cls: type) -> bool:
    """Whether a bijector type has a rule of its own (in either direction) instead of the generic one."""
    return _forward_rule.dispatch(cls) is not generic_forward_with_score or (
        _inverse_rule.dispatch(cls) is not generic_inverse_with_score
    )


def _checked(bijector: Bijector, y: Tensor, score: Tensor, context: Tensor | None, direction: str, where: str) -> None:
    check_point(bijector, y, context, direction, where)
    check_tensor(score, (), name="score", dtype=y.dtype, where=where)
    event = bijector.event_shape if direction == "forward" else bijector.latent_shape
    batch = y.shape[: y.dim() - len(event)]
    if context is not None:
        batch = broadcast_shapes(batch, context.shape[:-1])
    if score.shape != (*batch, *event):
        raise ValueError(
            f"{where}: score has shape {tuple(score.shape)} but the point (broadcast with its "
            f"context) has shape {(*batch, *event)}"
        )


def forward_with_score(
    bijector: Bijector, x: Tensor, score: Tensor, context: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    r"""Map `x` to `z` and carry a score along: return `(z, ladj, score_z)`.

    If `score` is $\nabla_x \log r(x)$, then `score_z` is
    $J_{f^{-1}}(z)^\top \nabla_x \log r(x) + \nabla_z \log|\det J_{f^{-1}}(z)|$ (without a graph; `z` and
    `ladj` keep theirs). The point, the score and the context are checked.

    Examples:
        >>> import torch, flowkit
        >>> from flowkit.train.score_rules import forward_with_score
        >>> z, ladj, score_z = forward_with_score(flowkit.bijectors.LULinear(3), torch.randn(4, 3), torch.randn(4, 3))
        >>> score_z.shape
        torch.Size([4, 3])
    """
    with outermost() as check:
        if check:
            _checked(bijector, x, score, context, "forward", f"forward_with_score({type(bijector).__name__})")
        return _forward_rule(bijector, x, score, context)


def inverse_with_score(
    bijector: Bijector, z: Tensor, score: Tensor, context: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    r"""Map `z` to `x` and carry a score along: return `(x, ladj, score_x)`.

    The sampling-direction twin of [`forward_with_score`][flowkit.train.score_rules.forward_with_score]:
    $\nabla_x \log r_X(x) = J_f(x)^\top \nabla_z \log r(z) + \nabla_x \log|\det J_f(x)|$.
    """
    with outermost() as check:
        if check:
            _checked(bijector, z, score, context, "inverse", f"inverse_with_score({type(bijector).__name__})")
        return _inverse_rule(bijector, z, score, context)


# ---- containers


def _chain_forward(chain: Chain, x: Tensor, score: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    total = x.new_zeros(x.shape[: x.dim() - len(chain.event_shape)])
    for layer in chain:
        x, ladj, score = _forward_rule(layer, x, score, context_for(layer, context))
        total = total + ladj
    return x, total, score


def _chain_inverse(chain: Chain, z: Tensor, score: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    total = z.new_zeros(z.shape[: z.dim() - len(chain.latent_shape)])
    for layer in reversed(chain.layers):
        z, ladj, score = _inverse_rule(layer, z, score, context_for(layer, context))
        total = total + ladj
    return z, total, score


register_score_rule(Chain, forward=_chain_forward, inverse=_chain_inverse)
register_score_rule(
    Invert,
    forward=lambda b, x, s, c: _inverse_rule(b.bijector, x, s, c),
    inverse=lambda b, z, s, c: _forward_rule(b.bijector, z, s, c),
)


def _reshaped(map_: Callable) -> ScoreRule:
    def rule(b: Bijector, y: Tensor, score: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        out, ladj = map_(b, y, context)
        return out, ladj, score.reshape(out.shape)

    return rule


register_score_rule(
    Reshape, forward=_reshaped(lambda b, x, c: b(x, c)), inverse=_reshaped(lambda b, z, c: b.inverse(z, c))
)


# ---- volume-preserving and linear layers


register_score_rule(
    Permutation,
    forward=lambda b, x, s, c: (*b(x, c), s.detach()[..., b.perm]),
    inverse=lambda b, z, s, c: (*b.inverse(z, c), s.detach()[..., b.inverse_perm]),
)


def _linear_inverse(b: Linear | LULinear, z: Tensor, score: Tensor, context: Tensor | None):
    # x = W^{-1}(z - b), so the score maps by W^T: s_x = W^T s_z, i.e. s_z @ W for row vectors.
    x, ladj = b.inverse(z, context)
    return x, ladj, score.detach() @ b.weight.detach()


def _dense_forward(b: Linear, x: Tensor, score: Tensor, context: Tensor | None):
    z, ladj = b(x, context)
    return z, ladj, torch.linalg.solve(b.weight.detach().T, score.detach().unsqueeze(-1)).squeeze(-1)


def _lu_forward(b: LULinear, x: Tensor, score: Tensor, context: Tensor | None):
    # W^{-T} s = P L^{-T} U^{-T} s (P is a signed permutation, so P^{-T} = P).
    z, ladj = b(x, context)
    lower, upper = (f.detach() for f in b._factors())
    rhs = score.detach().reshape(-1, score.shape[-1]).T
    y = torch.linalg.solve_triangular(upper.T, rhs, upper=False)
    y = torch.linalg.solve_triangular(lower.T, y, upper=True, unitriangular=True)
    return z, ladj, (b.permutation @ y).T.reshape(score.shape)


register_score_rule(Linear, forward=_dense_forward, inverse=_linear_inverse)
register_score_rule(LULinear, forward=_lu_forward, inverse=_linear_inverse)


# ---- couplings


def _coupling_rule(derivative: Callable) -> ScoreRule:
    r"""One coupling step with the score carried along, without a second pass.

    The Jacobian is block triangular, with the diagonal block $\mathrm{diag}(e^{L})$ on the transformed
    half (`out = tau(y_tr; c(y_id))`, `L = log|tau'|`). The new score $s' = J^{-T}(s - \nabla_y \sum L)$ is

    $$
    s'_{out} = w = (s_{tr} - \partial_{y_{tr}} L)\, e^{-L}, \qquad
    s'_{id} = s_{id} - \partial_{y_{id}}\big[\textstyle\sum w \cdot out + \sum L\big]_{w\ \text{fixed}},
    $$

    the second by the implicit-function rule. The transformer gives $\partial_{y_{tr}} L$, so the inverse
    map is never evaluated; one autograd call through the conditioner gives $s'_{id}$ (Vaitl et al. 2024, Alg. 1).
    """
    direction = _DIRECTIONS[derivative]

    def rule(b: Coupling, y: Tensor, score: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        # The conditioning half must carry the full batch, so that its score is per element.
        batch = broadcast_shapes(y.shape[:-1], score.shape[:-1], () if context is None else context.shape[:-1])
        y_id, y_tr = b._split(y.expand(*batch, y.shape[-1]))
        s_id, s_tr = b._split(score.detach().expand(*batch, score.shape[-1]))
        with torch.enable_grad():
            cond = y_id if y_id.requires_grad else y_id.detach().requires_grad_(True)
            params = b._params(cond, context)
            out_tr, ladj, dladj = derivative(b.transformer, y_tr.expand(params.shape[:-1]), params)
            w = (s_tr - dladj) * torch.exp(-ladj.detach())
            g_cond = _conditioner_pullback(b.transformer, direction, params, out_tr, ladj, w, cond)
        return b._merge(y_id, out_tr), ladj.sum(-1), b._merge(s_id - g_cond, w)

    return rule


def _conditioner_pullback(
    transformer: Transformer, direction: str, params: Tensor, out: Tensor, ladj: Tensor, w: Tensor, cond: Tensor
) -> Tensor:
    """The cotangent `(w, 1)` of `(out, ladj)` pulled back to `cond` (through a closed-form `params_cotangent`)."""
    g_params = params_cotangent(transformer, direction, params.detach(), out.detach(), ladj.detach(), w)
    if g_params is None:
        ones = ladj.new_ones(()).expand_as(ladj)
        (g_cond,) = torch.autograd.grad((out, ladj), cond, (w, ones), retain_graph=True)
    else:
        (g_cond,) = torch.autograd.grad(params, cond, g_params, retain_graph=True)
    return g_cond


@singledispatch
def params_cotangent(
    transformer: Transformer, direction: str, params: Tensor, out: Tensor, ladj: Tensor, w: Tensor
) -> Tensor | None:
    r"""The cotangent of the parameters from `w` on the map's output and 1 on its log-derivative, or None.

    That is $\bar p = (\partial\,\mathrm{out}/\partial p)^\top w + (\partial \log|\tau'|/\partial p)^\top 1$
    elementwise, in closed form and without a graph, for the `direction` (`"forward"` or `"inverse"`) map
    that gave `out` and `ladj`. None (the default) leaves it to autograd; closed forms are registered per
    transformer type with `params_cotangent.register(cls)` (the affine one is).
    """
    return None


@params_cotangent.register(Affine)
def _affine_params_cotangent(t: Affine, direction: str, params: Tensor, out: Tensor, ladj: Tensor, w: Tensor) -> Tensor:
    # s = c tanh(r / c): forward out = x e^s + shift, log|tau'| = s; inverse out = (y - shift) e^-s, -s.
    if direction == "forward":
        g_shift, g_log_scale, squashed = w, torch.addcmul(torch.ones_like(w), w, out - params[..., 0]), ladj / t.clamp
    else:
        g_shift = -w * torch.exp(ladj)
        g_log_scale, squashed = torch.addcmul(torch.ones_like(w), w, out).neg_(), ladj / -t.clamp
    return torch.stack([g_shift, g_log_scale * (1 - squashed * squashed)], -1)


# ---- the transformers' log-derivative derivatives, used by the coupling rule


def _with_ladj_derivative(map_: Callable, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Evaluate an elementwise `map_` and its log-derivative's derivative in `x` (the gradient of `ladj.sum()`)."""
    with torch.enable_grad():
        x_in = x if x.requires_grad else x.detach().requires_grad_(True)
        out, ladj = map_(x_in, params)
        derivative = None
        if ladj.requires_grad:
            (derivative,) = torch.autograd.grad(ladj.sum(), x_in, retain_graph=True, allow_unused=True)
    if derivative is None:
        derivative = torch.zeros_like(ladj)
    return out, ladj, derivative


@singledispatch
def forward_and_ladj_derivative(transformer: Transformer, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""Return `(tau(x), log|tau'(x)|, d log|tau'(x)| / dx)` elementwise.

    The third output carries no graph. The default differentiates by autograd; closed forms are registered
    per transformer type with `forward_and_ladj_derivative.register(cls)`.
    """
    return _with_ladj_derivative(transformer.forward, x, params)


@singledispatch
def inverse_and_ladj_derivative(transformer: Transformer, y: Tensor, params: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""`(tau^{-1}(y), log|d tau^{-1}/dy|, d log|d tau^{-1}/dy| / dy)` elementwise (the inverse twin)."""
    return _with_ladj_derivative(transformer.inverse, y, params)


#: The direction of the map each derivative function evaluates.
_DIRECTIONS = {forward_and_ladj_derivative: "forward", inverse_and_ladj_derivative: "inverse"}


def _affine_rule(direction: str) -> Callable:
    def rule(t: Affine, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        y, ladj = getattr(t, direction)(x, params)
        return y, ladj, torch.zeros_like(ladj.detach())  # log|tau'| does not depend on x

    return rule


forward_and_ladj_derivative.register(Affine)(_affine_rule("forward"))
inverse_and_ladj_derivative.register(Affine)(_affine_rule("inverse"))
for _spline in (RationalQuadraticSpline, CircularSpline):
    forward_and_ladj_derivative.register(_spline)(lambda t, x, p: t.with_ladj_derivative(x, p))
    inverse_and_ladj_derivative.register(_spline)(lambda t, y, p: t.with_ladj_derivative(y, p, inverse=True))

register_score_rule(
    Coupling, forward=_coupling_rule(forward_and_ladj_derivative), inverse=_coupling_rule(inverse_and_ladj_derivative)
)


def _masked_coupling_rule(derivative: Callable) -> ScoreRule:
    """The coupling rule for [`MaskedCoupling`][flowkit.bijectors.MaskedCoupling]: the same algebra on masked sites."""
    direction = _DIRECTIONS[derivative]

    def rule(b: MaskedCoupling, y: Tensor, score: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        event = len(b.event_shape)
        context_batch = () if context is None else context.shape[:-1]
        batch = broadcast_shapes(y.shape[: y.dim() - event], score.shape[: score.dim() - event], context_batch)
        flat = y.expand(*batch, *b.event_shape).flatten(-event)
        s = score.detach().expand(*batch, *b.event_shape).flatten(-event)
        y_id, y_tr = flat[..., b.identity_idx], flat[..., b.transformed_idx]
        with torch.enable_grad():
            cond = y_id if y_id.requires_grad else y_id.detach().requires_grad_(True)
            grid = torch.cat([cond, torch.zeros_like(y_tr)], -1)[..., b.unsort_idx].unflatten(-1, b.event_shape)
            params = b.transformed_params(grid, context)
            out_tr, ladj, dladj = derivative(b.transformer, y_tr.expand(params.shape[:-1]), params)
            w = (s[..., b.transformed_idx] - dladj) * torch.exp(-ladj.detach())
            g_cond = _conditioner_pullback(b.transformer, direction, params, out_tr, ladj, w, cond)
        z = torch.cat([y_id, out_tr], -1)[..., b.unsort_idx].unflatten(-1, b.event_shape)
        new_score = torch.cat([s[..., b.identity_idx] - g_cond, w], -1)[..., b.unsort_idx]
        return z, ladj.sum(-1), new_score.unflatten(-1, b.event_shape)

    return rule


register_score_rule(
    MaskedCoupling,
    forward=_masked_coupling_rule(forward_and_ladj_derivative),
    inverse=_masked_coupling_rule(inverse_and_ladj_derivative),
)
