r"""TarFlow: a stack of transformer autoregressive blocks on images, with labels, guidance, denoising and classifiers.

[`TarFlow`][flowkit.flows.TarFlow] chains an optional [`Logit`][flowkit.bijectors.Logit] preprocessing with `blocks`
[`TransformerAutoregressive`][flowkit.bijectors.TransformerAutoregressive] blocks whose patch order alternates, over a
standard normal. A class-conditional flow (`classes = K`) takes one-hot labels as context
([`label_context`][flowkit.flows.TarFlow.label_context]); during training the label is dropped (replaced by zeros)
at the rate `label_dropout`, so that the same network is also the unconditional model that classifier-free
guidance needs ([`generate`][flowkit.flows.TarFlow.generate]).

**Noise augmentation and denoising.** Trained on $y = x + \sigma\varepsilon$
([`NoisyMaximumLikelihood`][flowkit.train.noisy.NoisyMaximumLikelihood]), the flow models the noisy density
$p_\sigma$, and
Tweedie's formula gives the posterior mean of the clean image from its score,

$$\mathbb E[x \mid y] = y + \sigma^2 \nabla_y \log p_\sigma(y),$$

one gradient step ([`tweedie_denoise`][flowkit.flows.tarflow.tweedie_denoise]).

**Likelihood classifier.** With a class-conditional flow, Bayes' rule gives
$\hat y(x) = \arg\max_y \log p(x \mid y) + \log \pi_y$
([`classify`][flowkit.flows.tarflow.classify]); FlowBack's test-time variant optimises a soft label
$c = \operatorname{softmax}(a)$ in the simplex to maximise $\log p(x \mid c)$
([`optimize_label`][flowkit.flows.tarflow.optimize_label]).

References:
    Zhai et al., *Normalizing Flows are Capable Generative Models*, arXiv:2412.06329 (2024); Ho & Salimans,
    *Classifier-Free Diffusion Guidance*, arXiv:2207.12598; Efron, *Tweedie's formula and selection bias*, JASA 2011;
    FlowBack, arXiv:2511.22345 (AAAI 2026).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .._validation import check_number
from ..bijectors import Bijector, Chain, Logit, TransformerAutoregressive
from ..bijectors.image import image_shape
from ..distributions import Distribution, StandardNormal
from .base import FlowModel
from .flow import Flow
from .registry import preset

__all__ = ["TarFlow", "tweedie_denoise", "class_log_likelihoods", "classify", "optimize_label", "one_hot"]


def one_hot(labels: Tensor | Sequence[int], classes: int, where: str = "one_hot") -> Tensor:
    """One-hot vectors `(N, classes)` of integer labels, or a `ValueError` for a label outside `0 .. classes - 1`."""
    labels = torch.as_tensor(labels)
    if labels.is_floating_point():
        if not torch.equal(labels, labels.round()):
            raise ValueError(f"{where}: labels must be integers")
        labels = labels.long()
    bad = (labels < 0) | (labels >= classes)
    if bad.any():
        raise ValueError(
            f"{where}: label {int(labels[bad][0])} is outside the classes 0 .. {classes - 1} of this model"
        )
    return torch.nn.functional.one_hot(labels.long(), classes).to(torch.get_default_dtype())


def _default_patch(h: int, w: int) -> int:
    """The largest of 4, 2, 1 dividing both sides and leaving at least 16 patches."""
    for p in (4, 2):
        if h % p == 0 and w % p == 0 and (h // p) * (w // p) >= 16:
            return p
    return 1


class TarFlow(Flow):
    r"""TarFlow: transformer autoregressive blocks over image patches, alternating direction (images in `[0, 1]`).

    Arguments:
        shape: `(C, H, W)`.
        patch: patch side (None: 4 or 2 or 1, the largest leaving at least 16 patches).
        blocks: number of [`TransformerAutoregressive`][flowkit.bijectors.TransformerAutoregressive] blocks.
        width: token width.
        layers: transformer layers per block.
        heads: attention heads.
        classes: number of classes (0: unconditional). The context is a one-hot label
            ([`label_context`][flowkit.flows.TarFlow.label_context]) or zeros for "no label".
        label_dropout: the rate at which training (`log_prob` in training mode, with gradients on) replaces the
            label by zeros, for classifier-free guidance.
        alpha: the [`Logit`][flowkit.bijectors.Logit] preprocessing's `alpha` (as in
            [`Glow`][flowkit.flows.Glow]); None for no preprocessing (a density on the real line, what noise
            augmentation needs).
        noise: the noise level $\sigma$ the flow is trained with (set by
            [`NoisyMaximumLikelihood`][flowkit.train.noisy.NoisyMaximumLikelihood]; `generate(denoise=True)` uses it).
        features: the size of the teacher features of an alignment loss
            ([`FeatureAlignment`][flowkit.train.noisy.FeatureAlignment]): a projection head from the token width to it
            (None: no head).
        expansion: MLP width over `width`.
        base: the latent distribution (standard normal).

    Examples:
        >>> import torch, flowkit
        >>> flow = flowkit.flows.TarFlow((1, 8, 8), patch=2, blocks=2, width=16, layers=1, heads=2, classes=10)
        >>> x = torch.rand(4, 1, 8, 8)
        >>> flow.log_prob(x, flow.label_context([0, 1, 2, 3])).shape
        torch.Size([4])
        >>> flow.generate(2, labels=[5, 7], guidance=1.0).shape
        torch.Size([2, 1, 8, 8])

    References:
        Zhai et al., *Normalizing Flows are Capable Generative Models*, arXiv:2412.06329 (2024).
    """

    def __init__(
        self,
        shape: Sequence[int],
        patch: int | None = None,
        blocks: int = 4,
        width: int = 64,
        layers: int = 2,
        heads: int = 4,
        classes: int = 0,
        label_dropout: float = 0.1,
        alpha: float | None = 0.0,
        noise: float = 0.0,
        features: int | None = None,
        expansion: int = 4,
        *,
        base: Distribution | None = None,
    ) -> None:
        shape = image_shape(shape, "TarFlow")
        blocks = check_number(blocks, "blocks", where="TarFlow", integer=True, low=1)
        patch = _default_patch(*shape[1:]) if patch is None else patch
        layers_: list[Bijector] = [] if alpha is None else [Logit(shape, alpha)]
        layers_ += [
            TransformerAutoregressive(shape, patch, width, layers, heads, reverse=i % 2 == 1, classes=classes)
            for i in range(blocks)
        ]
        super().__init__(Chain(*layers_), StandardNormal(shape) if base is None else base)
        self.classes = classes
        self.label_dropout = check_number(label_dropout, "label_dropout", where="TarFlow", low=0.0, high=1.0)
        self.noise = check_number(noise, "noise", where="TarFlow", low=0.0)
        self.projection = (
            None
            if features is None
            else nn.Sequential(nn.Linear(width, 2 * width), nn.SiLU(), nn.Linear(2 * width, features))
        )

    @property
    def dims(self) -> int:
        """Number of dimensions `C H W` (for bits/dim)."""
        return math.prod(self.event_shape)

    @property
    def blocks(self) -> list[TransformerAutoregressive]:
        """The transformer blocks, data side first."""
        return [layer for layer in self.bijector if isinstance(layer, TransformerAutoregressive)]

    def label_context(self, labels: Tensor | Sequence[int] | None, count: int | None = None) -> Tensor:
        """The context of `labels`: one-hot rows (zeros rows, "no label", for `labels=None` and `count` rows).

        Raises:
            ValueError: for an unconditional flow, or a label outside `0 .. classes - 1`.
        """
        if not self.classes:
            raise ValueError("TarFlow: this flow is unconditional (classes=0); it takes no labels")
        dtype = self.base.dtype
        if labels is None:
            return torch.zeros(1 if count is None else count, self.classes, dtype=dtype)
        return one_hot(labels, self.classes, "TarFlow.label_context").to(dtype)

    def _log_density(self, x: Tensor, context: Tensor | None, where: str) -> Tensor:
        # in training mode (with gradients) the label is dropped at the rate `label_dropout`
        if context is not None and self.classes and self.training and self.label_dropout and torch.is_grad_enabled():
            keep = torch.rand(context.shape[:-1], device=context.device) >= self.label_dropout
            context = context * keep.unsqueeze(-1).to(context.dtype)
        return super()._log_density(x, context, where)

    @torch.no_grad()
    def generate(
        self,
        n: int,
        labels: Tensor | Sequence[int] | None = None,
        *,
        guidance: float = 0.0,
        denoise: bool = False,
        temperature: float = 1.0,
        cache: bool = True,
    ) -> Tensor:
        r"""`n` images, with labels (class-conditional flows), classifier-free guidance and denoising.

        Arguments:
            n: number of images.
            labels: `n` labels (or one, repeated) for a class-conditional flow; None: unconditional (zero context).
            guidance: the guidance weight $w$ ($\mu = \mu_c + w(\mu_c - \mu_u)$, likewise $s$); 0: none.
            denoise: apply [`tweedie_denoise`][flowkit.flows.tarflow.tweedie_denoise] with the flow's `noise`.
            temperature: scale of the latent draw.
            cache: decode with the key/value cache.

        Raises:
            ValueError: for guidance without labels or on an unconditional flow, a label outside the classes,
                or `denoise` on a flow trained without noise.
        """
        if guidance and not self.classes:
            raise ValueError("TarFlow.generate: guidance needs a class-conditional flow (classes > 0)")
        if guidance and labels is None:
            raise ValueError("TarFlow.generate: guidance needs labels")
        if denoise and not self.noise:
            raise ValueError("TarFlow.generate: denoise needs a flow trained with noise (noise > 0)")
        context = None
        if self.classes:
            context = self.label_context(labels, n)
            context = context.expand(n, -1) if len(context) == 1 else context
            if len(context) != n:
                raise ValueError(f"TarFlow.generate: {len(context)} labels for {n} images")
            context = context.to(self.base.dtype)
        z = self.base.sample((n,)) * temperature
        for layer in reversed(list(self.bijector)):
            if isinstance(layer, TransformerAutoregressive):
                z = layer.inverse(z, context, guidance=guidance, cache=cache)[0]
            else:
                z = layer.inverse_call(z)
        if denoise:
            z = tweedie_denoise(self, z, self.noise, context)
        return z

    def hidden_states(self, x: Tensor, context: Tensor | None = None, block: int = 0) -> list[Tensor]:
        """Token states of block `block` (data side first) after each of its layers, on data `x`.

        These are the features the generative (reverse) pass computes in that block when it produces `x`.
        """
        h = x
        for layer in self.bijector:
            if layer is self.blocks[block]:
                return layer.hidden_states(h, context if layer.context_features else None)
            h = layer.call(h, context if layer.context_features else None)
        raise AssertionError("unreachable")


@preset("tarflow", "transformer autoregressive blocks over patches (TarFlow)", kind="image", steps=4, hidden=(64, 64))
def _tarflow_preset(shape: Sequence[int], steps: int, hidden: Sequence[int], context: int = 0) -> TarFlow:
    """The preset: `steps` blocks of `len(hidden)` layers of width `hidden[0]`; a context of `context` classes."""
    width = int(hidden[0])
    heads = 4 if width % 4 == 0 else 1
    return TarFlow(shape, blocks=steps, width=width, layers=len(hidden), heads=heads, classes=context)


def tweedie_denoise(flow: FlowModel, y: Tensor, sigma: float, context: Tensor | None = None) -> Tensor:
    r"""Tweedie's one-step denoiser $y + \sigma^2 \nabla_y \log p_\sigma(y)$ with the flow's score.

    The posterior mean $\mathbb E[x \mid y]$ of the clean image when the flow models the density of
    $y = x + \sigma \varepsilon$, $\varepsilon \sim \mathcal N(0, I)$.

    Arguments:
        flow: a flow with a differentiable `log_prob`.
        y: noisy points `(N, *event_shape)`.
        sigma: the noise level.
        context: the flow's context.
    """
    sigma = check_number(sigma, "sigma", where="tweedie_denoise", low=0.0)
    with torch.enable_grad():
        y = y.detach().requires_grad_(True)
        (score,) = torch.autograd.grad(flow.log_prob(y, context).sum(), y)
    return (y + sigma**2 * score).detach()


def _classes(flow: FlowModel, where: str) -> int:
    classes = flow.context_features
    if not classes:
        raise ValueError(f"{where}: the flow is unconditional; a likelihood classifier needs a class-conditional flow")
    return classes


@torch.no_grad()
def class_log_likelihoods(flow: FlowModel, x: Tensor, batch: int = 512) -> Tensor:
    """`log p(x | y)` for every class `y`: `(N, K)` for a flow whose context is a one-hot label of `K` classes."""
    classes = _classes(flow, "class_log_likelihoods")
    rows = []
    eye = torch.eye(classes, dtype=x.dtype, device=x.device)
    for part in x.split(batch):
        rows.append(torch.stack([flow.log_prob(part, eye[k].expand(len(part), -1)) for k in range(classes)], -1))
    return torch.cat(rows)


def classify(flow: FlowModel, x: Tensor, prior: Tensor | None = None, batch: int = 512) -> Tensor:
    r"""The likelihood classifier $\arg\max_y \log p(x \mid y) + \log \pi_y$ (Bayes' rule; uniform prior by default).

    Arguments:
        flow: a class-conditional flow (context: one-hot labels).
        x: points `(N, *event_shape)`.
        prior: class probabilities $\pi$ `(K,)` (None: uniform).
        batch: points per evaluation.

    Returns:
        The labels `(N,)`.
    """
    scores = class_log_likelihoods(flow, x, batch)
    if prior is not None:
        prior = torch.as_tensor(prior, dtype=scores.dtype)
        if prior.shape != (scores.shape[-1],) or (prior < 0).any():
            raise ValueError(f"classify: prior must hold {scores.shape[-1]} non-negative probabilities")
        scores = scores + prior.log()
    return scores.argmax(-1)


def optimize_label(flow: FlowModel, x: Tensor, steps: int = 50, lr: float = 0.1) -> Tensor:
    r"""FlowBack's test-time classification: optimise a soft label per point against the flow's loss.

    Maximises $\log p(x \mid c)$ over $c = \operatorname{softmax}(a)$ in the simplex (the label token
    $W c + b$ then ranges over the convex hull of the class tokens) by Adam on $a$, from $a = 0$.

    Returns:
        The optimised soft labels `(N, K)`; their argmax is the prediction.
    """
    classes = _classes(flow, "optimize_label")
    steps = check_number(steps, "steps", where="optimize_label", integer=True, low=1)
    logits = torch.zeros(len(x), classes, dtype=x.dtype, device=x.device, requires_grad=True)
    optimizer = torch.optim.Adam([logits], lr=lr)
    frozen = [p for p in flow.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    try:
        for _ in range(steps):
            loss = -flow.log_prob(x, torch.softmax(logits, -1)).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return torch.softmax(logits.detach(), -1)
