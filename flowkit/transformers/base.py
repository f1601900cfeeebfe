"""The elementwise transformer interface used by coupling and autoregressive layers.

A *transformer* is a monotone scalar map ``y = tau(x; theta)`` applied
elementwise, whose parameters ``theta`` are produced by a conditioner
network. Coupling and masked autoregressive layers accept any transformer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from .._config import Configurable
from ..domains import Domain, Real

__all__ = ["Transformer"]


class Transformer(Configurable, nn.Module):
    """Elementwise monotone map given parameters.

    Subclasses set :attr:`params_per_element` and implement :meth:`forward`
    and :meth:`inverse`. ``params`` has the shape of ``x`` plus a trailing
    dimension of size ``params_per_element``; both methods return the output
    and the *elementwise* ``log|dy/dx|`` (resp. ``log|dx/dy|``), with the shape of ``x``.
    A subclass may also override :meth:`forward_and_ladj_derivative` and
    :meth:`inverse_and_ladj_derivative` with closed forms, which speed up the
    fast path gradient through coupling layers.

    Attributes:
        params_per_element: number of parameters per transformed element.
        domain: where the inputs live (the real line unless stated).
    """

    _flowkit_register = False
    params_per_element: int
    domain: Domain = Real()

    def forward(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        """Return ``(tau(x), log|tau'(x)|)`` elementwise."""
        raise NotImplementedError

    def inverse(self, y: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        """Return ``(tau^{-1}(y), log|d tau^{-1}/dy|)`` elementwise."""
        raise NotImplementedError

    def forward_and_ladj_derivative(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r"""Return ``(tau(x), log|tau'(x)|, d log|tau'(x)| / dx)`` elementwise.

        The third output, the derivative of the elementwise log-derivative in
        the input, carries no graph; the first two keep theirs. Path-gradient
        rules (:meth:`~flowkit.bijectors.Coupling.inverse_with_score`) use it to
        carry a score through the transformer without evaluating its inverse.
        This default differentiates ``log|tau'|`` by autograd; transformers with
        a closed form override it.
        """
        return _with_ladj_derivative(self.forward, x, params)

    def inverse_and_ladj_derivative(self, y: Tensor, params: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r"""Return ``(tau^{-1}(y), log|d tau^{-1}/dy|, d log|d tau^{-1}/dy| / dy)`` elementwise.

        The twin of :meth:`forward_and_ladj_derivative` for the inverse map.
        """
        return _with_ladj_derivative(self.inverse, y, params)

    def identity_params(self) -> Tensor:
        """Unconstrained parameters (a vector of ``params_per_element``) that give the identity map."""
        raise NotImplementedError


def _with_ladj_derivative(map_: Callable, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Evaluate an elementwise ``map_`` and differentiate its log-derivative in ``x`` by autograd.

    Since each ``ladj[i]`` depends on ``x[i]`` only, the gradient of ``ladj.sum()``
    is the elementwise derivative. The outputs keep their graph to ``x``.
    """
    with torch.enable_grad():
        x_in = x if x.requires_grad else x.detach().requires_grad_(True)
        out, ladj = map_(x_in, params)
        derivative = None
        if ladj.requires_grad:
            (derivative,) = torch.autograd.grad(ladj.sum(), x_in, retain_graph=True, allow_unused=True)
    if derivative is None:
        derivative = torch.zeros_like(ladj)
    return out, ladj, derivative
