r"""Dependent data sets: training points that are correlated, as in Kirchler et al., ICML 2023.

The synthetic sets follow the paper's: a latent pair per point, jointly Gaussian over the points,
$\operatorname{vec}(Z) \sim \mathcal N(0, \Sigma \otimes I_2)$, pushed through a fixed 2-D map (`abs`, `sign`, `cres`,
`sine`, `ccube`, after the paper's `to_abs`, ...). Two kinds of $\Sigma$:

- [`equicorrelated_groups`][flowkit.data.equicorrelated_groups]: groups of Pareto sizes, correlation $\rho_g$ within
  group $g$, one $\rho$ for all groups or, as the paper's `equi_*` sets, $\rho_g \sim U(0.5, 0.99)$ per group
  (`rho=(0.5, 0.99)`);
- [`random_kinship`][flowkit.data.random_kinship]: $\Sigma = \lambda I + (1 - \lambda) K$ with a random dense
  correlation matrix $K$ (built as scikit-learn's `make_sparse_spd_matrix`, like the paper's `rm_*` sets).

Validation and test points are independent draws of the same marginal, so a flow that mistakes the training set's
correlations for density pays on them. [`stock_pairs`][flowkit.data.stock_pairs] is a real grouped set: the S&P 500 and
NASDAQ indices on each trading day, from the files that ship with the `arch` package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from .._validation import check_number
from .splits import Splits, _tensor

__all__ = ["DependentSplits", "DEPENDENT_SHAPES", "equicorrelated_groups", "random_kinship", "stock_pairs"]


def _abs(z: np.ndarray) -> np.ndarray:
    return np.stack([z[:, 0], np.abs(z[:, 0]) - 1 + np.exp(-1.5) * z[:, 1]], 1)


def _sign(z: np.ndarray) -> np.ndarray:
    return np.stack([z[:, 0], np.sign(z[:, 0]) + z[:, 0] + np.exp(-1.5) * z[:, 1]], 1)


def _crescent(z: np.ndarray) -> np.ndarray:
    return np.stack([z[:, 0], 0.5 * z[:, 0] ** 2 - 1 + np.exp(-1.0) * z[:, 1]], 1)


def _sine(z: np.ndarray) -> np.ndarray:
    return np.stack([z[:, 0], np.sin(5 * z[:, 0]) + np.exp(-1.0) * z[:, 1]], 1)


def _crescent_cube(z: np.ndarray) -> np.ndarray:
    return np.stack([0.2 * z[:, 0] ** 3 + z[:, 1], z[:, 0]], 1)


#: The 2-D maps from a standard normal pair to the data, by name (the paper's synthetic shapes).
DEPENDENT_SHAPES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "abs": _abs,
    "sign": _sign,
    "cres": _crescent,
    "sine": _sine,
    "ccube": _crescent_cube,
}


@dataclass(repr=False)
class DependentSplits(Splits):
    """[`Splits`][flowkit.data.Splits] whose training points are dependent, with their dependence structure.

    Attributes:
        groups: the group label of each training point (equicorrelated groups), else None.
        kinship: the `(n, n)` float64 kinship matrix of the training points, else None.
        truth: the true parameters of synthetic sets (`{"rho": ...}` or `{"lam": ...}`), else empty.
        val_groups: the group labels of the validation points when they are related among
            themselves (real data), else None (independent points).
        test_groups: the same for the test points.
    """

    groups: Tensor | None = None
    kinship: Tensor | None = None
    truth: dict = field(default_factory=dict)
    val_groups: Tensor | None = None
    test_groups: Tensor | None = None

    def __repr__(self) -> str:
        kind = "groups" if self.groups is not None else "kinship"
        return f"{super().__repr__()[:-1]}, {kind}, truth={self.truth})"


def _shape(shape: str, where: str) -> Callable[[np.ndarray], np.ndarray]:
    if shape not in DEPENDENT_SHAPES:
        raise ValueError(f"{where}: unknown shape {shape!r}; choose one of {', '.join(DEPENDENT_SHAPES)}")
    return DEPENDENT_SHAPES[shape]


def _independent(fn: Callable[[np.ndarray], np.ndarray], n_val: int, n_test: int, rng: np.random.Generator) -> tuple:
    return _tensor(fn(rng.standard_normal((n_val, 2)))), _tensor(fn(rng.standard_normal((n_test, 2))))


def _pareto_sizes(n: int, alpha: float, max_group: int, rng: np.random.Generator) -> np.ndarray:
    sizes: list[int] = []
    while sum(sizes) < n:
        size = 1 + int(np.round(rng.pareto(alpha)))
        sizes.append(int(min(size, max_group, n - sum(sizes))))
    return np.asarray(sizes)


def equicorrelated_groups(
    shape: str = "cres",
    n: int = 2000,
    rho: float | tuple[float, float] = 0.7,
    *,
    alpha: float = 0.5,
    max_group: int = 100,
    n_val: int = 1000,
    n_test: int = 5000,
    seed: int = 0,
) -> DependentSplits:
    r"""Equicorrelated groups of points (the paper's `equi_*` sets).

    Group sizes are $1 + \operatorname{round}(\operatorname{Pareto}(\alpha))$, capped at `max_group`, until `n` points;
    within group $g$ the latents are $z_i = \sqrt{\rho_g}\, u_g + \sqrt{1 - \rho_g}\, e_i$ (correlation $\rho_g$), and
    the data are `DEPENDENT_SHAPES[shape](z)`. The paper's sets draw $\rho_g \sim U(0.5, 0.99)$ per group
    (`rho=(0.5, 0.99)`; `truth["rho"]` is then the list of the $\rho_g$, in the order of `groups`' labels).

    Arguments:
        shape: one of `abs`, `sign`, `cres`, `sine`, `ccube`.
        n: number of training points.
        rho: the correlation within every group, in `[0, 1)`, or a range `(low, high)` in
            `[0, 1)` from which each group draws its own uniformly.
        alpha: the Pareto shape of the group sizes (smaller: larger groups).
        max_group: the largest group.
        n_val: independent validation points.
        n_test: independent test points.
        seed: seed of the draws.
    """
    where = "equicorrelated_groups"
    fn = _shape(shape, where)
    n = int(check_number(n, "n", where=where, integer=True, low=2))
    if isinstance(rho, (tuple, list)):
        if len(rho) != 2:
            raise ValueError(f"{where}: rho must be a number or a range (low, high), got {len(rho)} numbers")
        low, high = (check_number(r, "rho", where=where, low=0.0, below=1.0) for r in rho)
        if low > high:
            raise ValueError(f"{where}: the range rho = ({low}, {high}) must have low <= high")
    else:
        low = high = check_number(rho, "rho", where=where, low=0.0, below=1.0)
    alpha = check_number(alpha, "alpha", where=where, positive=True)
    max_group = int(check_number(max_group, "max_group", where=where, integer=True, low=1))
    rng = np.random.default_rng(seed)
    sizes = _pareto_sizes(n, alpha, max_group, rng)
    groups = np.repeat(np.arange(len(sizes)), sizes)
    rhos = rng.uniform(low, high, len(sizes)) if low < high else np.full(len(sizes), low)
    shared = rng.standard_normal((len(sizes), 2))[groups]
    r = rhos[groups, None]
    z = np.sqrt(r) * shared + np.sqrt(1 - r) * rng.standard_normal((n, 2))
    val, test = _independent(fn, n_val, n_test, rng)
    info = {"source": "generated", "seed": seed, "group_sizes": sizes.tolist()}
    truth = {"rho": low if low == high else rhos.tolist()}
    return DependentSplits(
        f"equi_{shape}", _tensor(fn(z)), val, test, info=info, groups=torch.as_tensor(groups), truth=truth
    )


def _random_correlation(n: int, rng: np.random.Generator) -> np.ndarray:
    """scikit-learn's `make_sparse_spd_matrix(n, alpha=0, smallest_coef=0.5, largest_coef=0.99, norm_diag=True)`."""
    factor = np.tril(rng.uniform(0.5, 0.99, (n, n)), -1)
    order = rng.permutation(n)
    factor = factor[order][:, order] - np.eye(n)
    gram = factor.T @ factor
    scale = 1 / np.sqrt(np.diag(gram))
    kinship = gram * scale[:, None] * scale[None, :]
    kinship = (kinship + kinship.T) / 2
    np.fill_diagonal(kinship, 1.0)
    return kinship


def random_kinship(
    shape: str = "cres", n: int = 2000, lam: float = 0.5, *, n_val: int = 1000, n_test: int = 5000, seed: int = 0
) -> DependentSplits:
    r"""Points related by a random kinship matrix (the paper's `rm_*` sets).

    $K$ is the correlation matrix of $F^\top F$, $F = P(L - I)P^\top$ with $L$ strictly lower triangular,
    entries uniform on $[0.5, 0.99]$, and $P$ a random permutation (scikit-learn's `make_sparse_spd_matrix`,
    as the paper's code); $\Sigma = \lambda I + (1 - \lambda) K$, $\operatorname{vec}(Z) \sim
    \mathcal N(0, \Sigma \otimes I_2)$ and the data are `DEPENDENT_SHAPES[shape](z)`. Costs $O(n^3)$.

    Arguments:
        shape: one of `abs`, `sign`, `cres`, `sine`, `ccube`.
        n: number of training points.
        lam: the weight $\lambda$ of the identity, in `(0, 1]`.
        n_val: independent validation points.
        n_test: independent test points.
        seed: seed of the draws.
    """
    where = "random_kinship"
    fn = _shape(shape, where)
    n = int(check_number(n, "n", where=where, integer=True, low=2))
    lam = check_number(lam, "lam", where=where, positive=True, high=1.0)
    rng = np.random.default_rng(seed)
    kinship = _random_correlation(n, rng)
    sigma = lam * np.eye(n) + (1 - lam) * kinship
    z = np.linalg.cholesky(sigma) @ rng.standard_normal((n, 2))
    val, test = _independent(fn, n_val, n_test, rng)
    info = {"source": "generated", "seed": seed}
    return DependentSplits(
        f"rm_{shape}", _tensor(fn(z)), val, test, info=info, kinship=torch.as_tensor(kinship), truth={"lam": lam}
    )


def stock_pairs(*, val: float = 0.15, test: float = 0.15) -> DependentSplits:
    r"""Daily S&P 500 and NASDAQ index moves, the two indices of a day forming a group (real grouped data).

    Each point is one index on one trading day (1999-2018, from the files bundled with `arch`), with two
    features: the close-to-close log return and the log of the high/low range, in percent, standardised on
    the training days. Days are split in time order (training, validation, test); every split is grouped.

    Arguments:
        val: fraction of days for validation.
        test: fraction of days for testing.

    Raises:
        ImportError: if `arch` is not installed (`pip install arch`).
    """
    try:
        from arch.data import nasdaq, sp500
    except ImportError as error:  # pragma: no cover - arch is in the dev extra
        raise ImportError("stock_pairs needs the arch package (pip install arch)") from error
    for label, fraction in (("val", val), ("test", test)):
        check_number(fraction, label, where="stock_pairs", positive=True, below=0.5)
    frames = [sp500.load(), nasdaq.load()]
    days = frames[0].index.intersection(frames[1].index)
    features = []
    for frame in frames:
        frame = frame.loc[days]
        ret = 100 * np.diff(np.log(frame["Adj Close"].to_numpy(dtype=np.float64)))
        spread = 100 * np.log(frame["High"].to_numpy(dtype=np.float64) / frame["Low"].to_numpy(dtype=np.float64))[1:]
        features.append(np.stack([ret, np.log(np.maximum(spread, 1e-3))], 1))
    points = np.stack(features, 1)  # (days, 2 indices, 2 features)
    n_days = points.shape[0]
    n_test, n_val = int(round(test * n_days)), int(round(val * n_days))
    cuts = (n_days - n_val - n_test, n_days - n_test)
    parts = np.split(points, cuts)
    mean, std = parts[0].reshape(-1, 2).mean(0), parts[0].reshape(-1, 2).std(0)
    train, val_x, test_x = (_tensor(((p - mean) / std).reshape(-1, 2)) for p in parts)
    groups = [torch.arange(len(part)).repeat_interleave(2) for part in parts]
    info = {"source": "arch.data.sp500, arch.data.nasdaq", "days": n_days, "features": ["log return", "log range"]}
    return DependentSplits(
        "stock_pairs", train, val_x, test_x, info=info, groups=groups[0], val_groups=groups[1], test_groups=groups[2]
    )
