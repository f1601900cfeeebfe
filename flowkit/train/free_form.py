r"""Maximum likelihood for free-form flows: a log-determinant surrogate and a reconstruction loss.

The objective of free-form flows (Draxler, Sorrenson et al., AISTATS 2024) and free-form injective
flows (Sorrenson, Draxler et al., ICLR 2024), for a [`FreeFormFlow`][flowkit.flows.FreeFormFlow] or an
[`InjectiveFlow`][flowkit.flows.InjectiveFlow] with encoder $f$ and decoder $g$. Per point $x$ with
$z = f(x)$,

$$
\mathcal{L}(x) = \beta \lVert x - g(z) \rVert^2 - \log p_Z(z)
    - \frac{1}{K} \sum_{k=1}^{K} v_k^\top f'(x)\, \mathrm{SG}\big(g'(z)\, v_k\big),
$$

where SG stops the gradient and the probes $v_1, \dots, v_K \in \mathbb{R}^d$ are $\sqrt{d}$ times
orthonormal columns (the Q factor of a Gaussian $d \times K$ matrix), drawn afresh per point, so that
$E[\frac{1}{K}\sum_k v_k v_k^\top] = I$ and, for $K = d$, $\frac{1}{K}\sum_k v_k v_k^\top = I$ exactly.
The last term is not the log-determinant but has its gradient where $g$ inverts $f$:

- $d = D$: $\nabla_\theta \log\lvert\det f'(x)\rvert = \mathrm{tr}\big(f'(x)^{-1}\, \partial_\theta f'(x)\big)$,
  and $g'(z) \approx f'(x)^{-1}$;
- $d < D$: the gradient of $-\tfrac12 \log\det(g'^\top g')$, the injective change of variables, by the
  same estimator with $g'$ the pseudo-inverse of $f'$: $\nabla_\theta \tfrac12 \log\det(f' f'^\top) =
  \mathrm{tr}\big(f'^{+}\, \partial_\theta f'\big)$.

Both Jacobian-vector products are forward-mode, the $K$ probes as one batch: about $2 + 3K$ network passes
and no determinant. The encoder's Jacobian is taken at $x$, not at $g(f(x))$ (the ICLR paper's stable
objective, section 4).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.autograd.forward_ad as fwad
from torch import Tensor

from .._validation import check_context, check_number, check_tensor, module_dtype
from ..flows.base import FlowModel
from .batches import split_batch
from .objective import Objective

__all__ = ["FreeFormLikelihood", "log_det_surrogate", "orthonormal_probes"]


def orthonormal_probes(batch: int, features: int, probes: int, like: Tensor) -> Tensor:
    r"""Probe vectors of shape `(probes, batch, features)`: per point, $\sqrt{d}$ times orthonormal vectors.

    The Q factor of a Gaussian `(features, probes)` matrix per point, drawn with torch's global generator in
    `like`'s dtype and device.
    """
    gaussian = torch.randn(batch, features, probes, dtype=like.dtype, device=like.device)
    q = torch.linalg.qr(gaussian).Q  # (batch, features, probes), orthonormal columns
    return q.permute(2, 0, 1) * math.sqrt(features)


def log_det_surrogate(
    encoder: Callable[[Tensor], Tensor], decoder: Callable[[Tensor], Tensor], x: Tensor, probes: int
) -> tuple[Tensor, Tensor, Tensor]:
    r"""The latent points, the log-determinant surrogate and the reconstruction of points `x` `(B, D)`.

    Returns `(z, surrogate, x1)`: `z = f(x)` `(B, d)`, the surrogate
    $\frac{1}{K} \sum_k v_k^\top f'(x)\, \mathrm{SG}(g'(z) v_k)$ `(B,)` (to the encoder's parameters only)
    and the reconstruction `x1 = g(z)` `(B, D)`, with their graphs. The networks map rows to rows; a conditional
    model's come from its `network(name, context)`, which appends the context of row `i mod B` to row `i`.
    """
    batch = x.shape[0]
    z = encoder(x)
    d = z.shape[-1]
    v = orthonormal_probes(batch, d, probes, z).reshape(probes * batch, d)
    with fwad.dual_level():  # g'(z) v_k for every probe, and the reconstruction g(z) as the primal
        dual = decoder(fwad.make_dual(z.repeat(probes, 1), v))
        reconstructions, decoded = fwad.unpack_dual(dual)
    if decoded is None:  # a decoder that ignores its input
        decoded = torch.zeros_like(reconstructions)
    with fwad.dual_level():  # f'(x) SG(g'(z) v_k), at the data point x
        dual = encoder(fwad.make_dual(x.repeat(probes, 1), decoded.detach()))
        encoded = fwad.unpack_dual(dual).tangent
    if encoded is None:
        encoded = torch.zeros_like(v)
    surrogate = (v * encoded).sum(-1).reshape(probes, batch).mean(0)
    return z, surrogate, reconstructions[:batch]


class FreeFormLikelihood(Objective):
    r"""Maximum likelihood for free-form flows: a `FreeFormFlow` or an `InjectiveFlow` (encoder and decoder).

    The loss is the batch mean of the module's $\mathcal{L}(x)$ (minus the log-determinant of a
    `FreeFormFlow`'s fixed preprocessing): its gradient, not its value, is the NLL's plus $\beta$ times the
    reconstruction error's wherever the decoder inverts the encoder. The validation loss puts the exact
    `log_prob` in place of the surrogate.

    Arguments:
        beta: weight of the squared reconstruction error, at least 0 (the papers use 10 to 500 on standardised
            data; large enough that $g \approx f^{-1}$, or the surrogate is biased).
        probes: number $K$ of probe vectors per point, from 1 to the latent dimension $d$ ($K = d$: the exact
            gradient at $g = f^{-1}$; the papers use 1).

    Raises:
        ValueError: `beta` negative or not finite, `probes` not a positive integer; at the first batch, `probes`
            above the latent dimension, a model that is not a free-form flow, or a context that does not fit the
            model's.

    References:
        Draxler, Sorrenson, Zimmermann, Rousselot & Köthe, *Free-form flows: make any architecture a normalizing
        flow*, AISTATS 2024; Sorrenson, Draxler, Rousselot, Hummerich, Zimmermann & Köthe, *Lifting
        architectural constraints of injective flows*, ICLR 2024.

    Examples:
        >>> import torch
        >>> from flowkit.flows import FreeFormFlow
        >>> from flowkit.nn import MLP
        >>> from flowkit.train import FreeFormLikelihood, fit
        >>> model = FreeFormFlow(MLP(2, 2, (16,)), MLP(2, 2, (16,)), features=2)
        >>> history = fit(model, FreeFormLikelihood(beta=10.0), torch.randn(256, 2), steps=3, progress=False)
        >>> len(history.loss)
        3
    """

    needs_data = True

    def __init__(self, beta: float = 10.0, probes: int = 1) -> None:
        where = type(self).__name__
        self.beta = check_number(beta, "beta", where=where, low=0.0, rule="a finite number of at least 0")
        self.probes = int(check_number(probes, "probes", where=where, integer=True, low=1))
        self._metrics: dict[str, float] = {}

    def _points(self, flow: FlowModel, batch: Any) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """The batch's points in the encoder's space `(B, D)`, their preprocessing log-determinant, `x`, context."""
        where = type(self).__name__
        if not getattr(flow, "free_form", False):
            raise ValueError(
                f"{where}: the model must be a flowkit.flows.FreeFormFlow or InjectiveFlow (an encoder/decoder "
                f"pair), got {type(flow).__name__}; train other flows with MaximumLikelihood"
            )
        x, context = split_batch(batch, where)
        check_tensor(x, flow.event_shape, name="x", dtype=module_dtype(flow), where=where)
        check_context(context, flow.context_features, x.shape[:-1], dtype=module_dtype(flow), where=where)
        if self.probes > flow.latent_features:
            raise ValueError(
                f"{where}: probes={self.probes} exceeds the latent dimension {flow.latent_features} "
                "(at most that many orthonormal probes exist)"
            )
        if context is not None:
            context = context.expand(*x.shape[:-1], context.shape[-1]).reshape(-1, context.shape[-1])
        x = x.reshape(-1, flow.features)
        y, ladj = flow.preprocess(x)
        return y, ladj, x, context

    def loss(self, flow: FlowModel, batch: Any) -> Tensor:
        y, ladj, _, context = self._points(flow, batch)
        encoder, decoder = flow.network("encoder", context), flow.network("decoder", context)
        z, surrogate, reconstructed = log_det_surrogate(encoder, decoder, y, self.probes)
        reconstruction = (y - reconstructed).square().sum(-1)
        nll = -(flow.base.log_prob(z) + surrogate + ladj)
        self._metrics = {"reconstruction": float(reconstruction.detach().mean())}
        return (nll + self.beta * reconstruction).mean()

    def validation_loss(self, flow: FlowModel, batch: Any) -> Tensor:
        """The mean exact NLL (the model's `log_prob`) plus `beta` times the squared reconstruction error."""
        with torch.no_grad():
            y, _, x, context = self._points(flow, batch)
            encoder, decoder = flow.network("encoder", context), flow.network("decoder", context)
            reconstruction = (y - decoder(encoder(y))).square().sum(-1)
            return (-flow.log_prob(x, context) + self.beta * reconstruction).mean()

    def metrics(self) -> dict[str, float]:
        """The last batch's mean squared reconstruction error (in the encoder's space)."""
        return {"reconstruction": self._metrics.get("reconstruction", float("nan"))}
