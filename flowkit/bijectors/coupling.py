"""Coupling layers: half of the features condition a transformer applied to the other half."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .._validation import check_number
from ..nn import MLP, broadcast_context, check_conditioner
from ..transformers.affine import Affine
from ..transformers.base import Transformer
from ..transformers.spline import CircularSpline, RationalQuadraticSpline
from ..utils import broadcast_shapes
from .base import Bijector

__all__ = ["Coupling", "AffineCoupling", "broadcast_context", "coupling_mask"]


def _contiguous(index: Tensor) -> bool:
    return bool((index == torch.arange(int(index[0]), int(index[0]) + len(index))).all())


def coupling_mask(features: int, mask: Sequence[int] | None = None, parity: int = 0) -> Tensor:
    """The mask of a [`Coupling`][flowkit.bijectors.Coupling] (1: transformed, 0: conditioned on), checked.

    Arguments:
        features: the number of features (at least 2).
        mask: the mask, or None for alternating features.
        parity: which half the alternating mask transforms (0: the odd features, 1: the even ones).

    Raises:
        ValueError: for a mask of the wrong length or values, or one that transforms all features or none.
    """
    features = check_number(features, "features", where="Coupling", integer=True, low=2)
    if mask is None:
        mask = [(i + parity + 1) % 2 for i in range(features)]
    mask_t = torch.as_tensor(list(mask), dtype=torch.long)
    if mask_t.shape != (features,) or not bool(((mask_t == 0) | (mask_t == 1)).all()):
        raise ValueError(f"Coupling: mask must be {features} zeros and ones, got {list(mask)}")
    if int(mask_t.sum()) in (0, features):
        raise ValueError("Coupling: mask must transform some features and keep others")
    return mask_t


class Coupling(Bijector):
    r"""Coupling layer with any elementwise transformer and any conditioner.

    With a binary mask $m$, the features with $m = 0$ pass unchanged and
    parametrise the transformer applied to the features with $m = 1$:

    $$z_{m=0} = x_{m=0}, \qquad z_{m=1} = \tau(x_{m=1}; c(x_{m=0}, \text{context})),$$

    so $\log|\det \partial z / \partial x| = \sum \log|\tau'|$. The conditioner $c$ is an
    [`MLP`][flowkit.nn.MLP] unless `conditioner` is given (any [`Conditioner`][flowkit.nn.Conditioner] from the
    kept features and the context to `n_transformed * transformer.params_per_element` numbers). Its last
    layer starts at zero weights and the transformer's identity parameters: the layer starts as the identity.

    Arguments:
        transformer: the elementwise map (e.g. [`Affine`][flowkit.transformers.Affine]).
        features: number of features `D`.
        mask: which features are transformed (1) or conditioned on (0); by default `parity` picks every other feature.
        parity: 0 transforms the even-indexed features (0, 2, ...), 1 the odd-indexed ones.
        hidden: hidden sizes of the default conditioner MLP.
        context: number of context features (0 for an unconditional layer).
        activation: activation of the default conditioner MLP.
        conditioner: the conditioner module; `hidden` and `activation` are unused when it is given.

    Examples:
        >>> import torch
        >>> from flowkit.nn import MLP
        >>> from flowkit.transformers import Affine
        >>> layer = Coupling(Affine(), 4, conditioner=MLP(2, 2 * 2, hidden=(32,), activation="tanh"))
        >>> z, ladj = layer(torch.randn(5, 4))
        >>> z.shape, ladj.shape
        (torch.Size([5, 4]), torch.Size([5]))

    References:
        Dinh, Sohl-Dickstein & Bengio, *Density estimation using Real NVP*, ICLR 2017;
        Durkan et al., *Neural Spline Flows*, NeurIPS 2019 (arXiv:1906.04032).
    """

    def __init__(
        self,
        transformer: Transformer,
        features: int,
        mask: Sequence[int] | None = None,
        parity: int = 0,
        hidden: Sequence[int] = (64, 64),
        context: int = 0,
        activation: str = "relu",
        conditioner: nn.Module | None = None,
    ) -> None:
        super().__init__()
        mask_t = coupling_mask(features, mask, parity)
        self.event_shape = torch.Size([features])
        self.context_features = check_number(context, "context", where="Coupling", integer=True, low=0)
        self.transformer = transformer
        self.domain = transformer.domain
        identity = torch.nonzero(mask_t == 0).flatten()
        transformed = torch.nonzero(mask_t == 1).flatten()
        self.register_buffer("identity_idx", identity, persistent=False)
        self.register_buffer("transformed_idx", transformed, persistent=False)
        self.register_buffer("unsort_idx", torch.argsort(torch.cat([identity, transformed])), persistent=False)
        # Masks that keep one contiguous half, or alternate on an even number of
        # features, split and merge by slicing and views, without gathers.
        self._halves = _contiguous(identity) and _contiguous(transformed)
        self._alternating = features % 2 == 0 and bool((mask_t[1:] != mask_t[:-1]).all())
        self._identity_first = bool(identity[0] < transformed[0])
        self._n_identity = len(identity)
        self._n_params = transformer.params_per_element
        n_out = len(transformed) * self._n_params
        if conditioner is None:
            conditioner = MLP(len(identity), n_out, hidden, activation, context=self.context_features)
        else:
            check_conditioner(conditioner, len(identity), n_out, self.context_features, False, "Coupling")
        self.conditioner = conditioner
        self.conditioner.zero_last(transformer.identity_params().repeat(len(transformed)))

    def _get_name(self) -> str:
        return _NAMES.get(type(self.transformer), "Coupling")

    def _params(self, x_id: Tensor, context: Tensor | None) -> Tensor:
        return self.conditioner(x_id, context).unflatten(-1, (-1, self._n_params))

    def _split(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if self._alternating:
            first, second = x[..., 0::2], x[..., 1::2]
            return (first, second) if self._identity_first else (second, first)
        if self._halves:
            n = self._n_identity if self._identity_first else x.shape[-1] - self._n_identity
            first, second = x[..., :n], x[..., n:]
            return (first, second) if self._identity_first else (second, first)
        return x[..., self.identity_idx], x[..., self.transformed_idx]

    def _merge(self, a: Tensor, b: Tensor) -> Tensor:
        batch = broadcast_shapes(a.shape[:-1], b.shape[:-1])
        a = a.expand(*batch, a.shape[-1])
        if self._alternating:
            return torch.stack([a, b] if self._identity_first else [b, a], dim=-1).flatten(-2)
        if self._halves:
            return torch.cat([a, b] if self._identity_first else [b, a], dim=-1)
        return torch.cat([a, b], dim=-1)[..., self.unsort_idx]

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x_id, x_tr = self._split(x)
        params = self._params(x_id, context)
        z_tr, ladj = self.transformer(x_tr.expand(params.shape[:-1]), params)
        return self._merge(x_id, z_tr), ladj.sum(-1)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        z_id, z_tr = self._split(z)
        params = self._params(z_id, context)
        x_tr, ladj = self.transformer.inverse(z_tr.expand(params.shape[:-1]), params)
        return self._merge(z_id, x_tr), ladj.sum(-1)


def AffineCoupling(
    features: int,
    mask: Sequence[int] | None = None,
    parity: int = 0,
    hidden: Sequence[int] = (64, 64),
    context: int = 0,
    activation: str = "relu",
    clamp: float = 5.0,
    *,
    conditioner: nn.Module | None = None,
) -> Coupling:
    """RealNVP affine coupling: a [`Coupling`][flowkit.bijectors.Coupling] with an affine transformer.

    Arguments:
        features: number of features `D`.
        mask: transformed (1) / conditioning (0) features; alternating by default.
        parity: which alternating mask to use when `mask` is None.
        hidden: hidden sizes of the default conditioner MLP.
        context: number of context features.
        activation: activation of the default conditioner MLP.
        clamp: soft bound on the log-scale (see [`Affine`][flowkit.transformers.Affine]).
        conditioner: the conditioner module (see [`Coupling`][flowkit.bijectors.Coupling]).
    """
    return Coupling(Affine(clamp), features, mask, parity, hidden, context, activation, conditioner)


#: The names coupling layers show (in reprs and error messages), by transformer type: those of their factories.
_NAMES: dict[type, str] = {
    Affine: "AffineCoupling",
    RationalQuadraticSpline: "SplineCoupling",
    CircularSpline: "CircularSplineCoupling",
}
