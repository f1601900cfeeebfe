r"""Reverse- and forward-KL training against a target energy, with path-gradient estimators.

For a flow $x = T_\theta(z)$, $z \sim q_0$, and a target
$p \propto e^{-u}$, the reverse KL is
$E_z[\log q_\theta(T_\theta(z)) + u(T_\theta(z))] + \log Z$. Its
*path gradient* (sticking the landing) keeps only the dependence through the sample,

$$
\nabla_\theta \approx E_z\big[(\nabla_x \log q_\theta(x) + \nabla_x u(x))\big|_{x = T_\theta(z)}
\cdot \partial_\theta T_\theta(z)\big],
$$

which has zero variance when $q = p$: the surrogate `mean(-log w).detach() + t - t.detach()` with
$t = \frac1B \sum_b x_b \cdot \mathrm{sg}(g_b)$, $g = \nabla_x \log q + \nabla_x u$. Three estimators share
the loss value:

- `"fast"` (Vaitl et al. 2024, Alg. 1): $\nabla_x \log q$ carried along the sampling pass by the
  [score rules][flowkit.train.score_rules], without a second pass through the flow;
- `"standard"`: $\nabla_x \log q$ by autograd through `log_prob` at the detached sample (a second pass);
- `"reparam"`: the plain reparameterised gradient of the reverse KL.

References:
    Roeder, Wu & Duvenaud, *Sticking the landing*, NeurIPS 2017 (arXiv:1703.09194);
    Vaitl, Nicoli, Winkler & Kessel, *Gradients should stay on path*, NeurIPS 2022 (arXiv:2207.08219);
    Vaitl, Winkler, Richter & Kessel, *Fast and unified path gradient estimators for
    normalizing flows*, ICLR 2024 (arXiv:2403.15881).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from .._validation import check_tensor, outermost
from ..flows import Flow
from ..flows.base import FlowModel, require_exact_weights
from ..sampling.importance import check_target, ess, log_weights_at, log_Z
from ..targets import Target
from ..utils import value_and_gradient
from .objective import Objective
from .score_rules import forward_with_score, inverse_with_score

__all__ = ["PathGradientVI", "sample_with_score", "reverse_kl_loss", "forward_kl_loss", "ESTIMATORS"]

#: The reverse-KL gradient estimators of :class:`PathGradientVI`.
ESTIMATORS = ("fast", "standard", "reparam")


def _check_flow(flow: FlowModel, target: Target, where: str, exact: bool = True) -> None:
    """Check a flow against a target; `exact`: the estimator weights samples of an exact bijection's layers."""
    if exact:
        require_exact_weights(flow, where)
    if exact and not getattr(flow, "bijective", False):
        raise ValueError(
            f"{where}: needs a flowkit Flow with an exact density, got {type(flow).__name__}; stochastic flows "
            "have none: train them with BoltzmannGenerator (estimator='reparam')"
        )
    check_target(flow, target, where)
    if any(p.requires_grad for p in flow.base.parameters()):
        raise ValueError(
            f"{where}: the base distribution has trainable parameters, which a given latent batch z cannot "
            "train; use a fixed base (e.g. StandardNormal, or DiagNormal(..., trainable=False))"
        )


def _latent(flow: FlowModel, z: Tensor | int, where: str) -> Tensor:
    if isinstance(z, int):
        return flow.base.sample((z,))
    check_tensor(z, flow.base.event_shape, name="z", dtype=flow.base.dtype, where=where)
    return z


