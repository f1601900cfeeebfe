r"""Embedding networks: the summary of a condition that a conditional flow takes as its context.

A conditional flow $q(\theta \mid c)$ takes a context vector $c \in \mathbb{R}^C$. Simulation-based inference
conditions on observations that are rarely such a vector: a spectrum of hundreds of points, a set of a varying
number of iid observations. An embedding $e_\psi$ maps the raw condition $y$ to $c = e_\psi(y)$, and
[`EmbeddedFlow`][flowkit.flows.EmbeddedFlow] trains it jointly with the flow, by the flow's own objective:
$\max_{\phi, \psi} \mathbb{E}\, \log q_\phi(\theta \mid e_\psi(y))$.

- [`MLPEmbedding`][flowkit.embeddings.MLPEmbedding]: a vector `(..., L)`, through an MLP;
- [`DeepSetEmbedding`][flowkit.embeddings.DeepSetEmbedding]: a set of iid observations `(..., N, d)` (NaN rows
  pad sets of fewer observations), as $\rho(\mathrm{pool}_n\, \phi(y_n))$, invariant to their order;
- [`Conv1dEmbedding`][flowkit.embeddings.Conv1dEmbedding]: a spectrum `(..., L)` or `(..., k, L)`, through 1-D
  convolutions and an MLP;
- [`StandardizedEmbedding`][flowkit.embeddings.StandardizedEmbedding]: the z-score of the condition with fixed
  statistics of the training simulations, before another embedding (or alone, for a vector).

Every embedding checks its input (shape, dtype, finiteness) and says what is wrong with a `ValueError`, and saves
and loads with [`flowkit.io`][flowkit.io] inside the flow that holds it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ._config import Configurable
from ._validation import check_number, module_dtype, outermost
from .nn import MLP
from .nn import activation as make_activation

__all__ = [
    "ConditionEmbedding",
    "MLPEmbedding",
    "DeepSetEmbedding",
    "Conv1dEmbedding",
    "StandardizedEmbedding",
    "POOLINGS",
]

#: The poolings of [`DeepSetEmbedding`][flowkit.embeddings.DeepSetEmbedding].
POOLINGS = ("mean", "sum")


def _sizes(hidden: Sequence[int], name: str, where: str) -> tuple[int, ...]:
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
        raise ValueError(f"{where}: {name} must be a sequence of layer sizes, got {hidden!r}")
    return tuple(int(check_number(h, f"every {name} size", where=where, integer=True, low=1)) for h in hidden)


class ConditionEmbedding(Configurable, nn.Module):
    """The base of the embeddings: a network from a condition of shape `condition_shape` to `out_features`.

    A subclass sets `condition_shape` (its leading entry `None` for a set of any size) and `out_features`,
    and implements `embed`; `forward` checks the condition first (at the outermost flowkit call).

    Attributes:
        condition_shape: the event shape of one condition (`None` for a dimension of any size).
        out_features: the size `C` of the embedding, the context of the flow.
    """

    _flowkit_register = False
    condition_shape: tuple[int | None, ...]
    out_features: int

    def embed(self, condition: Tensor) -> Tensor:
        """The embedding `(..., out_features)` of a checked condition `(..., *condition_shape)`."""
        raise NotImplementedError

    def forward(self, condition: Tensor) -> Tensor:
        """The embedding `(..., out_features)` of conditions `(..., *condition_shape)`."""
        with outermost() as check:
            if check:
                self.check(condition, type(self).__name__)
            return self.embed(condition)

    def check(self, condition: object, where: str) -> None:
        """Raise a `ValueError` naming the problem unless `condition` is a batch of conditions of this embedding."""
        shown = "(..., " + ", ".join("N" if s is None else str(s) for s in self.condition_shape) + ")"
        if not isinstance(condition, Tensor):
            raise ValueError(f"{where}: the context must be a torch.Tensor of shape {shown}, got {type(condition)}")
        if not condition.is_floating_point():
            raise ValueError(f"{where}: the context must have a floating dtype, got {condition.dtype}")
        dtype = module_dtype(self)
        if dtype is not None and condition.dtype != dtype:
            raise ValueError(
                f"{where}: the context has dtype {condition.dtype} but the embedding's parameters are {dtype}; "
                f"convert one of them (e.g. context.to({dtype}))"
            )
        n = len(self.condition_shape)
        tail = tuple(condition.shape[condition.dim() - n :]) if condition.dim() >= n else None
        if tail is None or any(s is not None and s != t for s, t in zip(self.condition_shape, tail, strict=True)):
            raise ValueError(
                f"{where}: the context has shape {tuple(condition.shape)}, but {type(self).__name__} takes "
                f"conditions of shape {shown}"
            )
        self._check_values(condition, where)

    def _check_values(self, condition: Tensor, where: str) -> None:
        if not bool(torch.isfinite(condition).all()):
            bad = int((~torch.isfinite(condition)).sum())
            raise ValueError(f"{where}: the context contains {bad} non-finite value(s) (NaN or inf)")


class MLPEmbedding(ConditionEmbedding):
    r"""An MLP from a condition vector `(..., in_features)` to `out_features`.

    Arguments:
        in_features: the size `L` of the condition.
        out_features: the size `C` of the embedding.
        hidden: hidden sizes.
        activation: the hidden layers' activation (see [`activation`][flowkit.nn.activation]).

    Examples:
        >>> import torch
        >>> embedding = MLPEmbedding(10, 4, hidden=(16,))
        >>> embedding(torch.randn(3, 10)).shape
        torch.Size([3, 4])
    """

    def __init__(
        self, in_features: int, out_features: int, hidden: Sequence[int] = (64, 64), activation: str = "relu"
    ) -> None:
        super().__init__()
        where = "MLPEmbedding"
        in_features = int(check_number(in_features, "in_features", where=where, integer=True, low=1))
        self.out_features = int(check_number(out_features, "out_features", where=where, integer=True, low=1))
        self.condition_shape = (in_features,)
        self.net = MLP(in_features, self.out_features, _sizes(hidden, "hidden", where), activation)

    def embed(self, condition: Tensor) -> Tensor:
        return self.net(condition)


class DeepSetEmbedding(ConditionEmbedding):
    r"""A permutation-invariant embedding of a set of iid observations (Deep Sets), of any number per condition.

    For observations $y_1, \dots, y_N \in \mathbb{R}^d$,

    $$
    e(y_{1:N}) = \rho\Big(\big[\operatorname{pool}_{n=1}^{N} \phi(y_n),\ \log N\big]\Big),
    $$

    with $\phi$ and $\rho$ MLPs and the pooling the mean or the sum; a permutation of the observations leaves the
    embedding unchanged. With mean pooling, $\log N$ (`counts=True`, the default) tells $\rho$ how many
    observations there are, on which a posterior's width depends. A batch holds sets of different sizes padded to
    a common `N` with rows of NaN (as sbi's `PermutationInvariantEmbedding` takes them): a padded row is no
    observation. A row partly NaN, a set with no observation, or an infinite value is a `ValueError`.

    Arguments:
        observation_features: the size `d` of one observation.
        out_features: the size `C` of the embedding.
        hidden: hidden sizes of $\phi$ and of $\rho$.
        set_features: the size of $\phi$'s output, the pooled summary.
        pooling: `"mean"` or `"sum"`.
        counts: give $\rho$ the log of the number of observations too.
        activation: the MLPs' activation.

    References:
        Zaheer, Kottur, Ravanbakhsh, Poczos, Salakhutdinov & Smola, *Deep Sets*, NeurIPS 2017 (arXiv:1703.06114);
        Chan, Perrone, Spence, Jenkins, Mathieson & Song, *A likelihood-free inference framework for population
        genetic data using exchangeable neural networks*, NeurIPS 2018.

    Examples:
        >>> import torch
        >>> embedding = DeepSetEmbedding(2, 4, hidden=(16,), set_features=8)
        >>> y = torch.randn(3, 5, 2)
        >>> y[0, 3:] = float("nan")  # the first set has 3 observations, the others 5
        >>> embedding(y).shape
        torch.Size([3, 4])
    """

    def __init__(
        self,
        observation_features: int,
        out_features: int,
        hidden: Sequence[int] = (64, 64),
        set_features: int = 64,
        pooling: str = "mean",
        counts: bool = True,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        where = "DeepSetEmbedding"
        d = int(check_number(observation_features, "observation_features", where=where, integer=True, low=1))
        self.out_features = int(check_number(out_features, "out_features", where=where, integer=True, low=1))
        width = int(check_number(set_features, "set_features", where=where, integer=True, low=1))
        if pooling not in POOLINGS:
            raise ValueError(f"{where}: pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        if not isinstance(counts, bool):
            raise ValueError(f"{where}: counts must be True or False, got {counts!r}")
        hidden = _sizes(hidden, "hidden", where)
        self.condition_shape = (None, d)
        self.pooling, self.counts = pooling, counts
        self.phi = MLP(d, width, hidden, activation)
        self.rho = MLP(width + int(counts), self.out_features, hidden, activation)

    def _check_values(self, condition: Tensor, where: str) -> None:
        missing = torch.isnan(condition)
        padded = missing.all(-1)
        if bool((missing.any(-1) & ~padded).any()):
            raise ValueError(
                f"{where}: the context has observations with some NaN entries; pad a set with whole rows of NaN"
            )
        if bool(torch.isinf(condition).any()):
            raise ValueError(f"{where}: the context contains infinite values")
        if bool(padded.all(-1).any()):
            raise ValueError(f"{where}: a set in the context has no observation (every row is NaN padding)")

    def embed(self, condition: Tensor) -> Tensor:
        present = ~torch.isnan(condition).all(-1, keepdim=True)  # (..., N, 1)
        h = self.phi(torch.where(present, condition, torch.zeros_like(condition))) * present
        pooled = h.sum(-2)
        n = present.sum(-2).to(condition.dtype)  # (..., 1)
        if self.pooling == "mean":
            pooled = pooled / n
        if self.counts:
            pooled = torch.cat([pooled, n.log()], dim=-1)
        return self.rho(pooled)


class Conv1dEmbedding(ConditionEmbedding):
    r"""A 1-D convolutional embedding of spectra or time series: convolutions and pooling, then an MLP.

    Each block is a same-padded `Conv1d` of `kernel` taps, the activation and an average pooling by 2; the
    flattened last feature map goes through an MLP to `out_features`. A condition is `(..., L)` with one
    channel (a spectrum of `L` points), or `(..., in_channels, L)` (a spectrum and its noise level, say).

    Arguments:
        length: the number `L` of points.
        out_features: the size `C` of the embedding.
        channels: output channels of the convolutional blocks (each halves the length; `L` must allow them).
        kernel: odd kernel size.
        hidden: hidden sizes of the final MLP.
        in_channels: input channels (1: conditions `(..., L)`).
        activation: the activation (see [`activation`][flowkit.nn.activation]).

    Examples:
        >>> import torch
        >>> embedding = Conv1dEmbedding(64, 8, channels=(4, 8), hidden=(16,))
        >>> embedding(torch.randn(3, 64)).shape
        torch.Size([3, 8])
    """

    def __init__(
        self,
        length: int,
        out_features: int,
        channels: Sequence[int] = (16, 32),
        kernel: int = 5,
        hidden: Sequence[int] = (64,),
        in_channels: int = 1,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        where, act = "Conv1dEmbedding", activation
        length = int(check_number(length, "length", where=where, integer=True, low=1))
        self.out_features = int(check_number(out_features, "out_features", where=where, integer=True, low=1))
        kernel = int(check_number(kernel, "kernel", where=where, integer=True, low=1))
        if kernel % 2 == 0:
            raise ValueError(f"{where}: kernel must be odd (same padding), got {kernel}")
        in_channels = int(check_number(in_channels, "in_channels", where=where, integer=True, low=1))
        channels = _sizes(channels, "channels", where)
        if length < 2 ** len(channels):
            raise ValueError(
                f"{where}: {len(channels)} blocks halve the length {len(channels)} times, which a length of {length} "
                f"does not allow (at least {2 ** len(channels)} points); use fewer channels"
            )
        self.in_channels = in_channels
        self.condition_shape = (length,) if in_channels == 1 else (in_channels, length)
        layers: list[nn.Module] = []
        for c_in, c_out in zip((in_channels, *channels), channels, strict=False):
            layers += [nn.Conv1d(c_in, c_out, kernel, padding=kernel // 2), make_activation(act), nn.AvgPool1d(2)]
        self.convolutions = nn.Sequential(*layers)
        flat = (channels[-1] if channels else in_channels) * (length // 2 ** len(channels))
        self.head = MLP(flat, self.out_features, _sizes(hidden, "hidden", where), act)

    def embed(self, condition: Tensor) -> Tensor:
        batch = condition.shape[: condition.dim() - len(self.condition_shape)]
        grid = condition.reshape(math.prod(batch), self.in_channels, self.condition_shape[-1])
        return self.head(self.convolutions(grid).flatten(1)).reshape(*batch, self.out_features)


class StandardizedEmbedding(ConditionEmbedding):
    r"""The z-score $(y - \mu) / \sigma$ of a condition with fixed statistics, then an embedding (or none).

    Simulation outputs span scales a network trains badly on; sbi z-scores them with the statistics of the first
    round's simulations, and so does [`sbi_builder`][flowkit.inference.sbi_builder] with this module. The statistics
    have the condition's shape, or, for a set of observations (`condition_shape` `(None, d)`), one per observation
    feature, so that the set embedding stays invariant to the order of the observations. NaN padding stays NaN.

    Arguments:
        loc: the means $\mu$, flat (row-major) over `stats_shape`.
        scale: the standard deviations $\sigma$ (positive), likewise.
        condition_shape: the event shape of one condition (`None` for a set's number of observations).
        embedding: the embedding of the z-scored condition; None for a vector condition passed on as it is.

    Raises:
        ValueError: for statistics of the wrong size, a scale that is not positive, or no embedding for a
            condition that is not a vector.

    Examples:
        >>> import torch
        >>> y = 100 + 10 * torch.randn(500, 3)
        >>> z = StandardizedEmbedding.from_data(y)(y)
        >>> abs(z.mean().item()) < 1e-6, round(z.std().item(), 3)
        (True, 0.999)
    """

    def __init__(
        self,
        loc: Sequence[float],
        scale: Sequence[float],
        condition_shape: Sequence[int | None],
        embedding: ConditionEmbedding | None = None,
    ) -> None:
        super().__init__()
        where = "StandardizedEmbedding"
        shape = tuple(None if s is None else int(s) for s in condition_shape)
        stats = tuple(s for s in shape if s is not None) if shape and shape[0] is None else shape
        if any(s is None for s in stats):
            raise ValueError(f"{where}: only the leading entry of condition_shape may be None, got {shape}")
        if embedding is not None:
            if not isinstance(embedding, ConditionEmbedding):
                raise ValueError(f"{where}: embedding must be a ConditionEmbedding, got {type(embedding).__name__}")
            if tuple(embedding.condition_shape) != shape:
                raise ValueError(
                    f"{where}: the embedding takes conditions of shape {embedding.condition_shape}, not {shape}"
                )
        elif len(shape) != 1 or shape[0] is None:
            raise ValueError(f"{where}: a condition of shape {shape} needs an embedding to a vector")
        loc_t, scale_t = torch.as_tensor(loc, dtype=torch.float32), torch.as_tensor(scale, dtype=torch.float32)
        if loc_t.numel() != math.prod(stats) or scale_t.numel() != math.prod(stats):
            raise ValueError(
                f"{where}: loc and scale need {math.prod(stats)} values (the shape {stats}), "
                f"got {loc_t.numel()} and {scale_t.numel()}"
            )
        if not bool((scale_t > 0).all()) or not bool(torch.isfinite(loc_t).all()):
            raise ValueError(f"{where}: scale must be positive and loc finite")
        self.condition_shape = shape
        self.embedding = embedding
        self.out_features = embedding.out_features if embedding is not None else int(shape[0])  # type: ignore[arg-type]
        self.register_buffer("loc", loc_t.reshape(stats))
        self.register_buffer("scale", scale_t.reshape(stats))

    @classmethod
    def from_data(
        cls, y: Tensor, embedding: ConditionEmbedding | None = None, structured: bool = False
    ) -> StandardizedEmbedding:
        """The z-score with the statistics of conditions `y` `(N, *condition_shape)` (NaN padding ignored).

        Arguments:
            y: the training conditions.
            embedding: the embedding after the z-score; its `condition_shape` sets the shape (and a set's
                statistics per observation feature), else `y[0].shape`.
            structured: one mean and one deviation for all entries (sbi's `"structured"`, for spectra whose
                points share a scale); else one per entry (sbi's `"independent"`).

        Raises:
            ValueError: for `y` that is not a floating tensor with conditions of the embedding's shape.
        """
        if not isinstance(y, Tensor) or not y.is_floating_point() or y.dim() < 2:
            raise ValueError("StandardizedEmbedding.from_data: y must be a floating tensor (N, *condition_shape)")
        shape = tuple(embedding.condition_shape) if embedding is not None else tuple(y.shape[1:])
        if embedding is not None:
            embedding.check(y, "StandardizedEmbedding.from_data")
        flat = y.detach().double()
        if shape and shape[0] is None:  # a set: statistics per observation feature, over sets and observations
            flat = flat.reshape(-1, *shape[1:])
        if structured:
            flat = flat.reshape(-1, 1)
        present = ~torch.isnan(flat)
        count = present.sum(0).clamp_min(1)
        mean = torch.nansum(flat, 0) / count
        std = (torch.nansum((flat - mean).square(), 0) / (count - 1).clamp_min(1)).sqrt()
        stats = tuple(s for s in shape if s is not None)
        mean, std = mean.expand(stats) if structured else mean, std.expand(stats) if structured else std
        std = torch.where(std > 1e-14, std, torch.ones_like(std))  # a constant entry: unscaled (as sbi)
        return cls(mean.flatten().tolist(), std.flatten().tolist(), shape, embedding).to(y.dtype)

    def _check_values(self, condition: Tensor, where: str) -> None:
        if self.embedding is not None:
            self.embedding._check_values(condition, where)
        else:
            super()._check_values(condition, where)

    def embed(self, condition: Tensor) -> Tensor:
        z = (condition - self.loc) / self.scale
        return z if self.embedding is None else self.embedding.embed(z)
