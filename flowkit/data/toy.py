"""Two-dimensional toy densities, generated in code from a seed (nothing is downloaded).

The shapes follow the usual flow benchmarks (FFJORD, NSF): two moons, two circles, a checkerboard, eight Gaussians, a
pinwheel, two spirals and four concentric rings, all scaled to lie roughly in `[-4, 4]^2`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .splits import Splits, _tensor

__all__ = ["TOY_DATASETS", "toy", "toy_splits"]


def _moons(n: int, rng: np.random.Generator) -> np.ndarray:
    n_upper = n // 2
    t = np.concatenate([rng.uniform(0, math.pi, n_upper), rng.uniform(0, math.pi, n - n_upper)])
    upper = np.arange(n) < n_upper
    x = np.where(upper, np.cos(t), 1 - np.cos(t))
    y = np.where(upper, np.sin(t), 0.5 - np.sin(t))
    pts = np.stack([x, y], 1) + 0.1 * rng.standard_normal((n, 2))
    return 2 * pts + np.array([-1.0, -0.2])


def _circles(n: int, rng: np.random.Generator) -> np.ndarray:
    radius = np.where(rng.random(n) < 0.5, 1.0, 0.5)
    t = rng.uniform(0, 2 * math.pi, n)
    pts = radius[:, None] * np.stack([np.cos(t), np.sin(t)], 1) + 0.08 * rng.standard_normal((n, 2))
    return 3 * pts


def _checkerboard(n: int, rng: np.random.Generator) -> np.ndarray:
    x1 = rng.uniform(-2, 2, n)
    x2 = rng.random(n) - 2 * rng.integers(0, 2, n) + np.floor(x1) % 2
    return 2 * np.stack([x1, x2], 1)


def _eight_gaussians(n: int, rng: np.random.Generator) -> np.ndarray:
    angles = 2 * math.pi * rng.integers(0, 8, n) / 8
    centers = 4 * np.stack([np.cos(angles), np.sin(angles)], 1)
    return (centers + 0.5 * rng.standard_normal((n, 2))) / math.sqrt(2)


def _pinwheel(n: int, rng: np.random.Generator) -> np.ndarray:
    arms, radial_std, tangential_std, rate = 5, 0.3, 0.1, 0.25
    labels = rng.integers(0, arms, n)
    feats = rng.standard_normal((n, 2)) * np.array([radial_std, tangential_std])
    feats[:, 0] += 1.0
    angle = 2 * math.pi * labels / arms + rate * np.exp(feats[:, 0])
    cos, sin = np.cos(angle), np.sin(angle)
    rotated = np.stack([cos * feats[:, 0] - sin * feats[:, 1], sin * feats[:, 0] + cos * feats[:, 1]], 1)
    return 2 * rotated


def _spirals(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.sqrt(rng.random(n)) * 3 * math.pi
    sign = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    pts = sign[:, None] * np.stack([-np.cos(t) * t, np.sin(t) * t], 1) + 0.5 * rng.random((n, 2))
    return pts / 2.5


def _rings(n: int, rng: np.random.Generator) -> np.ndarray:
    radius = rng.integers(1, 5, n).astype(float)
    t = rng.uniform(0, 2 * math.pi, n)
    pts = radius[:, None] * np.stack([np.cos(t), np.sin(t)], 1) * 0.25 + 0.08 * rng.standard_normal((n, 2)) / 3
    return 3 * pts


#: The built-in two-dimensional datasets, by name.
TOY_DATASETS: dict[str, Callable[[int, np.random.Generator], np.ndarray]] = {
    "moons": _moons,
    "circles": _circles,
    "checkerboard": _checkerboard,
    "8gaussians": _eight_gaussians,
    "pinwheel": _pinwheel,
    "spirals": _spirals,
    "rings": _rings,
}


def _draw(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` points of the set `name`, in random order (some generators draw them grouped by component)."""
    points = TOY_DATASETS[name](n, rng)
    return points[rng.permutation(n)]


def toy(name: str, n: int = 10_000, seed: int = 0) -> np.ndarray:
    """Draw `n` points of a built-in 2-D dataset as a float64 array of shape `(n, 2)`, in random order.

    The points are shuffled, so any slice `toy(name, n)[:k]` is a sample of the whole density.

    Arguments:
        name: one of `moons`, `circles`, `checkerboard`, `8gaussians`, `pinwheel`, `spirals`, `rings`.
        n: number of points.
        seed: seed of the generator (the same seed gives the same points).
    """
    if name not in TOY_DATASETS:
        raise ValueError(f"unknown 2-D dataset {name!r}; choose one of {', '.join(TOY_DATASETS)}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"toy: n must be a positive integer, got {n!r}")
    return _draw(name, n, np.random.default_rng(seed))


def toy_splits(name: str, n_train: int = 20_000, n_val: int = 2_000, n_test: int = 10_000, seed: int = 0) -> Splits:
    """Independent train/val/test draws of a built-in 2-D dataset (streams spawned from `seed`)."""
    toy(name, 1)  # validates the name
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)]
    sets = [_draw(name, n, rng) for n, rng in zip((n_train, n_val, n_test), streams, strict=True)]
    return Splits(name, *(_tensor(a) for a in sets), info={"source": "generated", "seed": seed})
