"""The elementwise transformer interface used by coupling and autoregressive layers.

A *transformer* is a monotone scalar map `y = tau(x; theta)` applied
elementwise, whose parameters `theta` are produced by a conditioner
network. Coupling and masked autoregressive layers accept any transformer.
"""

from __future__ import annotations

from torch import Tensor, nn

from .._config import Configurable
from ..domains import Domain, Real

__all__ = ["Transformer"]


class Transformer(Configurable, nn.Module):
    """Elementwise monotone map given parameters.

    Subclasses set `params_per_element` and implement [`forward`][flowkit.transformers.base.Transformer.forward]
    and [`inverse`][flowkit.transformers.base.Transformer.inverse]. `params` has the shape of `x` plus a trailing
    dimension of size `params_per_element`; both methods return the output
    and the *elementwise* `log|dy/dx|` (resp. `log|dx/dy|`), with the shape of `x`.
    Closed forms of the log-derivative's derivative, which speed up the fast
    path gradient through couplings, are registered with the path-gradient code
    ([`flowkit.train.score_rules`][flowkit.train.score_rules]), not here.

    Attributes:
        params_per_element: number of parameters per transformed element.
        domain: where the inputs live (the real line unless stated).
    """

    _flowkit_register = False
    params_per_element: int
    domain: Domain = Real()

    def forward(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        """Return `(tau(x), log|tau'(x)|)` elementwise."""
        raise NotImplementedError

    def inverse(self, y: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        """Return `(tau^{-1}(y), log|d tau^{-1}/dy|)` elementwise."""
        raise NotImplementedError

    def value(self, x: Tensor, params: Tensor) -> Tensor:
        """Return `tau(x)` alone; transformers whose log-derivative is costly override this."""
        return self.forward(x, params)[0]

    def identity_params(self) -> Tensor:
        """Unconstrained parameters (a vector of `params_per_element`) that give the identity map."""
        raise NotImplementedError
