r"""Heavy-tailed datasets: the mTAF synthetic copula data and daily stock-index returns from `arch`.

**mTAF synthetic data** (Laszkiewicz et al. 2022, after their `copula_generator`): a Gaussian copula whose correlation
matrix has `D` random symmetric pairs of off-diagonal entries equal to 0.25 (redrawn until positive definite), with the
marginals, in order: `D/4` normal, `D/8` two-component and `D/8` three-component normal mixtures, normal mixtures for
the rest, and the last `heavy` ones two-component mixtures of Student-t with `df` degrees of freedom. Means are drawn
from $U(-4, 4)$, scales from $U(1, 2)$, mixture weights are equal. A point is $x_j = F_j^{-1}(\Phi(g_j))$ with
$g \sim \mathcal N(0, \Sigma)$; the quantile functions are found by bisection (on the survival function in the upper
half, so the far tails keep their digits). A copula of scipy replaces the reference's `openturns`.

**Returns**: percentage daily log returns $100 \log(P_t / P_{t-1})$ of the adjusted closes of the
S&P 500 and the NASDAQ composite (1999-2018, 5030 days, `D = 2`), from the data files bundled with
the `arch` package (`pip install flowkit[tails]`); nothing is downloaded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
from scipy import special

from .._validation import check_number
from .splits import Splits, _tensor, split_array

__all__ = ["mtaf_synthetic", "stock_returns", "heavy_tailed", "HEAVY_TAILED_DATASETS"]


def _correlation(features: int, rng: np.random.Generator) -> np.ndarray:
    pairs = np.array(np.triu_indices(features, 1)).T
    for _ in range(1000):
        corr = np.eye(features)
        chosen = pairs[rng.choice(len(pairs), size=min(features, len(pairs)), replace=False)]
        corr[chosen[:, 0], chosen[:, 1]] = corr[chosen[:, 1], chosen[:, 0]] = 0.25
        if np.linalg.eigvalsh(corr).min() > 1e-6:
            return corr
    raise RuntimeError("no positive definite correlation matrix found")  # pragma: no cover


def _normal_pdf(u: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * u * u) / np.sqrt(2 * np.pi)


def _student_pdf(df: float, u: np.ndarray) -> np.ndarray:
    log_norm = special.gammaln((df + 1) / 2) - special.gammaln(df / 2) - 0.5 * np.log(df * np.pi)
    return np.exp(log_norm - (df + 1) / 2 * np.log1p(u * u / df))


def _marginals(features: int, heavy: int, df: float, rng: np.random.Generator) -> list[dict]:
    """Each marginal: its kind, the component CDF (standard normal or Student-t), means and scales (equal weights)."""
    plain, two, three = features // 4, features // 8, features // 8
    kinds = ["normal"] * plain + ["mix2"] * two + ["mix3"] * three
    kinds += ["mix2"] * (features - len(kinds) - heavy) + ["t"] * heavy
    out = []
    for kind in kinds:
        parts = {"normal": 1, "mix2": 2, "mix3": 3, "t": 2}[kind]
        if kind == "t":
            cdf, pdf = functools.partial(special.stdtr, df), functools.partial(_student_pdf, df)
        else:
            cdf, pdf = special.ndtr, _normal_pdf
        loc, scale = rng.uniform(-4, 4, parts), rng.uniform(1, 2, parts)
        out.append({"kind": kind, "cdf": cdf, "pdf": pdf, "loc": loc, "scale": scale})
    return out


def _mixture_quantile(marginal: dict, g: np.ndarray) -> np.ndarray:
    r"""`F^{-1}(Phi(g))`: on the CDF for `g <= 0`, on the survival function above (the far tails keep their digits).

    A table of $\log F$ (or $\log S$) on $x = \sinh(s)$, $s \in [-30, 30]$, gives the start, and three
    Newton steps on the log-probability finish.
    """
    cdf, pdf, loc, scale = marginal["cdf"], marginal["pdf"], marginal["loc"], marginal["scale"]
    grid = np.sinh(np.linspace(-30, 30, 60_001))
    x = np.empty_like(g)
    for upper in (False, True):
        rows = g > 0 if upper else g <= 0
        log_target = special.log_ndtr(-g[rows] if upper else g[rows])

        def log_tail(v: np.ndarray, upper: bool = upper) -> tuple[np.ndarray, np.ndarray]:
            u = (v[:, None] - loc) / scale
            prob = (cdf(-u) if upper else cdf(u)).mean(1)  # symmetric components: S(u) = F(-u)
            density = (pdf(u) / scale).mean(1)
            return np.log(np.maximum(prob, 1e-300)), density / np.maximum(prob, 1e-300)

        table = log_tail(grid)[0]
        order = slice(None, None, -1) if upper else slice(None)  # np.interp needs increasing abscissae
        v = np.interp(log_target, table[order], grid[order])
        for _ in range(3):
            value, ratio = log_tail(v)
            step = (value - log_target) / np.maximum(ratio, 1e-300)
            v = v + step if upper else v - step
        x[rows] = v
    return x


def mtaf_synthetic(
    features: int = 8, heavy: int = 1, df: float = 2.0, seed: int = 0, sizes: tuple[int, int, int] | None = None
) -> Splits:
    """The mTAF synthetic copula data (see the module docstring), as train/val/test splits.

    Arguments:
        features: dimension `D` (the paper: 8 or 50).
        heavy: number of heavy-tailed marginals, the last ones (the paper: 1 or 4 at `D = 8`, 5 or 10 at `D = 50`).
        df: degrees of freedom of the Student-t components (the paper: 2 or 3).
        seed: seed of the parameters and the draws.
        sizes: `(train, val, test)`; the paper's `(15000, 10000, 75000)` at `D <= 8`, else `(50000, 10000, 75000)`.

    Returns:
        [`Splits`][flowkit.data.Splits] with `info` holding the marginal kinds, the heavy indices and `df`.

    Examples:
        >>> from flowkit.data import mtaf_synthetic
        >>> data = mtaf_synthetic(8, heavy=4, sizes=(1000, 100, 100))
        >>> data.train.shape, data.info["heavy"]
        (torch.Size([1000, 8]), [4, 5, 6, 7])
    """
    where = "mtaf_synthetic"
    features = check_number(features, "features", where=where, integer=True, low=2)
    heavy = check_number(heavy, "heavy", where=where, integer=True, low=0)
    df = check_number(df, "df", where=where, positive=True)
    if heavy > features - features // 4 - 2 * (features // 8):
        most = features - features // 4 - 2 * (features // 8)
        raise ValueError(f"{where}: at most {most} heavy marginals fit D = {features}, got {heavy}")
    sizes = sizes or ((15_000, 10_000, 75_000) if features <= 8 else (50_000, 10_000, 75_000))
    for size in sizes:
        check_number(size, "every size", where=where, integer=True, low=1)
    rng = np.random.default_rng(seed)
    corr = _correlation(features, rng)
    marginals = _marginals(features, heavy, df, rng)
    g = rng.multivariate_normal(np.zeros(features), corr, size=sum(sizes), method="cholesky")
    x = np.stack([_mixture_quantile(m, g[:, j]) for j, m in enumerate(marginals)], 1)
    n_train, n_val, _ = sizes
    info = {
        "source": "mTAF synthetic copula data (Laszkiewicz et al. 2022)",
        "kinds": [m["kind"] for m in marginals],
        "heavy": list(range(features - heavy, features)),
        "df": df,
        "correlation": corr.tolist(),
        "marginals": [{"kind": m["kind"], "loc": m["loc"].tolist(), "scale": m["scale"].tolist()} for m in marginals],
    }
    name = f"mtaf-{features}-{heavy}"
    parts = _tensor(x[:n_train]), _tensor(x[n_train : n_train + n_val]), _tensor(x[n_train + n_val :])
    return Splits(name, *parts, info=info)


def stock_returns(seed: int = 0) -> Splits:
    """Daily percentage log returns of the S&P 500 and the NASDAQ composite (`D = 2`), from `arch`'s bundled data.

    Split 70/10/20 by a seeded permutation.

    Arguments:
        seed: seed of the split.

    Raises:
        ValueError: when the `arch` package is missing (install the `tails` extra).
    """
    try:
        from arch.data import nasdaq, sp500
    except ImportError:
        raise ValueError("stock_returns needs the arch package: pip install 'flowkit[tails]'") from None
    closes = [module.load()["Adj Close"] for module in (sp500, nasdaq)]
    joined = closes[0].to_frame("sp500").join(closes[1].to_frame("nasdaq"), how="inner").to_numpy(dtype=np.float64)
    returns = 100 * np.diff(np.log(joined), axis=0)
    splits = split_array(returns, "returns", val=0.1, test=0.2, seed=seed)
    splits.info.update(source="arch.data sp500 and nasdaq, 1999-2018", columns=["sp500", "nasdaq"])
    return splits


#: Names [`heavy_tailed`][flowkit.data.heavy_tailed] (and [`load`][flowkit.data.load]) accept.
HEAVY_TAILED_DATASETS: dict[str, Callable[[int], Splits]] = {
    "mtaf-8-1": lambda seed: mtaf_synthetic(8, 1, seed=seed),
    "mtaf-8-4": lambda seed: mtaf_synthetic(8, 4, seed=seed),
    "mtaf-50-5": lambda seed: mtaf_synthetic(50, 5, seed=seed),
    "mtaf-50-10": lambda seed: mtaf_synthetic(50, 10, seed=seed),
    "returns": stock_returns,
}


def heavy_tailed(name: str, seed: int = 0) -> Splits:
    """A heavy-tailed dataset by name: `mtaf-8-1`, `mtaf-8-4`, `mtaf-50-5`, `mtaf-50-10` (df 2) or `returns`.

    Raises:
        ValueError: for an unknown name.
    """
    if name not in HEAVY_TAILED_DATASETS:
        raise ValueError(f"unknown heavy-tailed dataset {name!r}; choose one of {', '.join(HEAVY_TAILED_DATASETS)}")
    return HEAVY_TAILED_DATASETS[name](seed)
