r"""Latent flows (SimFlow): an autoencoder whose encoder variance is fixed, trained jointly with a flow on its latents.

The encoder gives $q(z \mid x) = \mathcal N(\mu(x), \sigma^2 I)$ with $\sigma^2$ a fixed constant (SimFlow's 0.5),
the decoder $\hat x = g(z)$, and a flow models the latents. The joint loss
([`LatentFlowLoss`][flowkit.train.latent.LatentFlowLoss]) is

$$L = \mathbb E_{\varepsilon}\Big[\lVert x - g(z) \rVert^2
+ \lambda \big(\log q(z \mid x) - \log p_{\text{flow}}(z)\big)\Big], \qquad z = \mu(x) + \sigma \varepsilon,$$

a negative ELBO with the flow as the prior. With $\sigma$ fixed, $\log q(z \mid x)$ does not depend on the
parameters (its expectation is minus the constant entropy), so the loss is reconstruction minus $\lambda$ times the
flow's log-likelihood of the noisy latent: the noise is the flow's noise augmentation, and the decoder learns to
denoise. The variants the paper compares: a learned variance ($\log\sigma(x)$ from the encoder, `variance=None`),
and a frozen encoder with a post-hoc flow (train the autoencoder first, `stage="autoencoder"`, then the flow
alone on its latents, `stage="flow"`).

References:
    SimFlow, arXiv:2512.04084; Gu et al., *STARFlow*, arXiv:2506.06276.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .._config import Configurable
from .._validation import check_number
from ..bijectors.image import image_shape
from .flow import Flow
from .tarflow import TarFlow

__all__ = ["LatentFlow"]


class LatentFlow(Configurable, nn.Module):
    r"""An autoencoder with a fixed (or learned) encoder variance and a flow prior on its latents (SimFlow).

    Encoder: 3x3 convolution, SiLU, stride-2 3x3 convolution, SiLU, 1x1 convolution to the latent means (and
    log-standard deviations when the variance is learned), latents of shape `(latent_channels, H/2, W/2)`. Decoder:
    the mirror image with a transposed convolution and a sigmoid output (images in `[0, 1]`).

    Arguments:
        shape: `(C, H, W)` of the images, `H` and `W` even.
        latent_channels: channels of the latent grid.
        hidden: channels of the encoder and decoder.
        variance: the fixed encoder variance $\sigma^2$ (SimFlow: 0.5); None: learned per latent from the encoder.
        flow: the latent flow (default: a small unconditional
            [`TarFlow`][flowkit.flows.TarFlow] on the latent grid with patch 1, no logit).

    Examples:
        >>> import torch
        >>> model = LatentFlow((1, 8, 8), latent_channels=2, hidden=8)
        >>> mean, log_std = model.encode(torch.rand(3, 1, 8, 8))
        >>> mean.shape, model.sample(2).shape
        (torch.Size([3, 2, 4, 4]), torch.Size([2, 1, 8, 8]))
    """

    def __init__(
        self,
        shape: Sequence[int],
        latent_channels: int = 2,
        hidden: int = 32,
        variance: float | None = 0.5,
        flow: Flow | None = None,
    ) -> None:
        super().__init__()
        c, h, w = image_shape(shape, "LatentFlow")
        if h % 2 or w % 2:
            raise ValueError(f"LatentFlow: height and width must be even, got {(c, h, w)}")
        self.shape = (c, h, w)
        self.latent_channels = check_number(latent_channels, "latent_channels", where="LatentFlow", integer=True, low=1)
        hidden = check_number(hidden, "hidden", where="LatentFlow", integer=True, low=1)
        self.variance = None if variance is None else check_number(variance, "variance", where="LatentFlow", low=1e-8)
        self.latent_shape = (self.latent_channels, h // 2, w // 2)
        out = self.latent_channels * (2 if self.learned_variance else 1)
        self.encoder = nn.Sequential(
            nn.Conv2d(c, hidden, 3, padding=1),
            nn.SiLU(),
            nn.Conv2d(hidden, hidden, 3, stride=2, padding=1),
            nn.SiLU(),
            nn.Conv2d(hidden, out, 1),
        )
        self.decoder = nn.Sequential(
            nn.Conv2d(self.latent_channels, hidden, 3, padding=1),
            nn.SiLU(),
            nn.ConvTranspose2d(hidden, hidden, 4, stride=2, padding=1),
            nn.SiLU(),
            nn.Conv2d(hidden, c, 3, padding=1),
            nn.Sigmoid(),
        )
        if flow is None:
            flow = TarFlow(self.latent_shape, patch=1, blocks=2, width=32, layers=1, heads=2, alpha=None)
        if not isinstance(flow, Flow) or tuple(flow.event_shape) != self.latent_shape:
            raise ValueError(f"LatentFlow: flow must be a flowkit Flow on latents of shape {self.latent_shape}")
        self.flow = flow

    @property
    def learned_variance(self) -> bool:
        """Whether the encoder learns its variance."""
        return self.variance is None

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The latent means and log-standard deviations `(B, *latent_shape)` of images `x`."""
        out = self.encoder(x)
        if self.learned_variance:
            mean, log_std = out.chunk(2, dim=1)
            return mean, log_std.clamp(-7.0, 2.0)
        assert self.variance is not None
        return out, torch.full_like(out, 0.5 * math.log(self.variance))

    def decode(self, z: Tensor) -> Tensor:
        """Images in `[0, 1]` from latents."""
        return self.decoder(z)

    def noisy_latents(self, x: Tensor) -> tuple[Tensor, Tensor]:
        r"""Latents $z = \mu + \sigma\varepsilon$ of `x` and $\log q(z \mid x)$ per image."""
        mean, log_std = self.encode(x)
        eps = torch.randn_like(mean)
        z = mean + log_std.exp() * eps
        log_q = (-0.5 * eps**2 - log_std - 0.5 * math.log(2 * math.pi)).sum((1, 2, 3))
        return z, log_q

    @torch.no_grad()
    def sample(self, n: int) -> Tensor:
        """`n` images: latents from the flow, decoded."""
        return self.decode(self.flow.sample((n,)))
