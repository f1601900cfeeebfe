r"""Free-energy profiles of (reweighted) samples along one coordinate, with their errors; blocked means.

For samples $x_i$ with importance weights $w_i$ (e.g. from a Boltzmann generator, $w = e^{-u}/q$) and a
coordinate $s(x)$ (a dihedral angle), the free energy along $s$ in units of $kT$ is

$$
F(s) = -\log p(s), \qquad \hat p_b = \frac{\sum_{i: s_i \in b} w_i}{h \sum_i w_i}
$$

on bins $b$ of width $h$ (no shift is fitted; an empty bin has $F = +\infty$).

Errors per bin, chosen by what the samples are:

* `"bootstrap"` (independent samples, e.g. flow samples): the standard deviation of $\hat F_b$ over bootstrap resamples
  of the $(s_i, w_i)$ pairs (Efron & Tibshirani 1993), which carries the variance of the self-normalised weights;
* `"blocks"` (a time series, e.g. MD frames): the standard error of the mean of $\hat F_b$ over contiguous blocks,
  $\mathrm{sd}_B(\hat F_b) / \sqrt B$, valid when the blocks are longer than the autocorrelation time (Flyvbjerg &
  Petersen 1989).

[`blocked_mean`][flowkit.stats.blocked_mean] is the same blocking for the mean of an observable (e.g.
$P(\phi > 0)$ of an MD run).

References:
    Efron & Tibshirani, *An Introduction to the Bootstrap*, Chapman & Hall 1993; Flyvbjerg & Petersen,
    *Error estimates on averages of correlated data*, J. Chem. Phys. 91 (1989); Noé, Olsson, Köhler & Wu,
    *Boltzmann generators*, Science 365 (2019), for free energies of reweighted flow samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import check_number

__all__ = ["FreeEnergyProfile", "free_energy_profile", "blocked_mean"]

_ERRORS = ("bootstrap", "blocks", None)


def _values(x: object, name: str, where: str) -> np.ndarray:
    """`x` (tensor, array or sequence) as a 1-D float64 array, refusing NaN."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    array = np.asarray(x, dtype=np.float64)
    if array.ndim != 1 or array.size < 2:
        raise ValueError(f"{where}: {name} must be a 1-D array of at least 2 values, got shape {array.shape}")
    if np.isnan(array).any():
        raise ValueError(f"{where}: {name} contains {int(np.isnan(array).sum())} NaN value(s)")
    return array


@dataclass(frozen=True)
class FreeEnergyProfile:
    r"""A free-energy profile $F = -\log p$ in kT on bins, with its error per bin.

    Attributes:
        edges: bin edges, `(bins + 1,)`.
        free_energy: $F$ per bin in kT, `(bins,)` (`inf` in an empty bin).
        error: its standard error per bin, `(bins,)` (NaN where it cannot be estimated; all NaN for `error=None`).
        method: how the error was estimated: `"bootstrap"`, `"blocks"` or None.
    """

    edges: np.ndarray
    free_energy: np.ndarray
    error: np.ndarray
    method: str | None

    @property
    def centres(self) -> np.ndarray:
        """Bin centres, `(bins,)`."""
        return 0.5 * (self.edges[1:] + self.edges[:-1])

    def compare(self, reference: FreeEnergyProfile, below: float = 5.0) -> dict[str, float | int | None]:
        r"""Deviation from a reference profile on the bins where the reference is below `below` kT above its minimum.

        Returns a dict: `bins` (compared), `empty_bins` (compared bins where this profile is empty),
        `max_abs_kT` and `rms_kT` of $F - F_{ref}$ (None when a compared bin is empty), `bins_within_0.5kT`,
        and `max_abs_over_error`, the largest $|F - F_{ref}|$ over the combined error
        $\sqrt{\sigma^2 + \sigma_{ref}^2}$ (None when either profile has no errors).

        Raises:
            ValueError: when the profiles have different bins or the reference is empty everywhere.
        """
        if self.edges.shape != reference.edges.shape or not np.allclose(self.edges, reference.edges):
            raise ValueError("FreeEnergyProfile.compare: the profiles must have the same bins")
        below = check_number(below, "below", where="FreeEnergyProfile.compare", positive=True)
        finite = np.isfinite(reference.free_energy)
        if not finite.any():
            raise ValueError("FreeEnergyProfile.compare: the reference profile is empty in every bin")
        keep = finite & (reference.free_energy - reference.free_energy[finite].min() < below)
        diff = self.free_energy[keep] - reference.free_energy[keep]
        empty = int((~np.isfinite(diff)).sum())
        out: dict[str, float | int | None] = {"bins": int(keep.sum()), "empty_bins": empty}
        out["max_abs_kT"] = None if empty else float(np.max(np.abs(diff)))
        out["rms_kT"] = None if empty else float(np.sqrt(np.mean(diff**2)))
        out["bins_within_0.5kT"] = int((np.abs(diff) <= 0.5).sum())
        if empty:
            out["max_abs_over_error"] = None
            return out
        combined = np.sqrt(self.error[keep] ** 2 + reference.error[keep] ** 2)
        ratio = np.abs(diff) / combined
        out["max_abs_over_error"] = float(np.max(ratio)) if np.isfinite(ratio).all() else None
        return out


def _histogram_free_energy(values: np.ndarray, weights: np.ndarray | None, edges: np.ndarray) -> np.ndarray:
    """`-log` of the (weighted) histogram density on `edges` (values outside the range count in the total)."""
    total = float(values.size if weights is None else weights.sum())
    counts, _ = np.histogram(values, bins=edges, weights=weights)
    with np.errstate(divide="ignore"):
        return -np.log(counts / (total * np.diff(edges)))


