r"""Bijectors on images `(C, H, W)`: squeeze, invertible 1x1 convolution, factoring out, and EIW's shuffle.

The pieces of multiscale flows (RealNVP, Glow, EIW-Flow): a level squeezes space into channels, runs
flow steps, and factors half of the channels out into the latent; [`FactorOut`][flowkit.bijectors.FactorOut]
keeps them in place, so the flow has one latent of the data's shape and an exact `log_prob`. The presets
are [`Glow`][flowkit.flows.Glow] and [`EIW`][flowkit.flows.EIW].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .._validation import check_number
from ..utils import as_shape
from .base import Bijector
from .linear import LULinear
from .permutations import _check_permutation

__all__ = ["Squeeze", "Conv1x1", "FactorOut", "EIWShuffle", "image_shape"]


def image_shape(event_shape: Sequence[int], where: str) -> tuple[int, int, int]:
    """`event_shape` as `(C, H, W)` of positive integers, or a `ValueError` naming `where`."""
    shape = tuple(as_shape(event_shape))
    if len(shape) != 3 or any(n < 1 for n in shape):
        raise ValueError(f"{where}: event_shape must be (C, H, W) with positive sizes, got {shape}")
    return shape  # type: ignore[return-value]


def _batch(x: Tensor) -> torch.Size:
    return x.shape[:-3]


class Squeeze(Bijector):
    r"""Space to channels: each `f x f` block of pixels becomes `f^2` channels, `(C, H, W) -> (C f^2, H/f, W/f)`.

    Output channel $c f^2 + i f + j$ at $(h, w)$ is input channel $c$ at $(h f + i, w f + j)$ (Glow's order). A
    permutation of the elements: `log|det| = 0`.

    Arguments:
        event_shape: `(C, H, W)`, with `H` and `W` divisible by `factor`.
        factor: the block size `f`.

    References:
        Dinh, Sohl-Dickstein & Bengio, *Density estimation using Real NVP*, ICLR 2017 (arXiv:1605.08803).
    """

    ladj_is_constant = True

    def __init__(self, event_shape: Sequence[int], factor: int = 2) -> None:
        super().__init__()
        c, h, w = image_shape(event_shape, "Squeeze")
        self.factor = check_number(factor, "factor", where="Squeeze", integer=True, low=1)
        if h % self.factor or w % self.factor:
            raise ValueError(f"Squeeze: height and width must be divisible by {self.factor}, got {(c, h, w)}")
        self.event_shape = torch.Size((c, h, w))
        self.latent_shape = (c * self.factor**2, h // self.factor, w // self.factor)

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        (c, h, w), f = self.event_shape, self.factor
        y = x.reshape(-1, c, h // f, f, w // f, f).permute(0, 1, 3, 5, 2, 4)
        return y.reshape(*_batch(x), *self.latent_shape)

    def inverse_call(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        (c, h, w), f = self.event_shape, self.factor
        y = z.reshape(-1, c, f, f, h // f, w // f).permute(0, 1, 4, 2, 5, 3)
        return y.reshape(*_batch(z), c, h, w)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.call(x), x.new_zeros(_batch(x))

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.inverse_call(z), z.new_zeros(_batch(z))

    def extra_repr(self) -> str:
        return f"{tuple(self.event_shape)} -> {tuple(self.latent_shape)}"


class Conv1x1(Bijector):
    r"""Invertible 1x1 convolution: the same `C x C` matrix applied to the channels of every pixel.

    $z_{:, h, w} = W x_{:, h, w}$ with $W = P L U$ LU-factorised as in [`LULinear`][flowkit.bijectors.LULinear] ($P$ a
    fixed signed permutation, $L$ unit lower triangular, $U$ upper triangular with diagonal $e^{s}$), so

    $$\log|\det \partial z / \partial x| = H W \sum_c s_c,$$

    which costs $O(C)$ and does not depend on `x`. `W` starts as a random orthogonal matrix (that of
    `LULinear`); the inverse applies $W^{-1}$, formed from two triangular solves.

    Arguments:
        event_shape: `(C, H, W)`.

    Examples:
        >>> import torch
        >>> layer = Conv1x1((3, 4, 4))
        >>> x = torch.randn(2, 3, 4, 4)
        >>> z, ladj = layer(x)
        >>> torch.allclose(z, torch.einsum("oc,bchw->bohw", layer.weight, x), atol=1e-6)
        True

    References:
        Kingma & Dhariwal, *Glow: Generative Flow with Invertible 1x1 Convolutions*, NeurIPS 2018
        (arXiv:1807.03039).
    """

    ladj_is_constant = True

    def __init__(self, event_shape: Sequence[int]) -> None:
        super().__init__()
        self.event_shape = torch.Size(image_shape(event_shape, "Conv1x1"))
        self.linear = LULinear(self.event_shape[0], bias=False)
        self._pixels = self.event_shape[1] * self.event_shape[2]

    @property
    def weight(self) -> Tensor:
        """The `C x C` matrix `W = P L U`."""
        return self.linear.weight

    def inverse_weight(self) -> Tensor:
        r"""$W^{-1} = U^{-1} L^{-1} P^T$."""
        lower, upper = self.linear._factors()
        eye = torch.eye(len(lower), dtype=lower.dtype, device=lower.device)
        inv_lower = torch.linalg.solve_triangular(lower, eye, upper=False, unitriangular=True)
        return torch.linalg.solve_triangular(upper, inv_lower, upper=True) @ self.linear.permutation.T

    def log_abs_det(self) -> Tensor:
        """`H W sum_c s_c` (a scalar)."""
        return self._pixels * self.linear.log_abs_det()

    def _conv(self, x: Tensor, weight: Tensor) -> Tensor:
        # A matrix product over the channel axis (cheaper than a 1 x 1 convolution call for few channels).
        c, h, w = self.event_shape
        return torch.matmul(weight, x.reshape(-1, c, h * w)).reshape(x.shape)

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        return self._conv(x, self.weight)

    def inverse_call(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        return self._conv(z, self.inverse_weight())

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.call(x), self.log_abs_det().expand(_batch(x))

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.inverse_call(z), (-self.log_abs_det()).expand(_batch(z))


class FactorOut(Bijector):
    r"""Factor channels out of a multiscale flow: `inner` transforms the first channels, the rest go to the latent.

    For $x = (x_1, x_2)$ split along the channels, with $x_1$ the first `inner.event_shape[0]` channels,

    $$z = (g(x_1), x_2), \qquad \log|\det \partial z / \partial x| = \log|\det \partial g / \partial x_1|,$$

    so $x_2$ is scored by the base directly and $x_1$ continues through the next levels `g` (with the context, if any).
    `inner` must return latents of its input's shape (end a level that squeezes with `Invert(Squeeze(...))`).

    Arguments:
        inner: the rest of the flow, on `(C_1, H, W)` with `C_1 < C`.
        channels: the number of channels `C` of the input.

    References:
        Dinh, Sohl-Dickstein & Bengio, *Density estimation using Real NVP*, ICLR 2017 (arXiv:1605.08803),
        section 3.6 (multi-scale architecture).
    """

    def __init__(self, inner: Bijector, channels: int) -> None:
        super().__init__()
        if not isinstance(inner, Bijector):
            raise ValueError(f"FactorOut: inner must be a flowkit Bijector, got {type(inner).__name__}")
        kept, h, w = image_shape(inner.event_shape, "FactorOut (inner)")
        channels = check_number(channels, "channels", where="FactorOut", integer=True, low=kept + 1)
        if tuple(inner.latent_shape) != tuple(inner.event_shape):
            raise ValueError(
                f"FactorOut: inner maps {tuple(inner.event_shape)} to {tuple(inner.latent_shape)}; it must keep the "
                "shape (end a squeezing level with Invert(Squeeze(...)))"
            )
        self.inner = inner
        self.kept = kept
        self.event_shape = torch.Size((channels, h, w))
        self.context_features = inner.context_features
        self.ladj_is_constant = inner.ladj_is_constant

    def _halves(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x[..., : self.kept, :, :], x[..., self.kept :, :, :]

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x1, x2 = self._halves(x)
        z1, ladj = self.inner(x1, context)
        return torch.cat([z1, x2], dim=-3), ladj

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        z1, z2 = self._halves(z)
        x1, ladj = self.inner.inverse(z1, context)
        return torch.cat([x1, z2], dim=-3), ladj

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        x1, x2 = self._halves(x)
        return torch.cat([self.inner.call(x1, context), x2], dim=-3)

    def inverse_call(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        z1, z2 = self._halves(z)
        return torch.cat([self.inner.inverse_call(z1, context), z2], dim=-3)

    def extra_repr(self) -> str:
        return f"channels={self.event_shape[0]}, kept={self.kept}"


class EIWShuffle(Bijector):
    r"""EIW-Flow's channel Shuffle before a multiscale split, *as in the reference code*.

    A learned but *input-independent* permutation of the channels: the paper calls it feature-dependent,
    but in the reference code (`studying910/EIW-Flow`, `InvertibleTransition` and `SENet.py`) the map does
    not depend on the input, and this layer reproduces the code:

    1. global weights $w = \operatorname{softmax}(\mathrm{MLP}(C))$, an MLP (`Linear(1, C/2, no bias)`, ReLU,
       `Linear(C/2, C)`) applied to the constant channel count $C$;
    2. $\pi = \operatorname{argsort}(w)$ in descending order, and $z_{c} = x_{\pi_c}$: `log|det| = 0` for every input;
    3. a squeeze-excitation head on the permuted input gives per-sample weights
       $\hat w(x) = \operatorname{softmax}(\mathrm{FC}(\mathrm{ReLU}(\mathrm{FC}(\operatorname{avgpool}(z)))))$ (hidden
       width $C / r$);
    4. the regulariser $\lambda\, \mathbb{E}_x \mathrm{KL}(\hat w(x) \,\|\, w_\pi)$, with $w_\pi$ the global weights in
       the permuted order, is returned by [`auxiliary_loss`][flowkit.bijectors.EIWShuffle.auxiliary_loss], which the fit
       loop adds to the objective. This is a proper KL divergence of log-probabilities (the reference passes
       probabilities to `KLDivLoss`, which is not a KL).

    The sort is not differentiable: $w$ learns only through the regulariser (which Adam rescales, so
    $\lambda$ does not slow it), and once two weights come close $\pi$ flips back and forth (32 times in
    150 steps of an `EIW` on Fashion-MNIST). $\pi$ is a saved buffer, refreshed from
    $\operatorname{argsort}(w)$ at each forward call in training mode and used as it is otherwise.

    Arguments:
        event_shape: `(C, H, W)`.
        reduction: the SE head's reduction ratio $r$ (hidden width `max(1, C // r)`).
        weight: the regulariser's weight $\lambda$ (the reference's `--sigma`, 1e-3, added to a loss in
            bits/dim; flowkit's is in nats per image, so the same $\lambda$ weighs less).

    References:
        Chen, Du, Li, Zeng & Paisley, *EIW-Flow*, Pattern Recognition (2025), arXiv:2407.04958;
        reference code `studying910/EIW-Flow` (`DIW-Flow/experiments/image/model`).
    """

    ladj_is_constant = True

    def __init__(self, event_shape: Sequence[int], reduction: int = 16, weight: float = 1e-3) -> None:
        super().__init__()
        c, h, w = image_shape(event_shape, "EIWShuffle")
        if c < 2:
            raise ValueError(f"EIWShuffle: needs at least 2 channels to shuffle, got event_shape {(c, h, w)}")
        self.reduction = check_number(reduction, "reduction", where="EIWShuffle", integer=True, low=1)
        self.weight = check_number(weight, "weight", where="EIWShuffle", low=0)
        self.event_shape = torch.Size((c, h, w))
        width = max(1, c // 2)
        self.generator = nn.Sequential(nn.Linear(1, width, bias=False), nn.ReLU(), nn.Linear(width, c))
        squeeze = max(1, c // self.reduction)
        self.excitation = nn.Sequential(nn.Linear(c, squeeze), nn.ReLU(), nn.Linear(squeeze, c))
        self.register_buffer("perm", torch.zeros(c, dtype=torch.long))
        self._regularizer: Tensor | None = None
        self._refresh()

    def log_global_weights(self) -> Tensor:
        r"""$\log w$ in the original channel order, shape `(C,)`."""
        anchor = self.generator[0].weight
        count = torch.full((1, 1), float(self.event_shape[0]), dtype=anchor.dtype, device=anchor.device)
        return torch.log_softmax(self.generator(count)[0], dim=-1)

    def global_weights(self) -> Tensor:
        """The global channel weights `w` (they sum to 1), shape `(C,)`."""
        return self.log_global_weights().exp()

    def log_sample_weights(self, z: Tensor) -> Tensor:
        r"""$\log \hat w(x)$ of the squeeze-excitation head, from *permuted* images `z`; shape `(..., C)`."""
        return torch.log_softmax(self.excitation(z.mean(dim=(-2, -1))), dim=-1)

    def divergence(self, z: Tensor) -> Tensor:
        r"""$\mathrm{KL}(\hat w(x) \,\|\, w_\pi) \ge 0$ per image, from permuted images `z`; shape `z.shape[:-3]`."""
        log_hat = self.log_sample_weights(z)
        log_w = self.log_global_weights()[self.perm]
        return (log_hat.exp() * (log_hat - log_w)).sum(-1)

    @torch.no_grad()
    def _refresh(self) -> None:
        # Sorting log-weights: weights that underflow to 0 would tie.
        self.perm.copy_(torch.argsort(self.log_global_weights(), descending=True, stable=True))

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        perm = state_dict.get(prefix + "perm")
        if isinstance(perm, Tensor) and not perm.is_meta and perm.shape == self.perm.shape:
            _check_permutation(perm, len(self.perm), "EIWShuffle (channels)")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        # The regulariser of the last batch is part of that batch's graph: copies and pickles leave it out.
        return {**self.__dict__, "_regularizer": None}

    def train(self, mode: bool = True) -> EIWShuffle:
        if not mode:
            self._regularizer = None  # frees the graph of the last training batch
        return super().train(mode)

    def call(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        if self.training:
            self._refresh()
        z = x[..., self.perm, :, :]
        if self.training and torch.is_grad_enabled():
            self._regularizer = self.weight * self.divergence(z).mean()
        return z

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.call(x), x.new_zeros(_batch(x))

    def inverse_call(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        return z[..., torch.argsort(self.perm), :, :]

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.inverse_call(z), z.new_zeros(_batch(z))

    def auxiliary_loss(self) -> Tensor | None:
        r"""$\lambda$ times the mean KL of the last forward call in training mode (with gradients), else `None`."""
        return self._regularizer

    def extra_repr(self) -> str:
        return f"event_shape={tuple(self.event_shape)}, weight={self.weight}"
