r"""The transformer autoregressive flow block of TarFlow: a causal transformer over image patches as an affine flow.

An image $x$ of shape `(C, H, W)` is cut into $T = HW / p^2$ patches of $P = C p^2$ values (a reshape: volume
preserving), read in raster order, or in reverse order when `reverse` is set (blocks alternate). A causal transformer
with learned positions reads a learned start token (after a class token when the block is conditional) and the
patches $x_1, \dots, x_{T-1}$; its output at the token before patch $t$ gives, through a zero-initialised linear
layer, the shift $\mu_t$ and log-scale $s_t$ of patch $t$, a function of $x_{<t}$ only:

$$z_t = (x_t - \mu_t(x_{<t}))\, e^{-s_t(x_{<t})}, \qquad
\log\left|\det \frac{\partial z}{\partial x}\right| = -\sum_{t=1}^{T} \sum_{i=1}^{P} s_{t,i}.$$

The Jacobian is block lower triangular in patch order with diagonal blocks $\operatorname{diag}(e^{-s_t})$. The
inverse decodes the patches in turn, $x_t = \mu_t + e^{s_t} z_t$, feeding each decoded patch back; a key/value cache
keeps the attention keys and values of the tokens seen so far, so that each step runs one new token through the
layers instead of the whole prefix.

Class conditioning: the context is a vector of `classes` class weights (one-hot for a label; zeros for "no
label"), mapped by a linear layer to a prefix token (its bias is the token of the missing label). Classifier-free
guidance with weight $w$ combines the conditional and unconditional predictions at each decoding step,
$\mu = \mu_c + w(\mu_c - \mu_u)$ and $s = s_c + w(s_c - s_u)$.

References:
    Zhai, Zhang, Busbridge, Zhang, Susskind & Jaitly, *Normalizing Flows are Capable Generative Models* (TarFlow),
    arXiv:2412.06329; Gu et al., *STARFlow*, arXiv:2506.06276.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .._validation import check_number
from .base import Bijector
from .image import image_shape

__all__ = ["TransformerAutoregressive", "CausalPatchTransformer", "patchify", "unpatchify"]


def patchify(x: Tensor, patch: int) -> Tensor:
    """Images `(B, C, H, W)` as patch sequences `(B, T, C p^2)` in raster order (a reshape)."""
    b, c, h, w = x.shape
    y = x.reshape(b, c, h // patch, patch, w // patch, patch).permute(0, 2, 4, 1, 3, 5)
    return y.reshape(b, (h // patch) * (w // patch), c * patch * patch)


def unpatchify(seq: Tensor, patch: int, shape: Sequence[int]) -> Tensor:
    """The inverse of [`patchify`][flowkit.bijectors.transformer_autoregressive.patchify] for images of `shape`."""
    c, h, w = shape
    y = seq.reshape(-1, h // patch, w // patch, c, patch, patch).permute(0, 3, 1, 4, 2, 5)
    return y.reshape(-1, c, h, w)


class _Layer(nn.Module):
    """A pre-norm transformer layer: causal multi-head self-attention and an MLP, each with a residual."""

    def __init__(self, width: int, heads: int, expansion: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, expansion * width), nn.GELU(), nn.Linear(expansion * width, width))

    def forward(self, h: Tensor, cache: dict[str, Tensor] | None = None) -> Tensor:
        b, length, width = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=-2), torch.cat([cache["v"], v], dim=-2)
            cache["k"], cache["v"] = k, v
        keys = k.shape[-2]
        # query i sits at absolute position keys - length + i and sees the keys up to it
        mask = None if length == 1 else torch.ones(length, keys, dtype=torch.bool, device=h.device).tril(keys - length)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # one new token sees every key
        h = h + self.proj(attended.transpose(1, 2).reshape(b, length, width))
        return h + self.mlp(self.norm2(h))


class CausalPatchTransformer(nn.Module):
    r"""The network of a [`TransformerAutoregressive`][flowkit.bijectors.TransformerAutoregressive] block.

    Tokens: an optional class token $W c + b$ (context $c$), a learned start token, then the linear embeddings of
    patches $x_1, \dots, x_{T-1}$, each plus its learned position; `layers` causal pre-norm transformer layers;
    a final layer norm and a zero-initialised linear head to $(\mu_t, s_t)$ of patch $t$ from the token before it.

    Arguments:
        patches: the number of patches $T$.
        patch_features: values per patch $P$.
        width: the token width (divisible by `heads`).
        layers: transformer layers.
        heads: attention heads.
        classes: context size (0: unconditional, no class token).
        expansion: the MLP's hidden width over `width`.
    """

    def __init__(
        self,
        patches: int,
        patch_features: int,
        width: int,
        layers: int,
        heads: int,
        classes: int = 0,
        expansion: int = 4,
    ) -> None:
        super().__init__()
        self.patches, self.patch_features, self.classes = patches, patch_features, classes
        self.prefix = 2 if classes else 1
        self.embed = nn.Linear(patch_features, width)
        self.start = nn.Parameter(0.02 * torch.randn(width))
        self.label = nn.Linear(classes, width) if classes else None
        self.position = nn.Parameter(0.02 * torch.randn(self.prefix + patches - 1, width))
        self.layers = nn.ModuleList(_Layer(width, heads, expansion) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 2 * patch_features)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def prefix_tokens(self, batch: int, context: Tensor | None, like: Tensor) -> Tensor:
        """The class token (if any) and the start token, with their positions: `(B, prefix, width)`."""
        start = self.start.to(like).expand(batch, 1, -1)
        if self.label is not None:
            assert context is not None
            start = torch.cat([self.label(context.to(like)).unsqueeze(1), start], dim=1)
        return start + self.position[: self.prefix]

    def patch_tokens(self, seq: Tensor, first: int) -> Tensor:
        """Tokens of patches `first, first + 1, ...` (`seq` holds them, `(B, n, P)`), with their positions."""
        n = seq.shape[1]
        return self.embed(seq) + self.position[self.prefix + first : self.prefix + first + n]

    def hidden(self, seq: Tensor, context: Tensor | None) -> list[Tensor]:
        """The token states after each layer (teacher forcing on all patches), `layers + 1` tensors `(B, L, width)`."""
        tokens = torch.cat([self.prefix_tokens(seq.shape[0], context, seq), self.patch_tokens(seq[:, :-1], 0)], 1)
        states = [tokens]
        for layer in self.layers:
            states.append(layer(states[-1]))
        return states

    def params(self, states: Tensor) -> tuple[Tensor, Tensor]:
        """`(mu, s)` from the last layer's states at the tokens that predict patches."""
        mu, s = self.head(self.norm(states)).chunk(2, dim=-1)
        return mu, s

    def forward(self, seq: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """`(mu, s)` of every patch of `seq` `(B, T, P)`, each from the patches before it."""
        return self.params(self.hidden(seq, context)[-1][:, self.prefix - 1 :])

    def step(self, tokens: Tensor, caches: list[dict[str, Tensor]] | None) -> tuple[Tensor, Tensor]:
        """Run new `tokens` after the cached ones (or alone when `caches` is None); `(mu, s)` of the last one."""
        h = tokens
        for i, layer in enumerate(self.layers):
            h = layer(h, None if caches is None else caches[i])
        return self.params(h[:, -1])


class TransformerAutoregressive(Bijector):
    r"""TarFlow's block: an affine autoregressive flow over image patches, conditioned by a causal transformer.

    See the [module][flowkit.bijectors.transformer_autoregressive] for the maths. A fresh block is the identity
    (its output layer starts at zero). `inverse` decodes the $T$ patches one after the other; it accepts two
    keyword arguments besides the context: `guidance` (classifier-free guidance weight $w$, conditional blocks
    only; its log-determinant is that of the guided map) and `cache` (use the key/value cache; `False`
    recomputes the whole prefix at every step, for testing).

    Arguments:
        event_shape: `(C, H, W)`, with `H` and `W` divisible by `patch`.
        patch: the patch side `p`.
        width: token width of the transformer (divisible by `heads`).
        layers: transformer layers.
        heads: attention heads.
        reverse: read the patches in reverse raster order (alternate between blocks).
        classes: number of classes `K`: the context is a vector of `K` class weights (one-hot for a label,
            zeros for none); 0 for an unconditional block.
        expansion: MLP width over `width`.

    Examples:
        >>> import torch
        >>> block = TransformerAutoregressive((1, 4, 4), patch=2, width=8, layers=1, heads=2)
        >>> x = torch.randn(3, 1, 4, 4)
        >>> z, ladj = block(x)
        >>> torch.equal(z, x), ladj.abs().max().item()  # identity at initialisation
        (True, 0.0)

    References:
        Zhai et al., *Normalizing Flows are Capable Generative Models*, arXiv:2412.06329 (2024).
    """

    def __init__(
        self,
        event_shape: Sequence[int],
        patch: int = 2,
        width: int = 64,
        layers: int = 2,
        heads: int = 4,
        reverse: bool = False,
        classes: int = 0,
        expansion: int = 4,
    ) -> None:
        super().__init__()
        where = "TransformerAutoregressive"
        c, h, w = image_shape(event_shape, where)
        self.patch = check_number(patch, "patch", where=where, integer=True, low=1)
        if h % self.patch or w % self.patch:
            raise ValueError(f"{where}: the patch size {self.patch} does not divide the image's {h} x {w} pixels")
        width = check_number(width, "width", where=where, integer=True, low=1)
        heads = check_number(heads, "heads", where=where, integer=True, low=1)
        if width % heads:
            raise ValueError(f"{where}: width {width} is not divisible by heads {heads}")
        layers = check_number(layers, "layers", where=where, integer=True, low=1)
        self.classes = check_number(classes, "classes", where=where, integer=True, low=0)
        self.event_shape = torch.Size((c, h, w))
        self.patches = (h // self.patch) * (w // self.patch)
        if self.patches < 2:
            raise ValueError(f"{where}: the image {(c, h, w)} makes a single patch of size {self.patch}; use smaller")
        self.reverse = bool(reverse)
        self.context_features = self.classes
        self.net = CausalPatchTransformer(
            self.patches, c * self.patch**2, width, layers, heads, self.classes, expansion
        )

    # sequences in the block's own order
    def _sequence(self, x: Tensor) -> Tensor:
        seq = patchify(x.reshape(-1, *self.event_shape), self.patch)
        return seq.flip(1) if self.reverse else seq

    def _image(self, seq: Tensor, batch: torch.Size) -> Tensor:
        seq = seq.flip(1) if self.reverse else seq
        return unpatchify(seq, self.patch, self.event_shape).reshape(*batch, *self.event_shape)

    def _context(self, context: Tensor | None, batch: torch.Size, like: Tensor) -> Tensor | None:
        if not self.classes:
            return None
        assert context is not None
        return context.to(like).expand(*batch, self.classes).reshape(-1, self.classes)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        batch = x.shape[:-3]
        seq = self._sequence(x)
        mu, s = self.net(seq, self._context(context, batch, x))
        z = (seq - mu) * torch.exp(-s)
        return self._image(z, batch), -s.sum((1, 2)).reshape(batch)

    def hidden_states(self, x: Tensor, context: Tensor | None = None) -> list[Tensor]:
        """The transformer's token states after each layer on data-side input `x` (batch flattened).

        The same states the inverse (generative) pass computes when it decodes `x`, since decoding feeds the
        decoded patches back: the features of the reverse pass, for alignment losses.
        """
        return self.net.hidden(self._sequence(x), self._context(context, x.shape[:-3], x))

    def inverse(
        self, z: Tensor, context: Tensor | None = None, *, guidance: float = 0.0, cache: bool = True
    ) -> tuple[Tensor, Tensor]:
        if guidance and not self.classes:
            raise ValueError("TransformerAutoregressive.inverse: guidance needs a class-conditional block")
        if not math.isfinite(guidance):
            raise ValueError(f"TransformerAutoregressive.inverse: guidance must be finite, got {guidance}")
        batch = z.shape[:-3]
        zs = self._sequence(z)
        n = zs.shape[0]
        ctx = self._context(context, batch, z)
        if guidance:  # conditional and unconditional rows in one batch
            ctx = torch.cat([ctx, torch.zeros_like(ctx)])
        rows = ctx.shape[0] if ctx is not None else n
        prefix = self.net.prefix_tokens(rows, ctx, zs)
        caches: list[dict[str, Tensor]] | None = [{} for _ in self.net.layers] if cache else None
        decoded: list[Tensor] = []
        log_scales: list[Tensor] = []
        tokens = prefix
        for t in range(self.patches):
            if t > 0:
                new = decoded[-1].repeat(rows // n, 1).unsqueeze(1)
                new_tokens = self.net.patch_tokens(new, t - 1)
                if cache:
                    tokens = new_tokens
                else:
                    tokens = torch.cat([tokens, new_tokens], dim=1)
            mu, s = self.net.step(tokens, caches)
            if guidance:
                (mu_c, mu_u), (s_c, s_u) = mu.chunk(2), s.chunk(2)
                mu, s = mu_c + guidance * (mu_c - mu_u), s_c + guidance * (s_c - s_u)
            decoded.append(zs[:, t] * torch.exp(s) + mu)
            log_scales.append(s.sum(-1))
        x = self._image(torch.stack(decoded, dim=1), batch)
        return x, torch.stack(log_scales, -1).sum(-1).reshape(batch)

    def extra_repr(self) -> str:
        return (
            f"event_shape={tuple(self.event_shape)}, patch={self.patch}, patches={self.patches}, "
            f"reverse={self.reverse}, classes={self.classes}"
        )
