r"""The losses of a latent flow ([`LatentFlow`][flowkit.flows.latent.LatentFlow], SimFlow) by training stage."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._validation import check_number
from .batches import split_batch
from .objective import Objective

__all__ = ["LatentFlowLoss"]

_STAGES = ("joint", "autoencoder", "flow")


class LatentFlowLoss(Objective):
    r"""Loss of a [`LatentFlow`][flowkit.flows.latent.LatentFlow] per image, for one of three training stages.

    With $z = \mu(x) + \sigma(x)\varepsilon$ and the squared reconstruction error $R = \lVert x - g(z) \rVert^2$:

    - `"joint"` (SimFlow): $R + \lambda(\log q(z \mid x) - \log p_{\text{flow}}(z))$, the autoencoder and the flow
      trained together (a negative ELBO with the flow as the prior; with a fixed variance, reconstruction minus
      $\lambda$ times the flow's log-likelihood of the noisy latent, up to a constant);
    - `"autoencoder"`: $R + \lambda\,\mathrm{KL}(q(z \mid x) \,\|\, \mathcal N(0, I))$, a VAE alone (the flow
      untouched), the first stage of the frozen-encoder baseline;
    - `"flow"`: $-\log p_{\text{flow}}(z)$ of the frozen encoder's noisy latents, the post-hoc flow.

    Arguments:
        weight: $\lambda$.
        stage: `"joint"`, `"autoencoder"` or `"flow"`.

    Examples:
        >>> import torch, flowkit
        >>> model = flowkit.flows.latent.LatentFlow((1, 8, 8), hidden=8)
        >>> history = flowkit.train.fit(model, LatentFlowLoss(0.1), torch.rand(64, 1, 8, 8), steps=2, progress=False)
        >>> len(history.loss)
        2

    References:
        SimFlow, arXiv:2512.04084.
    """

    def __init__(self, weight: float = 0.1, stage: str = "joint") -> None:
        self.weight = check_number(weight, "weight", where="LatentFlowLoss", low=0.0)
        if stage not in _STAGES:
            raise ValueError(f"LatentFlowLoss: stage must be one of {', '.join(_STAGES)}, got {stage!r}")
        self.stage = stage
        self._last: dict[str, float] = {}

    def loss(self, flow: Any, batch: Any) -> Tensor:
        model = flow
        if not all(callable(getattr(model, name, None)) for name in ("noisy_latents", "decode", "encode")):
            raise ValueError(f"LatentFlowLoss: expects a LatentFlow, got {type(model).__name__}")
        x, _ = split_batch(batch, "LatentFlowLoss")
        if self.stage == "flow":
            with torch.no_grad():
                z, _ = model.noisy_latents(x)
            nll = -model.flow.log_prob(z).mean()
            self._last = {"flow_nll": nll.item()}
            return nll
        z, log_q = model.noisy_latents(x)
        recon = (model.decode(z) - x).square().sum((1, 2, 3)).mean()
        if self.stage == "autoencoder":
            mean, log_std = model.encode(x)
            kl = 0.5 * (mean**2 + (2 * log_std).exp() - 1 - 2 * log_std).sum((1, 2, 3)).mean()
            self._last = {"reconstruction": recon.item(), "kl": kl.item()}
            return recon + self.weight * kl
        log_p = model.flow.log_prob(z)
        self._last = {"reconstruction": recon.item(), "flow_nll": -log_p.mean().item()}
        return recon + self.weight * (log_q - log_p).mean()

    def metrics(self) -> dict[str, float]:
        return dict(self._last)
