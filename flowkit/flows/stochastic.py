r"""Stochastic blocks for stochastic normalizing flows (SNFs).

A stochastic normalizing flow (Wu, Köhler & Noé 2020) chains deterministic
bijectors with *stochastic* blocks: a few steps of a Markov chain that targets
the interpolated energy

$$
u_\lambda(y) = (1 - \lambda)\, u_Z(y) + \lambda\, u_X(y),
$$

where $u_Z$ is the prior's energy (`base`) and $u_X$ the
target's. Such a block has no density to push forward; instead it returns the
*path-weight increment*

$$
\Delta S = \log \tilde q(y' \to y) - \log q(y \to y'),
$$

the log ratio of the backward to the forward transition density of the move `y -> y'` it just made,
in the role of a log-determinant: along the sampling path `z = y_0 -> ... -> y_T = x` (flowkit's `inverse`
direction) the importance weight of a path is

$$
\log w = -u_X(x) - \log p_Z(z) + \sum_t \Delta S_t,
$$

with $\Delta S_t = \log|\det \partial y_t/\partial y_{t-1}|$ for a bijection, and $\mathbb E[w] = Z_X$
exactly, whatever the step sizes. Run from data towards the latent (`forward`), a block returns the increment
of that direction, so that [`flowkit.flows.Flow.path_log_likelihood`][flowkit.flows.Flow.path_log_likelihood]
is the path-space maximum likelihood.

Both blocks use the same kernel in both directions, the samplers' own:
[`metropolis_transition`][flowkit.sampling.metropolis_transition] (reversible, so $\Delta S = u_\lambda(y')
- u_\lambda(y)$) and the unadjusted [`langevin_transition`][flowkit.sampling.langevin_transition], which returns
$\Delta S$. Samples are reparameterised: gradients flow through the proposals (the Metropolis accept indicator
is a constant) and through the Langevin forces, by autograd with `create_graph` while gradients are recorded.

References:
    Wu, Köhler & Noé, *Stochastic Normalizing Flows*, NeurIPS 2020 (arXiv:2002.06707).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .._config import Configurable
from .._validation import check_number, check_point, check_tensor, outermost
from ..bijectors import Bijector
from ..bijectors.base import check_composition, context_for
from ..distributions import Distribution
from ..domains import Domain, Real
from ..targets.evaluate import energy_of
from ..transitions import langevin_transition, metropolis_transition
from ..utils import aggregates_auxiliary_loss, auxiliary_loss, sum_event
from .base import FlowModel
from .flow import draw_latent, expand_context

__all__ = ["StochasticBlock", "MetropolisBlock", "LangevinBlock", "StochasticFlow"]


class StochasticBlock(Configurable, nn.Module):
    r"""Base of the stochastic blocks: a Markov kernel that targets $u_\lambda$.

    Subclasses implement `_run`, which makes `n_steps` moves from `y` and returns `(y', dS)`; the kernel is
    the same in both directions, so `forward` and `inverse` both call it.

    Arguments:
        target: the target, anything with `energy(x)` (or a flowkit Distribution).
            Its `event_shape` gives the block's event shape.
        lam: interpolation parameter $\lambda \in [0, 1]$; 0 samples the prior, 1 the target.
        n_steps: number of Markov-chain steps per pass.
        step_size: proposal scale (Metropolis) or time step (Langevin).
        base: the prior's energy (standard normal when None), anything with
            `energy(x)` or a flowkit Distribution.
    """

    _flowkit_register = False
    context_features = 0
    domain: Domain = Real()

    def __init__(self, target: Any, lam: float, n_steps: int, step_size: float, base: Any = None) -> None:
        super().__init__()
        name = type(self).__name__
        for role, model in (("target", target), ("base", base)):
            if not (hasattr(model, "energy") or isinstance(model, Distribution) or (role, model) == ("base", None)):
                raise ValueError(f"{name}: {role} must have an energy(x) method or be a flowkit Distribution, got "
                                 f"{type(model).__name__}")  # fmt: skip
        lam = check_number(lam, "lam", where=name, low=0, high=1)
        n_steps = check_number(n_steps, "n_steps", where=name, integer=True, low=1)
        step_size = check_number(step_size, "step_size", where=name, positive=True)
        base_shape, shape = getattr(base, "event_shape", None), getattr(target, "event_shape", None)
        if shape is None and base_shape is None:
            raise ValueError(f"{name}: cannot tell the event shape: give the target (or base) an event_shape attribute")
        self.event_shape = torch.Size(base_shape if shape is None else shape)
        if base_shape is not None and tuple(base_shape) != tuple(self.event_shape):
            raise ValueError(f"{name}: the base's event shape {tuple(base_shape)} differs from the target's "
                             f"{tuple(self.event_shape)}")  # fmt: skip
        self.target, self.base = target, base
        self.lam, self.n_steps, self.step_size = lam, n_steps, step_size

    def energy(self, y: Tensor) -> Tensor:
        r"""The interpolated energy $u_\lambda(y) = (1-\lambda) u_Z(y) + \lambda u_X(y)$, batch shape."""
        where = f"{type(self).__name__}.energy"
        u = y.new_zeros(y.shape[: y.dim() - self.event_dims])
        if self.lam < 1.0:
            if self.base is None:
                u_base = 0.5 * sum_event(y.square(), self.event_dims)
            else:
                u_base = energy_of(self.base, y, self.event_dims, where)
            u = u + (1.0 - self.lam) * u_base
        if self.lam > 0.0:
            u = u + self.lam * energy_of(self.target, y, self.event_dims, where)
        return u

    @property
    def latent_shape(self) -> torch.Size:
        return self.event_shape

    @property
    def event_dims(self) -> int:
        return len(self.event_shape)

    def _run(self, y: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _checked_run(self, y: Tensor, context: Tensor | None, direction: str) -> tuple[Tensor, Tensor]:
        with outermost() as check:
            if check:
                check_point(self, y, None, direction, f"{type(self).__name__}.{direction}")
            return self._run(y)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r"""Run the kernel from data towards the latent: `(y', dS)`, dS = log q̃(y'→x) - log q(x→y').

        The context, if any, is ignored: the kernel targets a fixed energy.
        """
        return self._checked_run(x, context, "forward")

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r"""Run the kernel from the latent towards data (sampling): `(y', dS)`, dS = log q̃(y'→z) - log q(z→y')."""
        return self._checked_run(z, context, "inverse")

    def extra_repr(self) -> str:
        return (
            f"event_shape={tuple(self.event_shape)}, lam={self.lam}, n_steps={self.n_steps}, step_size={self.step_size}"
        )


class MetropolisBlock(StochasticBlock):
    r"""Random-walk Metropolis steps on $u_\lambda$, with exact path weights.

    Each step is a [`metropolis_transition`][flowkit.sampling.metropolis_transition]: it proposes
    $y^* = y + \sigma\xi$, $\xi \sim \mathcal N(0, I)$, and accepts with probability
    $\min(1, e^{u_\lambda(y) - u_\lambda(y^*)})$. By detailed balance the path-weight increment of a block is
    $\Delta S = u_\lambda(y_{\text{end}}) - u_\lambda(y_{\text{start}})$ in either direction; when $u_Z = u_X$
    these telescope and all path weights are equal. The accept indicator is a constant in the gradient.

    Arguments:
        target: the target, anything with `energy(x)` and `event_shape` (or a flowkit Distribution).
        lam: interpolation parameter $\lambda \in [0, 1]$ of this block.
        n_steps: number of Metropolis steps per pass.
        step_size: standard deviation $\sigma$ of the Gaussian proposal.
        base: the prior's energy (standard normal when None).

    References:
        Wu, Köhler & Noé, *Stochastic Normalizing Flows*, NeurIPS 2020 (arXiv:2002.06707), section 3.
    """

    def __init__(self, target: Any, lam: float, n_steps: int = 10, step_size: float = 0.25, base: Any = None) -> None:
        super().__init__(target, lam, n_steps, step_size, base)

    def _run(self, y: Tensor) -> tuple[Tensor, Tensor]:
        u = u_start = self.energy(y)
        for _ in range(self.n_steps):
            y, u, _ = metropolis_transition(self.energy, y, u, self.step_size, self.domain)
        return y, u - u_start


class LangevinBlock(StochasticBlock):
    r"""Overdamped (unadjusted) Langevin steps on $u_\lambda$, with exact path weights.

    Each step is an unadjusted [`langevin_transition`][flowkit.sampling.langevin_transition],
    $y' = y - \epsilon \nabla u_\lambda(y) + \sqrt{2\epsilon}\,\eta$, and adds
    $\Delta S = \tfrac12 (|\eta|^2 - |\tilde\eta|^2)$ with the noise $\tilde\eta$ of the move back. No
    Metropolis correction is needed: the path weights make the estimates exact for any step size. Forces
    come from autograd, with `create_graph` while gradients are recorded (training differentiates through
    the steps, double backward).

    Arguments:
        target: the target, anything with `energy(x)` and `event_shape` (or a flowkit Distribution).
        lam: interpolation parameter $\lambda \in [0, 1]$ of this block.
        n_steps: number of Langevin steps per pass.
        step_size: time step $\epsilon$.
        base: the prior's energy (standard normal when None).

    References:
        Wu, Köhler & Noé, *Stochastic Normalizing Flows*, NeurIPS 2020 (arXiv:2002.06707), section 3.
    """

    def __init__(self, target: Any, lam: float, n_steps: int = 10, step_size: float = 0.01, base: Any = None) -> None:
        super().__init__(target, lam, n_steps, step_size, base)

    def potential(self, y: Tensor) -> tuple[Tensor, Tensor]:
        r"""$(u_\lambda(y), \nabla u_\lambda(y))$ by autograd; differentiable when gradients are being recorded."""
        differentiable = torch.is_grad_enabled() and y.requires_grad
        with torch.enable_grad():
            y_in = y if y.requires_grad else y.detach().requires_grad_(True)
            u = self.energy(y_in)
            (gradient,) = torch.autograd.grad(u.sum(), y_in, create_graph=differentiable)
        return (u, gradient) if differentiable else (u.detach(), gradient.detach())

    def energy_gradient(self, y: Tensor) -> Tensor:
        r"""$\nabla u_\lambda(y)$ by autograd; differentiable when gradients are being recorded."""
        return self.potential(y)[1]

    def _run(self, y: Tensor) -> tuple[Tensor, Tensor]:
        u, gradient = self.potential(y)
        d_s = y.new_zeros(y.shape[: y.dim() - self.event_dims])
        for _ in range(self.n_steps):
            y, u, gradient, _, _, step = langevin_transition(
                self.potential, y, u, gradient, self.step_size, adjusted=False, event_dims=self.event_dims
            )
            d_s = d_s + step
        return y, d_s


class StochasticFlow(FlowModel):
    r"""A stochastic normalizing flow: bijectors and stochastic blocks over a base distribution.

    The layers run from data (first) to latent (last), like a [`Chain`][flowkit.bijectors.Chain]; each returns
    its output and `log|det|` (a bijector) or the path-weight increment $\Delta S$ (a
    [`StochasticBlock`][flowkit.flows.stochastic.StochasticBlock]), and a path's log importance weight is
    $\log w = -u_X(x) - \log p_Z(z) + \sum_t \Delta S_t$ (module docstring). It has no tractable density:
    [`log_prob`][flowkit.flows.stochastic.StochasticFlow.log_prob] raises and says so;
    it gives path weights (through [`latent_to_data`][flowkit.flows.stochastic.StochasticFlow.latent_to_data], for
    [`sample_with_log_weights`][flowkit.sampling.importance.sample_with_log_weights]) and the path likelihood of data
    [`path_log_likelihood`][flowkit.flows.stochastic.StochasticFlow.path_log_likelihood]
    instead, which [`BoltzmannGenerator`][flowkit.train.BoltzmannGenerator] and
    [`MaximumLikelihood`][flowkit.train.MaximumLikelihood] train.

    Arguments:
        layers: bijectors and stochastic blocks, data side first.
        base: the latent distribution; its event shape must be the last layer's latent shape.

    Examples:
        >>> import torch, flowkit
        >>> from flowkit.flows import MetropolisBlock, StochasticFlow
        >>> target = flowkit.targets.DoubleWell()
        >>> layers = [flowkit.bijectors.AffineCoupling(2), MetropolisBlock(target, lam=0.5)]
        >>> flow = StochasticFlow(layers, flowkit.distributions.StandardNormal(2))
        >>> x, log_w = flowkit.sampling.sample_with_log_weights(flow, 16, target)
        >>> log_w.shape
        torch.Size([16])

    References:
        Wu, Köhler & Noé, *Stochastic Normalizing Flows*, NeurIPS 2020 (arXiv:2002.06707).
    """

    exact_log_prob = False

    def __init__(self, layers: Sequence[Bijector | StochasticBlock], base: Distribution) -> None:
        super().__init__()
        layers = list(layers)
        context_features = check_composition(layers, (Bijector, StochasticBlock), "StochasticFlow")
        if not isinstance(base, Distribution):
            raise ValueError(f"StochasticFlow: base must be a flowkit Distribution, got {type(base).__name__}")
        if tuple(base.event_shape) != tuple(layers[-1].latent_shape):
            raise ValueError(
                f"StochasticFlow: the base's event shape {tuple(base.event_shape)} differs from the last layer's "
                f"latent shape {tuple(layers[-1].latent_shape)}"
            )
        self.layers = nn.ModuleList(layers)
        self.base = base
        self._context_features = context_features
        self.register_load_state_dict_pre_hook(_rename_chain_keys)

    @property
    def event_shape(self) -> torch.Size:
        return self.layers[0].event_shape

    @property
    def context_features(self) -> int:
        return self._context_features

    @property
    def domain(self) -> Domain:
        """The set the data live in: the first layer's."""
        return self.layers[0].domain

    @property
    def latent_shape(self) -> torch.Size:
        return self.layers[-1].latent_shape

    def path_log_likelihood(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        r"""Log-likelihood of data on path space: data run backwards through the layers, one path per event.

        $$
        \log p_Z(y_0) + \sum_t \Delta S_t^{\text{back}},
        $$

        along the path from `x` to $y_0$ through the layers' `forward`. Minus its mean is, up to a constant, the
        KL divergence between the backward (data) and forward (model) path distributions: the maximum-likelihood
        loss of a stochastic normalizing flow. It is random.
        """
        with outermost() as check:
            if check:
                check_point(self, x, context, "forward", "StochasticFlow.path_log_likelihood")
            total = x.new_zeros(x.shape[: x.dim() - len(self.event_shape)])
            for layer in self.layers:
                x, second = layer(x, context_for(layer, context))
                total = total + second
            return self.base.log_prob(x) + total

    def _sampling_path(self, z: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        context = expand_context(context, z, len(self.latent_shape))
        total = z.new_zeros(z.shape[: z.dim() - len(self.latent_shape)])
        with outermost():
            for layer in reversed(self.layers):
                z, second = layer.inverse(z, context_for(layer, context))
                total = total + second
        return z, total

    def latent_to_data(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r"""The sampling path's end `x` and its path density $\log p_Z(z) - \sum_t \Delta S_t$ (see the class)."""
        check_tensor(z, self.latent_shape, name="z", where="StochasticFlow.latent_to_data")
        x, path_sum = self._sampling_path(z, context)
        return x, self.base.log_prob(z) - path_sum

    def rsample(self, shape: int | Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        """Reparameterised samples of shape `(*shape, *context_batch, *event_shape)`."""
        return self._sampling_path(draw_latent(self, shape, context, "StochasticFlow.rsample"), context)[0]

    def _no_exact_density(self, where: str) -> ValueError:
        return ValueError(
            f"StochasticFlow.{where}: a stochastic flow's marginal density would need an integral over the "
            "noise; use flowkit.sampling.sample_with_log_weights(flow, n, target) for importance weights, or "
            "path_log_likelihood(x)"
        )

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Not available: raises a ValueError that says what to use instead."""
        raise self._no_exact_density("log_prob")

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Same as [`log_prob`][flowkit.flows.stochastic.StochasticFlow.log_prob]: raises."""
        raise self._no_exact_density("forward")

    def rsample_and_log_prob(self, shape: int | Sequence[int] = (), context: Tensor | None = None) -> Any:
        """Not available: raises (no exact density)."""
        raise self._no_exact_density("rsample_and_log_prob")

    def sample_and_log_prob(self, shape: int | Sequence[int] = (), context: Tensor | None = None) -> Any:
        """Not available: raises (no exact density)."""
        raise self._no_exact_density("sample_and_log_prob")

    @aggregates_auxiliary_loss
    def auxiliary_loss(self) -> Tensor | None:
        """Regularisers of the layers (`None` when there are none)."""
        return auxiliary_loss(self.layers)


def _rename_chain_keys(module: nn.Module, state: dict[str, Tensor], prefix: str, *args: Any) -> None:
    """Rename weights saved before 2026-12, as a `Flow` over a `Chain`: `bijector.layers.i` is `layers.i`."""
    old = f"{prefix}bijector.layers."
    for key in [k for k in state if k.startswith(old)]:
        state[f"{prefix}layers.{key[len(old) :]}"] = state.pop(key)