def sample_with_score(flow: Flow, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""Push latent points through the flow carrying the score: the fast recursion.

    From $g_0 = \nabla_z \log q_0(z)$, every layer on the sampling path maps
    $g \leftarrow (g - \nabla \log|\det J|) J^{-1}$
    ([`inverse_with_score`][flowkit.train.score_rules.inverse_with_score]).

    Returns:
        `(x, log_q, score)` of latent points `z` `(B, *latent_shape)`: samples `x = T(z)` and `log q(x)` with
        their graphs, and $\nabla_x \log q(x)$ without one.
    """
    with outermost():
        log_q0, score = value_and_gradient(flow.base.log_prob, z)
        x, ladj, score = inverse_with_score(flow.bijector, z, score)
    return x, log_q0 - ladj, score


def _path_surrogate(log_w: Tensor, point: Tensor, direction: Tensor) -> Tensor:
    """`mean(-log w)` in value, `mean_b point_b . direction_b` in gradient."""
    n = log_w.numel()
    t = (point * direction.detach()).sum() / n
    return -log_w.detach().mean() + (t - t.detach())


def reverse_kl_loss(flow: FlowModel, target: Target, z: Tensor, estimator: str = "fast") -> tuple[Tensor, Tensor]:
    """Reverse-KL loss on the latent batch `z` with the chosen gradient estimator.

    The value is `mean(u(x) + log q(x))` (the reverse KL minus `log Z`); the estimators differ in gradient.

    Returns:
        `(loss, log_w)` with the detached log weights `-u(x) - log q(x)` of the batch.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; choose one of {ESTIMATORS}")
    if estimator == "reparam" or not torch.is_grad_enabled():
        log_w = log_weights_at(flow, z, target)[1]
        return -log_w.mean(), log_w.detach()
    if estimator == "fast":
        x, log_q, score = sample_with_score(flow, z)
    else:
        with outermost():
            x = flow.bijector.inverse(z)[0]
            with torch.enable_grad():
                leaf = x.detach().requires_grad_(True)
                z_back, ladj = flow.bijector(leaf)
                log_q = flow.base.log_prob(z_back) + ladj
                (score,) = torch.autograd.grad(log_q.sum(), leaf)
    energy, force = target.energy_and_force(x.detach())
    log_w = -energy - log_q.detach()
    return _path_surrogate(log_w, x, score - force), log_w


class PathGradientVI(Objective):
    r"""Reverse KL $KL(q_\theta \| p)$ to a target energy, trained without data.

    `loss(flow, z)` takes a latent batch `z` drawn from the flow's base (an int `B` draws `B` points). The loss
    value is $\mathrm{mean}(u(x) + \log q(x)) = KL - \log Z$, for every estimator.

    Arguments:
        target: the [`Target`][flowkit.targets.Target].
        estimator: `"fast"` (recursive path gradient, Vaitl et al. 2024),
            `"standard"` (sticking-the-landing path gradient with a second pass)
            or `"reparam"` (plain reparameterised gradient).

    `metrics` gives the batch's ESS and log Z estimate; [`fit`][flowkit.train.fit] clips the gradient norm at
    `default_clip = 10` unless given another `clip`.

    Examples:
        >>> import flowkit
        >>> flow = flowkit.flows.RealNVP(2, transforms=2)
        >>> objective = flowkit.train.PathGradientVI(flowkit.targets.DoubleWell())
        >>> objective.loss(flow, flow.base.sample((64,))).backward()
    """

    needs_data = False
    default_clip = 10.0

    def __init__(self, target: Target, estimator: str = "fast") -> None:
        if estimator not in ESTIMATORS:
            raise ValueError(f"PathGradientVI: unknown estimator {estimator!r}; choose one of {ESTIMATORS}")
        if not isinstance(target, Target):
            raise ValueError(f"PathGradientVI: target must be a flowkit.targets.Target, got {type(target).__name__}")
        self.target = target
        self.estimator = estimator
        self._log_w: Tensor | None = None

    def loss(self, flow: FlowModel, batch: Tensor | int) -> Tensor:
        _check_flow(flow, self.target, "PathGradientVI")
        z = _latent(flow, batch, "PathGradientVI")
        loss, self._log_w = reverse_kl_loss(flow, self.target, z, self.estimator)
        return loss

    def metrics(self) -> dict[str, float]:
        return _weight_metrics(self._log_w)


def _weight_metrics(log_w: Tensor | None) -> dict[str, float]:
    if log_w is None or log_w.numel() < 2 or not bool(torch.isfinite(log_w).any()):
        return {}
    with warnings.catch_warnings():  # a training batch's weights are often degenerate early on
        warnings.simplefilter("ignore", RuntimeWarning)
        return {"ess": ess(log_w), "log_Z": log_Z(log_w)[0]}


def forward_kl_loss(flow: Flow, target: Target, x: Tensor) -> Tensor:
    """Negative log-likelihood of `x` in value, forward-KL path gradient in gradient."""
    with outermost():
        if not torch.is_grad_enabled():
            z, ladj = flow.bijector(x)
            return -(flow.base.log_prob(z) + ladj).mean()
        z, ladj, score_z = forward_with_score(flow.bijector, x, target.force(x))
        log_q0, base_score = value_and_gradient(flow.base.log_prob, z)
    nll = -(log_q0 + ladj.detach())
    return _path_surrogate(-nll, z, score_z - base_score)
