r"""Stochastic blocks for stochastic normalizing flows (SNFs).

A stochastic normalizing flow (Wu, Köhler & Noé 2020) chains deterministic
bijectors with *stochastic* blocks: a few steps of a Markov chain that targets
the interpolated energy

.. math:: u_\lambda(y) = (1 - \lambda)\, u_Z(y) + \lambda\, u_X(y),

where :math:`u_Z` is the prior's energy (``base``) and :math:`u_X` the
target's. Such a block has no density to push forward; instead it returns the
*path-weight increment*

.. math:: \Delta S = \log \tilde q(y' \to y) - \log q(y \to y'),

the log ratio of the backward to the forward transition density of the move
``y -> y'`` it just made. :math:`\Delta S` plays the role of a
log-determinant: along the sampling path ``z = y_0 -> ... -> y_T = x``
(flowkit's ``inverse`` direction) the importance weight of a path is

.. math:: \log w = -u_X(x) - \log p_Z(z) + \sum_t \Delta S_t,

with :math:`\Delta S_t = \log|\det \partial y_t/\partial y_{t-1}|` for a
bijection, and :math:`\mathbb E[w] = Z_X` exactly, whatever the step sizes.
Run from data towards the latent (``forward``), a block makes the same kind of
moves and returns the increment of that direction, so that
:meth:`flowkit.flows.Flow.path_log_likelihood` is the path-space maximum
likelihood.

Both blocks use the same kernel in both directions: Metropolis kernels are
reversible with respect to :math:`u_\lambda`, so :math:`\Delta S = u_\lambda(y')
- u_\lambda(y)` by detailed balance; for overdamped Langevin the backward kernel
is a Langevin step from ``y'`` and :math:`\Delta S = \tfrac12(|\eta|^2 -
|\tilde\eta|^2)` with the forward and the reconstructed backward noise.

Samples are reparameterised: gradients flow through the proposals (the
Metropolis accept indicator is a constant) and through the Langevin forces,
computed by autograd with ``create_graph`` while gradients are being recorded.

References:
    Wu, Köhler & Noé, *Stochastic Normalizing Flows*, NeurIPS 2020 (arXiv:2002.06707).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .bijectors import Bijector
from .distributions import Distribution
from .utils import sum_event

__all__ = ["StochasticBlock", "MetropolisBlock", "LangevinBlock", "energy_of"]


def energy_of(model: Any, x: Tensor, event_dims: int, where: str = "energy") -> Tensor:
    """Energy (negative unnormalised log density) of ``x`` under ``model``, with the batch shape.

    ``model`` is anything with an ``energy(x)`` method (a flowkit target), or a
    flowkit :class:`~flowkit.distributions.Distribution`, whose energy is
    ``-log_prob(x)``.

    Raises:
        ValueError: when the model has neither, or its energy does not have the batch shape.
    """
    if hasattr(model, "energy"):
        u = model.energy(x)
    elif isinstance(model, Distribution):
        event = tuple(model.event_shape)
        if len(event) != event_dims or tuple(x.shape[x.dim() - event_dims :]) != event:
            raise ValueError(
                f"{where}: {type(model).__name__} has event shape {event} but the points have shape {tuple(x.shape)}"
            )
        u = -model.log_prob(x)
    else:
        raise ValueError(f"{where}: {type(model).__name__} has no energy(x) method and is not a flowkit Distribution")
    batch = x.shape[: x.dim() - event_dims]
    if not isinstance(u, Tensor) or tuple(u.shape) != tuple(batch):
        shape = tuple(u.shape) if isinstance(u, Tensor) else type(u).__name__
        raise ValueError(
            f"{where}: {type(model).__name__}.energy returned {shape} for inputs of shape {tuple(x.shape)}; "
            f"expected one energy per event, of shape {tuple(batch)}"
        )
    return u


class StochasticBlock(Bijector):
    r"""Base of the stochastic blocks: a Markov kernel that targets :math:`u_\lambda`.

    Subclasses implement :meth:`_run`, which makes ``n_steps`` moves from
    ``y`` and returns ``(y', dS)``. The kernel is the same in both directions,
    so ``forward`` and ``inverse`` both call it.

    Arguments:
        target: the target, anything with ``energy(x)`` (or a flowkit Distribution).
            Its ``event_shape`` gives the block's event shape.
        lam: interpolation parameter :math:`\lambda \in [0, 1]`; 0 samples the prior, 1 the target.
        n_steps: number of Markov-chain steps per pass.
        step_size: proposal scale (Metropolis) or time step (Langevin).
        base: the prior's energy (standard normal when None), anything with
            ``energy(x)`` or a flowkit Distribution.
    """

    _flowkit_register = False
    stochastic = True

    def __init__(self, target: Any, lam: float, n_steps: int, step_size: float, base: Any = None) -> None:
        super().__init__()
        name = type(self).__name__
        if not (hasattr(target, "energy") or isinstance(target, Distribution)):
            raise ValueError(f"{name}: target must have an energy(x) method, got {type(target).__name__}")
        if base is not None and not (hasattr(base, "energy") or isinstance(base, Distribution)):
            raise ValueError(f"{name}: base must have an energy(x) method or be a flowkit Distribution, got {type(base).__name__}")
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0.0 <= float(lam) <= 1.0:
            raise ValueError(f"{name}: lam must be a number in [0, 1], got {lam!r}")
        if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
            raise ValueError(f"{name}: n_steps must be a positive integer, got {n_steps!r}")
        if isinstance(step_size, bool) or not isinstance(step_size, (int, float)) or not float(step_size) > 0 or not math.isfinite(step_size):
            raise ValueError(f"{name}: step_size must be a positive finite number, got {step_size!r}")
        shape = getattr(target, "event_shape", None)
        if shape is None and base is not None:
            shape = getattr(base, "event_shape", None)
        if shape is None:
            raise ValueError(f"{name}: cannot tell the event shape: give the target (or base) an event_shape attribute")
        self.event_shape = torch.Size(shape)
        base_shape = getattr(base, "event_shape", None)
        if base_shape is not None and tuple(base_shape) != tuple(self.event_shape):
            raise ValueError(
                f"{name}: the base's event shape {tuple(base_shape)} differs from the target's {tuple(self.event_shape)}"
            )
        self.target = target
        self.base = base
        self.lam = float(lam)
        self.n_steps = n_steps
        self.step_size = float(step_size)

    def energy(self, y: Tensor) -> Tensor:
        r"""The interpolated energy :math:`u_\lambda(y) = (1-\lambda) u_Z(y) + \lambda u_X(y)`, batch shape."""
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

    def _batch_view(self, t: Tensor) -> Tensor:
        """Reshape a batch-shaped tensor so that it broadcasts against events."""
        return t.reshape(*t.shape, *([1] * self.event_dims))

    def _run(self, y: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r"""Run the kernel from data towards the latent: ``(y', dS)``, dS = log q̃(y'→x) - log q(x→y')."""
        return self._run(x)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r"""Run the kernel from the latent towards data (sampling): ``(y', dS)``, dS = log q̃(y'→z) - log q(z→y')."""
        return self._run(z)

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}, lam={self.lam}, n_steps={self.n_steps}, step_size={self.step_size}"


class MetropolisBlock(StochasticBlock):
    r"""Random-walk Metropolis steps on :math:`u_\lambda`, with exact path weights.

    Each step proposes :math:`y^* = y + \sigma\xi`, :math:`\xi \sim \mathcal N(0, I)`,
    and accepts with probability :math:`\min(1, e^{-(u_\lambda(y^*) - u_\lambda(y))})`.
    The kernel satisfies detailed balance with respect to :math:`e^{-u_\lambda}`,
    so the path-weight increment of a block is

    .. math:: \Delta S = u_\lambda(y_{\text{end}}) - u_\lambda(y_{\text{start}})

    in either direction (with the same :math:`\lambda` for both states). When
    :math:`u_Z = u_X` these increments telescope and all path weights are equal.
    The accept indicator is treated as a constant in the gradient.

    Arguments:
        target: the target, anything with ``energy(x)`` and ``event_shape`` (or a flowkit Distribution).
        lam: interpolation parameter :math:`\lambda \in [0, 1]` of this block.
        n_steps: number of Metropolis steps per pass.
        step_size: standard deviation :math:`\sigma` of the Gaussian proposal.
        base: the prior's energy (standard normal when None).

    References:
        Wu, Köhler & Noé, *Stochastic Normalizing Flows*, NeurIPS 2020 (arXiv:2002.06707), section 3.
    """

    def __init__(self, target: Any, lam: float, n_steps: int = 10, step_size: float = 0.25, base: Any = None) -> None:
        super().__init__(target, lam, n_steps, step_size, base)

    def _run(self, y: Tensor) -> tuple[Tensor, Tensor]:
        u = u_start = self.energy(y)
        for _ in range(self.n_steps):
            proposal = y + self.step_size * torch.randn_like(y)
            u_proposal = self.energy(proposal)
            log_uniform = torch.rand_like(u).log()
            accept = log_uniform < (u - u_proposal).detach()
            y = torch.where(self._batch_view(accept), proposal, y)
            u = torch.where(accept, u_proposal, u)
        return y, u - u_start


class LangevinBlock(StochasticBlock):
    r"""Overdamped (unadjusted) Langevin steps on :math:`u_\lambda`, with exact path weights.

    Each step moves

    .. math:: y' = y - \epsilon \nabla u_\lambda(y) + \sqrt{2\epsilon}\,\eta, \qquad \eta \sim \mathcal N(0, I),

    and the backward move from :math:`y'` would need the noise
    :math:`\tilde\eta = (y - y' + \epsilon\nabla u_\lambda(y'))/\sqrt{2\epsilon}`,
    so each step adds

    .. math:: \Delta S = \tfrac12 \left(|\eta|^2 - |\tilde\eta|^2\right).

    No Metropolis correction is needed: the path weights make the estimates
    exact for any step size. Forces come from autograd on the energy, with
    ``create_graph`` while gradients are recorded, so that training
    differentiates through the steps (double backward).

    Arguments:
        target: the target, anything with ``energy(x)`` and ``event_shape`` (or a flowkit Distribution).
        lam: interpolation parameter :math:`\lambda \in [0, 1]` of this block.
        n_steps: number of Langevin steps per pass.
        step_size: time step :math:`\epsilon`.
        base: the prior's energy (standard normal when None).

    References:
        Wu, Köhler & Noé, *Stochastic Normalizing Flows*, NeurIPS 2020 (arXiv:2002.06707), section 3.
    """

    def __init__(self, target: Any, lam: float, n_steps: int = 10, step_size: float = 0.01, base: Any = None) -> None:
        super().__init__(target, lam, n_steps, step_size, base)

    def energy_gradient(self, y: Tensor) -> Tensor:
        r""":math:`\nabla u_\lambda(y)` by autograd; differentiable when gradients are being recorded."""
        differentiable = torch.is_grad_enabled() and y.requires_grad
        with torch.enable_grad():
            y_in = y if y.requires_grad else y.detach().requires_grad_(True)
            (gradient,) = torch.autograd.grad(self.energy(y_in).sum(), y_in, create_graph=differentiable)
        return gradient if differentiable else gradient.detach()

    def _run(self, y: Tensor) -> tuple[Tensor, Tensor]:
        eps = self.step_size
        noise_scale = math.sqrt(2.0 * eps)
        d_s = y.new_zeros(y.shape[: y.dim() - self.event_dims])
        gradient = self.energy_gradient(y)
        for _ in range(self.n_steps):
            eta = torch.randn_like(y)
            y_new = y - eps * gradient + noise_scale * eta
            gradient_new = self.energy_gradient(y_new)
            eta_back = (y - y_new + eps * gradient_new) / noise_scale
            d_s = d_s + 0.5 * sum_event(eta.square() - eta_back.square(), self.event_dims)
            y, gradient = y_new, gradient_new
        return y, d_s
