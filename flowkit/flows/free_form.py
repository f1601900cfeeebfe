r"""Free-form flows: any encoder/decoder pair of networks as a generative model.

A free-form flow has an *encoder* $f: \mathbb{R}^D \to \mathbb{R}^d$ (data to latent), a *decoder*
$g: \mathbb{R}^d \to \mathbb{R}^D$ (latent to data) and a latent distribution $p_Z$; samples are
$x = g(z)$, $z \sim p_Z$. Neither network is constrained to be invertible: training
([`FreeFormLikelihood`][flowkit.train.FreeFormLikelihood]) makes $g \approx f^{-1}$ by a reconstruction
loss and trains the change of variables with a cheap surrogate of its log-determinant gradient.

- [`FreeFormFlow`][flowkit.flows.FreeFormFlow] ($d = D$, Draxler, Sorrenson et al., AISTATS 2024): the
  density is the change of variables through the encoder;
- [`InjectiveFlow`][flowkit.flows.InjectiveFlow] ($d < D$, Sorrenson, Draxler et al., ICLR 2024): the
  decoder embeds a $d$-dimensional manifold in $\mathbb{R}^D$, the encoder projects onto it, and the density
  on the manifold is evaluated at the projection (as the paper evaluates its test NLL).

Both Jacobians are computed exactly by forward-mode differentiation ([`jacobian`][flowkit.flows.free_form.jacobian]),
so evaluation costs $O(D)$ network passes per point and an $O(D^3)$ determinant; training never forms them.

The samples come from the decoder and the density from the encoder, which agree only as far as training
made $g = f^{-1}$: both models set `samples_match_density = False` (see the
[flow contract][flowkit.flows.FlowModel]). `rsample_and_log_prob` gives samples with the model's density at them,
a fair estimate of the density of the samples for a well-trained pair, but every importance-weighting path
([`sample_with_log_weights`][flowkit.sampling.importance.sample_with_log_weights],
[`importance_sample`][flowkit.sampling.importance_sample],
[`ais`][flowkit.sampling.ais], FAB, IMH, reverse-KL training) refuses these models: their weights would be
biased without any sign of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.autograd.forward_ad as fwad
from torch import Tensor, nn

from .._config import Configurable
from .._validation import check_context, check_number, check_tensor, module_dtype, outermost
from ..bijectors import Bijector
from ..distributions import Distribution, StandardNormal
from ..nn import MLP
from ..utils import as_shape
from .base import FlowModel
from .flow import FlowDistribution, data_standardization
from .registry import preset

__all__ = ["FreeFormFlow", "InjectiveFlow", "ResidualMLP", "jacobian"]

#: Rows (points times directions) of one batched forward-mode pass when a Jacobian is formed.
_JACOBIAN_ROWS = 2**15


def jacobian(function: Callable[[Tensor], Tensor], x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
    r"""`(function(x), J)` for points `x` of shape `(B, n)`, with `J[b] =` $\partial\,$`function`$(x_b)/\partial x_b$.

    `function` maps `(N, n)` to `(N, m)` row by row. The Jacobian is exact: forward-mode derivatives
    along the $n$ unit vectors, batched into passes of at most $2^{15}$ rows. It is differentiable
    (training through it by reverse mode works). With a `context` `(B, C)`, `function` takes the rows
    `[x_b, c_b]` `(N, n + C)` and the Jacobian is with respect to `x` only.

    Returns:
        The values `(B, m)` and the Jacobians `(B, m, n)`.
    """
    batch, n = x.shape
    chunk = max(1, _JACOBIAN_ROWS // n)
    values, jacobians = [], []
    eye = torch.eye(n, dtype=x.dtype, device=x.device)
    contexts = [None] * batch if context is None else context.split(chunk)
    for part, rows in zip(x.split(chunk), contexts, strict=False):
        b = part.shape[0]
        # Row k * b + i is point i along direction k. Both are fresh copies: a reshaped expand of one row
        # (b = 1) is a view whose rows share memory, which forward-mode AD refuses to write tangents into.
        points = part.repeat(n, 1)
        directions = eye.repeat_interleave(b, dim=0)
        with fwad.dual_level():
            dual = fwad.make_dual(points, directions)
            out = function(dual if rows is None else torch.cat([dual, rows.repeat(n, 1)], dim=-1))
            value, tangent = fwad.unpack_dual(out)
        m = value.shape[-1]
        if tangent is None:  # the function does not depend on its input
            tangent = torch.zeros_like(value)
        values.append(value[:b])
        jacobians.append(tangent.reshape(n, b, m).permute(1, 2, 0))
    return torch.cat(values), torch.cat(jacobians)


class ResidualMLP(Configurable, nn.Module):
    r"""A residual network on $\mathbb{R}^D$: $x \mapsto x + r_1(x)$, then $+\, r_2$, ..., each $r_k$ an MLP.

    The encoder and decoder of the `free-form` preset (the free-form flows papers use residual networks
    too). Each block's last layer starts at zero, so the network starts as the identity: an encoder and
    a decoder built this way start as exact inverses with log-determinant 0, where the log-det surrogate
    is exact, and training departs from the standard normal.

    Arguments:
        features: the dimension `D` of inputs and outputs.
        hidden: hidden sizes of each block's MLP.
        blocks: number of residual blocks.
        activation: the MLPs' activation (see [`activation`][flowkit.nn.activation]; smooth ones suit
            the forward-mode Jacobians of free-form flows).
        context: number of context features `C`: the network then takes rows $[x, c]$ `(N, D + C)`, returns
            `(N, D)`, and every block sees the context, $x \mapsto x + r_k(x, c)$.
    """

    def __init__(
        self,
        features: int,
        hidden: Sequence[int] = (64, 64),
        blocks: int = 2,
        activation: str = "silu",
        context: int = 0,
    ) -> None:
        super().__init__()
        where = "ResidualMLP"
        features = int(check_number(features, "features", where=where, integer=True, low=1))
        blocks = int(check_number(blocks, "blocks", where=where, integer=True, low=1))
        context = int(check_number(context, "context", where=where, integer=True, low=0))
        self.blocks = nn.ModuleList(
            MLP(features, features, tuple(hidden), activation, context=context) for _ in range(blocks)
        )
        for block in self.blocks:
            block.zero_last()
        self.features, self.context = features, context

    def forward(self, x: Tensor) -> Tensor:
        x, context = (x, None) if not self.context else x.split([self.features, self.context], dim=-1)
        for block in self.blocks:
            x = x + block(x, context)
        return x


class _EncoderDecoderFlow(FlowModel):
    """What both free-form models share: the two networks, the base, sampling and the input checks."""

    _flowkit_register = False
    samples_match_density = False  # samples from the decoder, the density through the encoder
    free_form = True

    def __init__(
        self,
        encoder: nn.Module,
        decoder: nn.Module,
        features: int,
        latent_features: int,
        base: Distribution | None,
        where: str,
        context: int = 0,
    ) -> None:
        super().__init__()
        features = int(check_number(features, "features", where=where, integer=True, low=1))
        latent_features = int(check_number(latent_features, "latent_features", where=where, integer=True, low=1))
        self._context = int(check_number(context, "context", where=where, integer=True, low=0))
        for name, net in (("encoder", encoder), ("decoder", decoder)):
            if not isinstance(net, nn.Module):
                raise ValueError(f"{where}: {name} must be a torch.nn.Module, got {type(net).__name__}")
        if base is None:  # in the networks' dtype
            base = StandardNormal(latent_features).to(module_dtype(encoder) or torch.get_default_dtype())
        if not isinstance(base, Distribution):
            raise ValueError(f"{where}: base must be a flowkit Distribution, got {type(base).__name__}")
        if tuple(base.event_shape) != (latent_features,):
            raise ValueError(
                f"{where}: the base's event shape {tuple(base.event_shape)} is not the latent shape "
                f"({latent_features},)"
            )
        self.encoder, self.decoder, self.base = encoder, decoder, base
        self.features, self.latent_features = features, latent_features
        self._check_shapes(where)

    def _check_shapes(self, where: str) -> None:
        """Refuse networks whose outputs do not have the latent and data shapes (one pass on a zero point)."""
        dtype = module_dtype(self.encoder) or module_dtype(self.base) or torch.get_default_dtype()
        c = self._context
        checks = (
            ("encoder", self.encoder, self.features + c, self.latent_features),
            ("decoder", self.decoder, self.latent_features + c, self.features),
        )
        for name, net, inputs, outputs in checks:
            with torch.no_grad():
                try:
                    out = net(torch.zeros(2, inputs, dtype=dtype))
                except RuntimeError as error:
                    with_context = f" (the point and its {c} context features)" if c else ""
                    raise ValueError(
                        f"{where}: the {name} cannot take inputs of shape (N, {inputs}){with_context}: {error}"
                    ) from None
            if not isinstance(out, Tensor) or tuple(out.shape) != (2, outputs):
                got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                raise ValueError(
                    f"{where}: the {name} maps inputs of shape (2, {inputs}) to {got}; it must give (2, {outputs})"
                )

    @property
    def event_shape(self) -> torch.Size:
        return torch.Size([self.features])

    @property
    def context_features(self) -> int:
        """The number of context features `C` the networks take after the point (0: unconditional)."""
        return self._context

    def preprocess(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The points the encoder takes and the log-determinant of that map (the identity here)."""
        return x, x.new_zeros(x.shape[:-1])

    def _rows(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Points `(N, n)` and their contexts `(N, C)` (or None), the context broadcast to the points' batch."""
        if context is None:
            return x.reshape(-1, x.shape[-1]), None
        batch = torch.broadcast_shapes(x.shape[:-1], context.shape[:-1])
        x, context = x.expand(*batch, x.shape[-1]), context.expand(*batch, context.shape[-1])
        return x.reshape(-1, x.shape[-1]), context.reshape(-1, context.shape[-1])

    def network(self, name: str, context: Tensor | None = None) -> Callable[[Tensor], Tensor]:
        """The `"encoder"` or `"decoder"` as a map of rows `(N, n)`, given contexts `(B, C)` (`N` a multiple of `B`).

        Without a context, the network itself. With one, the map that appends to row `i` the context row
        `i mod B`, the rows of `torch.repeat`: what the training objective's probes
        (`x.repeat(probes, 1)`) need.
        """
        net = self.encoder if name == "encoder" else self.decoder
        if context is None:
            return net

        def conditioned(rows: Tensor) -> Tensor:
            return net(torch.cat([rows, context.repeat(rows.shape[0] // context.shape[0], 1)], dim=-1))

        return conditioned

    def encode(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Latent points `z = f(x)` of shape `(..., d)` for data `x` of shape `(..., D)` (and the context)."""
        y = self.preprocess(x)[0]
        rows, contexts = self._rows(y, context)
        z = self.network("encoder", contexts)(rows)
        return z.reshape(*rows_shape(y, context), self.latent_features)

    def decode(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        """Data points `x = g(z)` of shape `(..., D)` for latent points `z` of shape `(..., d)` (and the context)."""
        rows, contexts = self._rows(z, context)
        return self.network("decoder", contexts)(rows).reshape(*rows_shape(z, context), self.features)

    def reconstruct(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """`g(f(x))`: the reconstruction of `x` (for an injective flow, its projection onto the manifold)."""
        return self.decode(self.encode(x, context), context)

    def _check(self, x: Tensor, context: Tensor | None, where: str) -> None:
        with outermost() as check:
            if check:
                dtype = module_dtype(self)
                check_tensor(x, self.event_shape, name="x", dtype=dtype, where=where)
                check_context(context, self._context, x.shape[:-1], dtype=dtype, where=where)

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Log density of events `x` `(..., D)` (see the class), with the batch shape."""
        self._check(x, context, f"{type(self).__name__}.log_prob")
        flat, contexts = self._rows(x, context)
        return self._log_density(flat, contexts).reshape(rows_shape(x, context))

    def _log_density(self, x: Tensor, context: Tensor | None) -> Tensor:
        raise NotImplementedError

    def rsample(self, shape: int | Sequence[int] = (), context: Tensor | None = None) -> Tensor:
        """Samples `g(z)`, `z ~ base`, of shape `(*shape, *context_batch, D)`, differentiable in the decoder."""
        where = f"{type(self).__name__}.sample"
        with outermost() as check:
            if check:
                check_context(context, self._context, None, dtype=module_dtype(self), where=where)
        shape = as_shape(shape) + (() if context is None else tuple(context.shape[:-1]))
        return self.decode(self.base.rsample(shape), context)

    def rsample_and_log_prob(
        self, shape: int | Sequence[int] = (), context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        r"""Samples $x = g(z)$, $z \sim p_Z$ (reparameterised), and the model's log density `log_prob(x)` at them.

        The density is the encoder's (see the class), evaluated at the decoder's samples: differentiable in
        both networks, at the cost of `log_prob` ($O(D)$ passes per point). It equals the log density of the
        samples' law only where $g = f^{-1}$ (`samples_match_density` is False), so it is not an importance
        weight; the paths that need one refuse this model.

        Returns:
            `(x, log_prob(x))` of shapes `(*shape, D)` and `shape`.
        """
        x = self.rsample(shape, context)
        return x, self.log_prob(x, context)

    def latent_to_data(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The decoder's samples `g(z)` and the model's `log_prob` there (see `rsample_and_log_prob`)."""
        x = self.decode(z, context)
        return x, self.log_prob(x, context)


def rows_shape(x: Tensor, context: Tensor | None) -> tuple[int, ...]:
    """The batch shape of points `x` `(..., n)` broadcast with that of their context (if any)."""
    if context is None:
        return tuple(x.shape[:-1])
    return tuple(torch.broadcast_shapes(x.shape[:-1], context.shape[:-1]))


class FreeFormFlow(_EncoderDecoderFlow):
    r"""A free-form flow: an encoder $f$ and a decoder $g$ on $\mathbb{R}^D$, any two networks.

    Draxler, Sorrenson, Zimmermann, Rousselot & Köthe, "Free-form flows: make any architecture a
    normalizing flow", AISTATS 2024. The model is trained with
    [`FreeFormLikelihood`][flowkit.train.FreeFormLikelihood] so that $g \approx f^{-1}$; its exact density
    is the change of variables through the encoder (after an optional fixed `preprocessing` bijector $h$,
    such as a [`Standardization`][flowkit.bijectors.Standardization]):

    $$
    \log p(x) = \log p_Z\big(f(h(x))\big) + \log \lvert \det f'(h(x)) \rvert + \log \lvert \det h'(x) \rvert ,
    $$

    with the $D \times D$ Jacobian $f'$ formed by forward-mode differentiation (exact, $D$ network passes)
    and its log-determinant by `torch.linalg.slogdet`. It is normalised when $f$ is a bijection of
    $\mathbb{R}^D$, which training drives it to; samples are $h^{-1}(g(z))$, $z \sim p_Z$.

    Arguments:
        encoder: a module mapping `(N, D)` to `(N, D)` (data to latent).
        decoder: a module mapping `(N, D)` to `(N, D)` (latent to data).
        features: the data dimension `D`.
        base: the latent distribution (default: a standard normal on `D` features, in the encoder's dtype).
        preprocessing: an optional bijector applied to the data before the encoder (and inverted after the
            decoder); training treats it as fixed.
        context: number of context features `C` (0: unconditional). The encoder then maps `(N, D + C)` to
            `(N, D)`, the rows $[x, c]$, and the decoder $[z, c]$ likewise: $f(\cdot\,; c)$ and $g(\cdot\,; c)$, with
            the Jacobian taken in $x$ only.

    Raises:
        ValueError: for a non-positive `features`, modules that are not `nn.Module`s, a base of another
            shape, or an encoder or decoder whose output shape is not `(N, D)`.

    Examples:
        >>> import torch
        >>> from flowkit.flows import FreeFormFlow
        >>> from flowkit.nn import MLP
        >>> model = FreeFormFlow(MLP(2, 2, (16,)), MLP(2, 2, (16,)), features=2)
        >>> model.log_prob(torch.randn(5, 2)).shape, model.sample((3,)).shape
        (torch.Size([5]), torch.Size([3, 2]))
    """

    sampler_mismatch = (
        "its samples are decoder outputs g(z) and its log_prob the change of variables through the encoder f; "
        "they agree only where training made g the inverse of f"
    )

    def __init__(
        self,
        encoder: nn.Module,
        decoder: nn.Module,
        features: int,
        base: Distribution | None = None,
        preprocessing: Bijector | None = None,
        context: int = 0,
    ) -> None:
        where = "FreeFormFlow"
        if preprocessing is not None:
            if not isinstance(preprocessing, Bijector):
                raise ValueError(
                    f"{where}: preprocessing must be a flowkit Bijector, got {type(preprocessing).__name__}"
                )
            if tuple(preprocessing.event_shape) != (features,) or tuple(preprocessing.latent_shape) != (features,):
                raise ValueError(
                    f"{where}: preprocessing maps {tuple(preprocessing.event_shape)} to "
                    f"{tuple(preprocessing.latent_shape)}; it must keep the shape ({features},)"
                )
        super().__init__(encoder, decoder, features, features, base, where, context)
        self.preprocessing = preprocessing

    def to_distribution(self, context: Tensor | None = None) -> FlowDistribution:
        """The model as a `torch.distributions.Distribution`: `log_prob` through the encoder, samples from the decoder.

        Like the model itself, its samples follow the density only as far as the decoder inverts the encoder.
        """
        check_context(context, self._context, None, dtype=module_dtype(self), where="FreeFormFlow.to_distribution")
        return FlowDistribution(self, context)

    def standardized(self, x: Tensor, robust: bool = False) -> FreeFormFlow:
        """The same networks with `Standardization.from_data(x, robust)` as their `preprocessing`."""
        if self.preprocessing is not None:
            raise ValueError("standardize: the FreeFormFlow has a preprocessing already")
        scaling = data_standardization(self, x, robust)
        return FreeFormFlow(
            self.encoder, self.decoder, self.features, self.base, preprocessing=scaling, context=self._context
        )

    def preprocess(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """`(h(x), log|det h'(x)|)` for the `preprocessing` bijector $h$ (the identity and 0 without one)."""
        if self.preprocessing is None:
            return super().preprocess(x)
        return self.preprocessing(x)

    def decode(self, z: Tensor, context: Tensor | None = None) -> Tensor:
        x = super().decode(z, context)
        return x if self.preprocessing is None else self.preprocessing.inverse(x)[0]

    def _log_density(self, x: Tensor, context: Tensor | None) -> Tensor:
        y, ladj = self.preprocess(x)
        z, jac = jacobian(self.encoder, y, context)
        return self.base.log_prob(z) + torch.linalg.slogdet(jac)[1] + ladj


class InjectiveFlow(_EncoderDecoderFlow):
    r"""A free-form injective flow: a decoder $g: \mathbb{R}^d \to \mathbb{R}^D$ ($d < D$) and an encoder back.

    Sorrenson, Draxler, Rousselot, Hummerich, Zimmermann & Köthe, "Lifting architectural constraints of
    injective flows", ICLR 2024. The decoder embeds a $d$-dimensional manifold in $\mathbb{R}^D$ and
    $p_Z$ a density on it; the encoder projects data onto the manifold. Trained with
    [`FreeFormLikelihood`][flowkit.train.FreeFormLikelihood], which the data's distance to the manifold
    enters through the reconstruction term. The log density, with respect to the manifold's volume, is
    evaluated at the projection $z = f(x)$:

    $$
    \log p(x) = \log p_Z(z) - \tfrac{1}{2} \log \det \big(g'(z)^\top g'(z)\big),
    $$

    the $D \times d$ decoder Jacobian $g'(z)$ formed exactly by forward-mode differentiation ($d$ passes).
    Samples $g(z)$, $z \sim p_Z$, lie on the manifold.

    Arguments:
        encoder: a module mapping `(N, D)` to `(N, d)`.
        decoder: a module mapping `(N, d)` to `(N, D)`.
        features: the data dimension `D`.
        latent_features: the manifold's dimension `d`, below `D`.
        base: the latent distribution (default: a standard normal on `d` features, in the encoder's dtype).
        context: number of context features `C` (0: unconditional); the networks then take the rows
            $[x, c]$ `(N, D + C)` and $[z, c]$ `(N, d + C)` (see [`FreeFormFlow`][flowkit.flows.FreeFormFlow]).

    Raises:
        ValueError: for `latent_features` not in `1, ..., D - 1`, modules that are not `nn.Module`s, a base
            of another shape, or an encoder or decoder whose output shape is not `(N, d)` or `(N, D)`.
    """

    sampler_mismatch = (
        "its samples lie on the decoder's d-dimensional manifold and its log_prob is a density on that manifold, "
        "evaluated at the encoder's projection; it has no density on R^D"
    )

    def __init__(
        self,
        encoder: nn.Module,
        decoder: nn.Module,
        features: int,
        latent_features: int,
        base: Distribution | None = None,
        context: int = 0,
    ) -> None:
        where = "InjectiveFlow"
        check_number(features, "features", where=where, integer=True, low=1)
        check_number(
            latent_features,
            "latent_features",
            where=where,
            integer=True,
            low=1,
            below=features,
            rule=f"an integer from 1 to features - 1 = {features - 1} (an injective flow reduces the dimension; "
            "FreeFormFlow keeps it)",
        )
        super().__init__(encoder, decoder, features, latent_features, base, where, context)

    def _log_density(self, x: Tensor, context: Tensor | None) -> Tensor:
        z = self.network("encoder", context)(x)
        _, jac = jacobian(self.decoder, z, context)
        gram = jac.transpose(-1, -2) @ jac
        return self.base.log_prob(z) - 0.5 * torch.linalg.slogdet(gram)[1]

    def to_distribution(self, context: Tensor | None = None) -> FlowDistribution:
        r"""Not available: raises a ValueError, since the model has no density on $\mathbb{R}^D$.

        A `torch.distributions.Distribution`'s `log_prob` is a density on its support in $\mathbb{R}^D$; the
        samples of an injective flow lie on a $d$-dimensional manifold, and its `log_prob` is a density on
        that manifold (use `log_prob` and `sample` directly).

        Raises:
            ValueError: always.
        """
        raise ValueError(
            "InjectiveFlow.to_distribution: the samples lie on a d-dimensional manifold in R^D, so the model has no "
            "density on R^D for a torch Distribution's log_prob; its log_prob is a density on the manifold (use "
            "log_prob and sample directly)"
        )

    def distance_to_manifold(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """`|x - g(f(x))|`: the distance of `x` to its projection onto the learned manifold, batch shape."""
        return (x - self.reconstruct(x, context)).norm(dim=-1)


@preset("free-form", "free-form flow: residual MLPs as encoder and decoder", hidden=(64, 64))
def _free_form_flow(features: int, hidden: Sequence[int], context: int = 0) -> FreeFormFlow:
    encoder, decoder = (ResidualMLP(features, hidden, context=context) for _ in range(2))
    return FreeFormFlow(encoder, decoder, features, context=context)
