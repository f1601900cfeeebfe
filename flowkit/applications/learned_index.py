r"""A flow-based learned index (NFL, Wu et al.): a monotone flow makes the keys uniform, linear models find them.

A *learned index* replaces the search of a sorted array of keys by a model of their cumulative distribution:
the position of key $k$ among $n$ sorted keys is $n F(k)$, where $F$ is the keys' CDF. Here the model is
piecewise linear: a root splits the keys' range into $M$ equal slices, one least-squares line per slice
predicts positions, and each slice records its largest errors, so the true position lies in a known window
around the prediction; a bounded binary search in that window finishes the lookup (the "last mile"), exactly.

Skewed keys (log-normal, Zipf-like, clustered) crowd into few slices, whose lines then miss by far: large
*conflicts* (position errors), wide windows, slow searches. NFL first maps the keys by a monotone
*numerical flow* $T$ fitted by maximum likelihood to a sample of them, towards a normal variable, and indexes
$u = \Phi(T(k)) \in (0, 1)$, close to uniform when the flow fits: the slices fill evenly and the errors drop.

[`KeyFlow`][flowkit.applications.learned_index.KeyFlow] is that flow: a [`Flow`][flowkit.flows.Flow] of
[`Gaussianization`][flowkit.transformers.Gaussianization] layers (trainable mixture CDFs, monotone) over a
standard normal, fitted with [`fit`][flowkit.train.fit] and
[`MaximumLikelihood`][flowkit.train.MaximumLikelihood].
[`LearnedIndex`][flowkit.applications.learned_index.LearnedIndex] is the index, on raw keys (min-max scaled)
or through a `KeyFlow`. Key generators: [`lognormal_keys`][flowkit.applications.learned_index.lognormal_keys],
[`zipf_keys`][flowkit.applications.learned_index.zipf_keys],
[`clustered_keys`][flowkit.applications.learned_index.clustered_keys].

**Contract.** Keys are float64 and sorted (unsorted keys raise a `ValueError`, or are sorted with
`sort=True`); duplicates are allowed. `lookup(q)` returns, for every query, the leftmost position `i` with
`keys[i] >= q`: NumPy's `searchsorted(keys, q, side="left")`, so a present key's first occurrence. For a key
that is present the window always holds it (the errors are measured on every distinct key); a query between
keys whose answer falls outside its window is detected and answered by a full binary search, counted in
`fallbacks`.

References:
    Wu, Zhang, Chen, Xu & Li, *NFL: Robust Learned Index via Distribution Transformation*, VLDB 2022
    (arXiv:2205.11807);
    Kraska, Beutel, Chi, Dean & Polyzotis, *The case for learned index structures*, SIGMOD 2018.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .._validation import check_number
from ..bijectors import Chain, ElementwiseTransformer
from ..distributions import StandardNormal
from ..flows import Flow
from ..train import MaximumLikelihood, fit
from ..transformers import Gaussianization

__all__ = [
    "lognormal_keys",
    "zipf_keys",
    "clustered_keys",
    "check_keys",
    "KeyFlow",
    "LearnedIndex",
    "conflicts",
]


def lognormal_keys(n: int, sigma: float = 2.0, seed: int = 0) -> np.ndarray:
    r"""`n` sorted keys $e^{\sigma \xi}$, $\xi \sim N(0, 1)$, scaled by $10^9$ (a heavy right tail).

    Examples:
        >>> from flowkit.applications.learned_index import lognormal_keys
        >>> keys = lognormal_keys(1000)
        >>> bool((keys[1:] >= keys[:-1]).all())
        True
    """
    n = check_number(n, "n", where="lognormal_keys", integer=True, low=1)
    sigma = check_number(sigma, "sigma", where="lognormal_keys", positive=True)
    rng = np.random.default_rng(seed)
    return np.sort(1e9 * np.exp(sigma * rng.standard_normal(n)))


def zipf_keys(n: int, exponent: float = 1.5, seed: int = 0) -> np.ndarray:
    r"""`n` sorted integer-valued keys drawn from a Zipf law $P(k) \propto k^{-a}$ (many duplicates), below $2^{53}$.

    Examples:
        >>> from flowkit.applications.learned_index import zipf_keys
        >>> keys = zipf_keys(1000)
        >>> bool(len(set(keys.tolist())) < 1000)
        True
    """
    n = check_number(n, "n", where="zipf_keys", integer=True, low=1)
    exponent = check_number(exponent, "exponent", where="zipf_keys", positive=True, rule="a number above 1")
    if not exponent > 1:
        raise ValueError(f"zipf_keys: exponent must be above 1, got {exponent}")
    rng = np.random.default_rng(seed)
    return np.sort(np.minimum(rng.zipf(exponent, n), 2**53).astype(np.float64))


def clustered_keys(n: int, clusters: int = 20, seed: int = 0) -> np.ndarray:
    """`n` sorted keys from `clusters` normal clusters of random centres in $[0, 10^{12}]$ and log-normal widths.

    Examples:
        >>> from flowkit.applications.learned_index import clustered_keys
        >>> clustered_keys(500, clusters=3).shape
        (500,)
    """
    n = check_number(n, "n", where="clustered_keys", integer=True, low=1)
    clusters = check_number(clusters, "clusters", where="clustered_keys", integer=True, low=1)
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0, 1e12, clusters)
    widths = 1e12 / clusters * 10 ** rng.uniform(-5, -1, clusters)
    which = rng.integers(0, clusters, n)
    return np.sort(centres[which] + widths[which] * rng.standard_normal(n))


def check_keys(keys: object, where: str, *, sort: bool = False) -> np.ndarray:
    """The keys as a 1-D float64 array, sorted: checked (or sorted, with `sort=True`).

    Raises:
        ValueError: for keys that are not a non-empty 1-D array of finite numbers, or unsorted keys without `sort`.
    """
    array = np.asarray(keys.detach().cpu() if isinstance(keys, Tensor) else keys)
    if array.ndim != 1 or array.size == 0 or array.dtype.kind not in "iuf":
        raise ValueError(f"{where}: keys must be a non-empty 1-D array of numbers, got shape {array.shape}")
    array = array.astype(np.float64)
    if not np.isfinite(array).all():
        raise ValueError(f"{where}: keys contain non-finite values")
    if sort:
        return np.sort(array)
    if (array[1:] < array[:-1]).any():
        first = int(np.flatnonzero(array[1:] < array[:-1])[0])
        raise ValueError(
            f"{where}: keys must be sorted (keys[{first + 1}] < keys[{first}]); sort them first or pass sort=True"
        )
    return array


class KeyFlow(Flow):
    r"""A monotone 1-D flow of keys: min-max scaling, standardisation and `layers` Gaussianization layers.

    The keys are scaled to $[0, 1]$ by the range of the keys it is fitted on, then standardised by the sample's
    mean and standard deviation (constants, not parameters); each layer is an
    [`ElementwiseTransformer`][flowkit.bijectors.ElementwiseTransformer] of a
    [`Gaussianization`][flowkit.transformers.Gaussianization] transformer (a trainable mixture CDF then the
    normal quantile, strictly increasing). [`transform`][flowkit.applications.learned_index.KeyFlow.transform]
    gives $u = \Phi(T(k))$, near uniform on $(0, 1)$ once fitted.

    Arguments:
        components: mixture components per layer.
        layers: number of Gaussianization layers (NFL uses a two-layer flow).

    Examples:
        >>> import torch
        >>> from flowkit.applications.learned_index import KeyFlow, lognormal_keys
        >>> flow = KeyFlow(components=4, layers=1).fit_keys(lognormal_keys(2000), steps=20)
        >>> u = flow.transform(lognormal_keys(5, seed=1))
        >>> bool(((u > 0) & (u < 1)).all())
        True
    """

    def __init__(self, components: int = 16, layers: int = 2) -> None:
        components = check_number(components, "components", where="KeyFlow", integer=True, low=1)
        layers = check_number(layers, "layers", where="KeyFlow", integer=True, low=1)
        chain = Chain(*(ElementwiseTransformer(Gaussianization(components), 1) for _ in range(layers)))
        super().__init__(chain, StandardNormal(1))
        self.components, self.layers = components, layers
        self.register_buffer("shift", torch.zeros((), dtype=torch.float64))
        self.register_buffer("scale", torch.ones((), dtype=torch.float64))

    def _standardise(self, keys: np.ndarray) -> Tensor:
        return (torch.from_numpy(np.ascontiguousarray(keys, dtype=np.float64)) - self.shift) / self.scale

    def fit_keys(
        self, keys: np.ndarray, *, sample: float = 0.1, steps: int = 500, lr: float = 1e-2, seed: int = 0
    ) -> KeyFlow:
        """Fit the flow by maximum likelihood to a random `sample` fraction of `keys` (at least 1000 of them).

        The flow is moved to float64 (positions of $10^7$ keys need it). Returns the flow itself.
        """
        where = "KeyFlow.fit_keys"
        keys = check_keys(keys, where, sort=True)
        sample = check_number(sample, "sample", where=where, positive=True, high=1)
        rng = np.random.default_rng(seed)
        size = min(keys.size, max(1000, int(sample * keys.size)))
        chosen = rng.choice(keys, size, replace=False)
        low, high = float(keys[0]), float(keys[-1])
        width = high - low if high > low else 1.0
        unit = (chosen - low) / width
        self.double()
        self.shift.fill_(low + width * float(unit.mean()))
        self.scale.fill_(width * max(float(unit.std()), 1e-12))
        data = self._standardise(chosen)[:, None]
        self._start_at_quantiles(data[:, 0])
        fit(self, MaximumLikelihood(), data, steps=steps, batch_size=min(1024, size), lr=lr, progress=False, seed=seed)
        return self

    @torch.no_grad()
    def _start_at_quantiles(self, x: Tensor) -> None:
        """Start the first layer at a kernel estimate of the sample `x` (standardised keys).

        Centres at the sample's `K` mid-quantiles, scales a quarter of the quantile gaps, equal weights.
        """
        layer = self.bijector[0]
        k, least = layer.transformer.components, layer.transformer.min_scale
        levels = torch.arange(k + 1, dtype=x.dtype) / k
        edges = torch.quantile(x, levels)
        centres = torch.quantile(x, (levels[:-1] + levels[1:]) / 2)
        scales = torch.clamp(edges.diff() / 4, min=2 * least) - least
        raw = scales + torch.log(-torch.expm1(-scales))  # the inverse of softplus
        layer.params.copy_(torch.cat([torch.zeros(k, dtype=x.dtype), centres, raw])[None])

    @torch.no_grad()
    def transform(self, keys: np.ndarray, batch_size: int = 1 << 20) -> np.ndarray:
        r"""$u = \Phi(T(k))$ of keys (a NumPy array), float64 in $[0, 1]$, nondecreasing in the key."""
        keys = np.asarray(keys, dtype=np.float64)
        out = np.empty(keys.shape, dtype=np.float64)
        flat, dest = keys.reshape(-1), out.reshape(-1)
        for start in range(0, flat.size, batch_size):
            z = self.bijector.call(self._standardise(flat[start : start + batch_size])[:, None].to(self.shift))
            dest[start : start + batch_size] = torch.special.ndtr(z[:, 0]).cpu().numpy()
        return out


def conflicts(predicted: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """Position errors `|predicted - true|`: their maximum, 99th percentile and mean (NFL's "conflicts")."""
    error = np.abs(np.asarray(predicted, np.float64) - np.asarray(true, np.float64))
    return {"max": float(error.max()), "p99": float(np.percentile(error, 99)), "mean": float(error.mean())}


class LearnedIndex:
    r"""Piecewise-linear learned index over sorted keys, with per-slice error bounds and exact lookups.

    The transformed keys $u \in [0, 1]$ (min-max scaled keys, or $\Phi(T(k))$ through a
    [`KeyFlow`][flowkit.applications.learned_index.KeyFlow]) are cut into `slices` equal intervals; on the
    distinct keys of each a least-squares line predicts the leftmost position $p$, and the slice keeps the
    largest errors below and above, $e^-$ and $e^+$, so that every present key lies in
    $[\lfloor \hat p \rfloor - e^-, \lfloor \hat p \rfloor + e^+]$. See [the module][flowkit.applications.learned_index]
    for the lookup's contract.

    Arguments:
        keys: the keys (a 1-D array of numbers); sorted unless `sort=True`.
        slices: number of linear models $M$ (default: one per 64 keys, at least 1).
        flow: a fitted `KeyFlow` to transform keys with, or None for the raw keys.
        sort: sort unsorted keys (a copy) instead of raising.

    Attributes:
        keys: the sorted float64 keys.
        fallbacks: queries answered by a full binary search so far (their answer was outside the window).

    Examples:
        >>> import numpy as np
        >>> from flowkit.applications.learned_index import LearnedIndex
        >>> keys = np.array([1.0, 2.0, 2.0, 5.0, 9.0])
        >>> LearnedIndex(keys, slices=2).lookup(np.array([2.0, 5.0, 0.0, 10.0])).tolist()
        [1, 3, 0, 5]
    """

    def __init__(
        self, keys: object, slices: int | None = None, flow: KeyFlow | None = None, sort: bool = False
    ) -> None:
        where = "LearnedIndex"
        self.keys = check_keys(keys, where, sort=sort)
        n = self.keys.size
        slices = max(1, n // 64) if slices is None else slices
        self.slices = check_number(slices, "slices", where=where, integer=True, low=1)
        if flow is not None and not isinstance(flow, KeyFlow):
            raise ValueError(f"{where}: flow must be a KeyFlow, got {type(flow).__name__}")
        self.flow = flow
        self.low, self.high = float(self.keys[0]), float(self.keys[-1])
        self.fallbacks = 0
        distinct, first = np.unique(self.keys, return_index=True)  # leftmost positions of the distinct keys
        u = self.transform(distinct)
        leaf = self._leaf(u)
        count = np.bincount(leaf, minlength=self.slices).astype(np.float64)
        su, sp = np.bincount(leaf, u, self.slices), np.bincount(leaf, first, self.slices)
        suu, sup = np.bincount(leaf, u * u, self.slices), np.bincount(leaf, u * first, self.slices)
        safe = np.maximum(count, 1)
        mean_u, mean_p = su / safe, sp / safe
        var = suu / safe - mean_u**2
        cov = sup / safe - mean_u * mean_p
        slope = np.where(var > 1e-300 * np.maximum(mean_u**2, 1), cov / np.where(var > 0, var, 1), 0.0)
        # An empty slice predicts the position where its keys would start: the number of keys below it.
        starts = np.searchsorted(leaf, np.arange(self.slices), side="left")
        empty_position = np.where(starts < distinct.size, first[np.minimum(starts, distinct.size - 1)], n)
        self.slope = slope
        self.intercept = np.where(count > 0, mean_p - slope * mean_u, empty_position.astype(np.float64))
        predicted = self._predict(u, leaf)
        below = np.zeros(self.slices, np.int64)
        above = np.zeros(self.slices, np.int64)
        np.maximum.at(below, leaf, predicted - first)
        np.maximum.at(above, leaf, first - predicted)
        self.below, self.above = below, above
        self._training_conflicts = conflicts(self._raw_prediction(u, leaf), first)

    def transform(self, keys: np.ndarray) -> np.ndarray:
        r"""The keys the models see: $\Phi(T(k))$ through the flow, or min-max scaled raw keys, in $[0, 1]$."""
        if self.flow is not None:
            return self.flow.transform(keys)
        width = self.high - self.low
        return np.clip((np.asarray(keys, np.float64) - self.low) / (width if width > 0 else 1.0), 0.0, 1.0)

    def _leaf(self, u: np.ndarray) -> np.ndarray:
        return np.clip((u * self.slices).astype(np.int64), 0, self.slices - 1)

    def _raw_prediction(self, u: np.ndarray, leaf: np.ndarray) -> np.ndarray:
        return self.intercept[leaf] + self.slope[leaf] * u

    def _predict(self, u: np.ndarray, leaf: np.ndarray) -> np.ndarray:
        raw = np.clip(self._raw_prediction(u, leaf), 0, self.keys.size)
        return np.floor(raw).astype(np.int64)

    def conflicts(self) -> dict[str, float]:
        """Max, 99th-percentile and mean |predicted - true| position error over the distinct keys (unrounded)."""
        return dict(self._training_conflicts)

    @property
    def nbytes(self) -> int:
        """Memory of the index beyond the keys: the models, the error bounds and the flow's parameters."""
        arrays = self.slope.nbytes + self.intercept.nbytes + self.below.nbytes + self.above.nbytes
        if self.flow is not None:
            arrays += sum(t.numel() * t.element_size() for t in self.flow.state_dict().values())
        return arrays

    def lookup(self, queries: object) -> np.ndarray:
        """`searchsorted(keys, queries, side="left")`, exactly: the model's window, then a bounded binary search."""
        q = np.asarray(queries, dtype=np.float64).reshape(-1)
        if not np.isfinite(q).all():
            raise ValueError("LearnedIndex.lookup: queries contain non-finite values")
        n = self.keys.size
        u = self.transform(q)
        leaf = self._leaf(u)
        guess = self._predict(u, leaf)
        lo = np.clip(guess - self.below[leaf], 0, n)
        hi = np.clip(guess + self.above[leaf] + 1, 0, n)
        left, right = lo, hi
        last = n - 1
        while True:  # lower bound in [left, right), every query at once, without masks: a finished one stays put
            active = left < right
            if not active.any():
                break
            mid = (left + right) >> 1
            less = self.keys[np.minimum(mid, last)] < q
            left = np.where(active & less, mid + 1, left)
            right = np.where(active & ~less, mid, right)
        found = left
        ok_left = (found == 0) | (self.keys[np.maximum(found - 1, 0)] < q)
        ok_right = (found == n) | (self.keys[np.minimum(found, n - 1)] >= q)
        bad = ~(ok_left & ok_right)
        if bad.any():
            found[bad] = np.searchsorted(self.keys, q[bad], side="left")
            self.fallbacks += int(bad.sum())
        return found
