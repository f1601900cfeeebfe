"""Coupling layers: half of the features condition a transformer applied to the other half."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..nn import MLP
from ..transformers.affine import Affine
from ..transformers.base import Transformer
from .base import Bijector

__all__ = ["Coupling", "AffineCoupling", "broadcast_context"]


def broadcast_context(h: Tensor, context: Tensor | None) -> Tensor:
    """Concatenate ``context`` to the conditioner input ``h``, broadcasting batch dimensions."""
    if context is None:
        return h
    batch = torch.broadcast_shapes(h.shape[:-1], context.shape[:-1])
    return torch.cat([h.expand(*batch, h.shape[-1]), context.expand(*batch, context.shape[-1])], dim=-1)


def _contiguous(index: Tensor) -> bool:
    return bool((index == torch.arange(int(index[0]), int(index[0]) + len(index))).all())


class Coupling(Bijector):
    r"""Coupling layer with any elementwise transformer.

    With a binary mask ``m``, the features with ``m = 0`` pass unchanged and
    parametrise the transformer applied to the features with ``m = 1``:

    .. math:: z_{m=0} = x_{m=0}, \qquad z_{m=1} = \tau(x_{m=1}; c(x_{m=0}, \text{context})),

    so ``log|det dz/dx| = sum log|tau'|``. The conditioner ``c`` is an MLP whose
    last layer starts at zero weights and the transformer's identity
    parameters, so the layer starts as the identity.

    Arguments:
        transformer: the elementwise map (e.g. :class:`~flowkit.transformers.Affine`).
        features: number of features ``D``.
        mask: which features are transformed (1) or conditioned on (0); by
            default ``parity`` picks every other feature.
        parity: 0 transforms the even-indexed features (0, 2, ...), 1 the odd-indexed ones.
        hidden: hidden sizes of the conditioner MLP.
        context: number of context features (0 for an unconditional layer).
        activation: activation of the conditioner.

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
    ) -> None:
        super().__init__()
        if features < 2:
            raise ValueError(f"Coupling needs at least 2 features, got {features}")
        if mask is None:
            mask = [(i + parity + 1) % 2 for i in range(features)]
        mask_t = torch.as_tensor(list(mask), dtype=torch.long)
        if mask_t.shape != (features,) or not bool(((mask_t == 0) | (mask_t == 1)).all()):
            raise ValueError(f"Coupling: mask must be {features} zeros and ones, got {list(mask)}")
        if int(mask_t.sum()) in (0, features):
            raise ValueError("Coupling: mask must transform some features and keep others")
        self.event_shape = torch.Size([features])
        self.context_features = int(context)
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
        self.conditioner = MLP(len(identity) + self.context_features, len(transformed) * self._n_params, hidden, activation)
        self.conditioner.zero_last(transformer.identity_params().repeat(len(transformed)))

    def _params(self, x_id: Tensor, context: Tensor | None) -> Tensor:
        h = self.conditioner(broadcast_context(x_id, context))
        return h.unflatten(-1, (-1, self._n_params))

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
        batch = torch.broadcast_shapes(a.shape[:-1], b.shape[:-1])
        a = a.expand(*batch, a.shape[-1])
        if self._alternating:
            return torch.stack([a, b] if self._identity_first else [b, a], dim=-1).flatten(-2)
        if self._halves:
            return torch.cat([a, b] if self._identity_first else [b, a], dim=-1)
        return torch.cat([a, b], dim=-1)[..., self.unsort_idx]

    def forward(self, x, context=None):
        x_id, x_tr = self._split(x)
        params = self._params(x_id, context)
        z_tr, ladj = self.transformer(x_tr.expand(params.shape[:-1]), params)
        return self._merge(x_id, z_tr), ladj.sum(-1)

    def inverse(self, z, context=None):
        z_id, z_tr = self._split(z)
        params = self._params(z_id, context)
        x_tr, ladj = self.transformer.inverse(z_tr.expand(params.shape[:-1]), params)
        return self._merge(z_id, x_tr), ladj.sum(-1)

    def forward_with_score(self, x, score, context=None):
        return self._with_score(x, score, context, self.transformer.forward_and_ladj_derivative)

    def inverse_with_score(self, z, score, context=None):
        return self._with_score(z, score, context, self.transformer.inverse_and_ladj_derivative)

    def _with_score(self, y, score, context, there):
        r"""One coupling step with the score carried along, without a second pass.

        The Jacobian is block triangular, with the diagonal block
        :math:`\mathrm{diag}(e^{L})` on the transformed half, where
        ``out = tau(y_tr; c)``, ``c = c(y_id)`` and ``L = log|tau'|``
        elementwise. The new score :math:`s' = J^{-T}(s - \nabla_y \sum L)` is then

        .. math:: s'_{out} = w = (s_{tr} - \partial_{y_{tr}} L)\, e^{-L}, \qquad
                  s'_{id} = s_{id} - \partial_{y_{id}}\big[\textstyle\sum w \cdot out + \sum L\big]_{w\ \text{fixed}},

        the second by the implicit-function rule for ``tau^{-1}(out; c)``. The
        transformer gives :math:`\partial_{y_{tr}} L` in closed form, so the
        inverse map is never evaluated; one autograd call through the
        conditioner, whose forward pass is shared with the map itself, gives
        :math:`s'_{id}` (Vaitl et al., ICLR 2024, Alg. 1).
        """
        # The conditioning half must carry the full batch, so that its score is per element.
        batch = torch.broadcast_shapes(y.shape[:-1], score.shape[:-1], () if context is None else context.shape[:-1])
        y_id, y_tr = self._split(y.expand(*batch, y.shape[-1]))
        s_id, s_tr = self._split(score.detach().expand(*batch, score.shape[-1]))
        with torch.enable_grad():
            cond = y_id if y_id.requires_grad else y_id.detach().requires_grad_(True)
            params = self._params(cond, context)
            out_tr, ladj, dladj = there(y_tr.expand(params.shape[:-1]), params)
            w = (s_tr - dladj) * torch.exp(-ladj.detach())
            ones = ladj.new_ones(()).expand_as(ladj)
            (g_cond,) = torch.autograd.grad((out_tr, ladj), cond, (w, ones), retain_graph=True)
        return self._merge(y_id, out_tr), ladj.sum(-1), self._merge(s_id - g_cond, w)


class AffineCoupling(Coupling):
    """RealNVP affine coupling: :class:`Coupling` with an :class:`~flowkit.transformers.Affine` transformer.

    Arguments:
        features: number of features ``D``.
        mask: transformed (1) / conditioning (0) features; alternating by default.
        parity: which alternating mask to use when ``mask`` is None.
        hidden: hidden sizes of the conditioner MLP.
        context: number of context features.
        activation: activation of the conditioner.
        clamp: soft bound on the log-scale (see :class:`~flowkit.transformers.Affine`).
    """

    def __init__(
        self,
        features: int,
        mask: Sequence[int] | None = None,
        parity: int = 0,
        hidden: Sequence[int] = (64, 64),
        context: int = 0,
        activation: str = "relu",
        clamp: float = 5.0,
    ) -> None:
        super().__init__(Affine(clamp), features, mask, parity, hidden, context, activation)