def free_energy_profile(
    values: object,
    log_weights: object | None = None,
    *,
    bins: int = 36,
    range: tuple[float, float] = (-math.pi, math.pi),
    error: str | None = "bootstrap",
    resamples: int = 200,
    blocks: int = 10,
    seed: int = 0,
) -> FreeEnergyProfile:
    r"""The free energy $F(s) = -\log p(s)$ in kT of samples of a coordinate $s$, reweighted, with errors per bin.

    Arguments:
        values: the coordinate of each sample, `(n,)` (e.g. $\phi$ in radians). Values outside `range`
            count in the normalisation but fall in no bin.
        log_weights: log importance weights `(n,)` (self-normalised; `-inf` for a zero weight), or None
            for equal weights.
        bins: number of equal bins on `range`.
        range: the interval of the profile (default $[-\pi, \pi]$, for a dihedral angle).
        error: `"bootstrap"` (independent samples: resample the `(value, weight)` pairs), `"blocks"`
            (a time series: contiguous blocks), or None (no error).
        resamples: bootstrap resamples.
        blocks: number of contiguous blocks.
        seed: seed of the bootstrap resamples.

    Returns:
        A [`FreeEnergyProfile`][flowkit.stats.FreeEnergyProfile]; a bin empty in some resamples or
        blocks gets the spread of the others (NaN where fewer than two are finite).

    Raises:
        ValueError: for NaN values, weights of another length, NaN or `+inf` log weights, all weights
            zero, or a bad `bins`, `range`, `error`, `resamples` or `blocks`.

    Examples:
        >>> import numpy as np
        >>> phi = np.random.default_rng(0).uniform(-np.pi, np.pi, 10_000)
        >>> profile = free_energy_profile(phi, bins=4, resamples=50)
        >>> bool(np.allclose(profile.free_energy, np.log(2 * np.pi), atol=0.05))
        True
    """
    where = "free_energy_profile"
    x = _values(values, "values", where)
    bins = int(check_number(bins, "bins", where=where, integer=True, low=1))
    lo, hi = (check_number(v, "range", where=where) for v in range)
    if not hi > lo:
        raise ValueError(f"{where}: range must be (low, high) with low < high, got {range}")
    if error not in _ERRORS:
        raise ValueError(f"{where}: error must be one of {_ERRORS}, got {error!r}")
    w = None
    if log_weights is not None:
        lw = _values(log_weights, "log_weights", where)
        if lw.shape != x.shape:
            raise ValueError(f"{where}: log_weights must have one value per sample, got {lw.shape} for {x.shape}")
        if np.isposinf(lw).any():
            raise ValueError(f"{where}: log_weights contains +inf")
        if np.isneginf(lw).all():
            raise ValueError(f"{where}: every weight is zero")
        w = np.exp(lw - lw.max())
    edges = np.linspace(lo, hi, bins + 1)
    free = _histogram_free_energy(x, w, edges)
    if error is None:
        return FreeEnergyProfile(edges, free, np.full(bins, np.nan), None)
    if error == "bootstrap":
        resamples = int(check_number(resamples, "resamples", where=where, integer=True, low=2))
        rng = np.random.default_rng(seed)
        replicas = []
        for _ in np.arange(resamples):
            idx = rng.integers(0, x.size, x.size)
            if (sub_w := None if w is None else w[idx]) is None or sub_w.sum() > 0:
                replicas.append(_histogram_free_energy(x[idx], sub_w, edges))
        err = _spread(np.array(replicas).reshape(-1, bins), ddof=1)
    else:
        blocks = int(check_number(blocks, "blocks", where=where, integer=True, low=2))
        if blocks > x.size:
            raise ValueError(f"{where}: blocks ({blocks}) must not exceed the number of samples ({x.size})")
        parts = [
            _histogram_free_energy(x[i], None if w is None else w[i], edges)
            for i in np.array_split(np.arange(x.size), blocks)
            if w is None or w[i].sum() > 0
        ]
        err = _spread(np.array(parts).reshape(-1, bins), ddof=1) / math.sqrt(max(len(parts), 1))
    return FreeEnergyProfile(edges, free, err, error)


def _spread(replicas: np.ndarray, ddof: int) -> np.ndarray:
    """Standard deviation per column over the finite entries (NaN where fewer than two are finite)."""
    finite = np.isfinite(replicas)
    count = finite.sum(0)
    safe = np.where(finite, replicas, 0.0)
    mean = safe.sum(0) / np.maximum(count, 1)
    var = np.where(finite, (replicas - mean) ** 2, 0.0).sum(0) / np.maximum(count - ddof, 1)
    return np.where(count >= 2, np.sqrt(var), np.nan)


def blocked_mean(values: object, blocks: int = 10) -> tuple[float, float]:
    r"""Mean of a time series and its blocked standard error $\mathrm{sd}_B(\bar x_b) / \sqrt B$.

    The error is valid when a block is longer than the autocorrelation time (Flyvbjerg & Petersen 1989).

    Arguments:
        values: the observable along the series, `(n,)` (e.g. the indicator $\phi > 0$ of MD frames).
        blocks: number of blocks, at least 2 and at most `n`.

    Returns:
        `(mean, standard_error)` as floats.

    Raises:
        ValueError: for non-finite values or a bad `blocks`.
    """
    where = "blocked_mean"
    x = _values(values, "values", where)
    if not np.isfinite(x).all():
        raise ValueError(f"{where}: values contains non-finite values")
    blocks = int(check_number(blocks, "blocks", where=where, integer=True, low=2))
    if blocks > x.size:
        raise ValueError(f"{where}: blocks ({blocks}) must not exceed the number of values ({x.size})")
    means = np.array([part.mean() for part in np.array_split(x, blocks)])
    return float(x.mean()), float(means.std(ddof=1) / math.sqrt(blocks))
