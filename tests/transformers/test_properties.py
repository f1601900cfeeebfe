"""Property tests of the transformers: finite values and gradients everywhere, and the round trip within tolerance.

Hypothesis draws the transformer (a spline with random bins and bound, a circular
spline, an affine map), the dtype, the parameter scale (0.1 to 5, and extreme
logits ~1e7), the points (normal, on the knots +-2 ulp, at +-B, far outside: 1e6 and
1e30) and the direction. Each test is bounded (`max_examples`, derandomised); the
whole module runs in a few seconds.
"""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowkit.transformers import Affine, CircularSpline, RationalQuadraticSpline

SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
DTYPES = st.sampled_from([torch.float32, torch.float64])
#: Round trip `|inverse(forward(x)) - x| * min(1, dy/dx) <= TOL * max(1, B)`: the error of
#: a flat stretch (slope below 1) is the output's rounding divided by the slope, so it is
#: scaled back by the slope. Measured worst, parameters at scale <= 5: 9e-6 (float32).
TOL = {torch.float32: 5e-5, torch.float64: 1e-12}
N = 64


def _transformer(kind: str, bins: int, bound: float):
    if kind == "spline":
        return RationalQuadraticSpline(bins, bound), bound
    if kind == "circular":
        return CircularSpline(bins), math.pi
    return Affine(clamp=min(bound, 5.0)), None  # e^5 * 1e30 is finite in float32, e^20 * 1e30 is not


def _knot_table(t, params: torch.Tensor) -> torch.Tensor | None:
    if isinstance(t, (RationalQuadraticSpline, CircularSpline)):
        return t.knots(params)[0]
    return None


def _points(t, params: torch.Tensor, bound: float | None, dtype, gen, kinds: tuple[str, ...]) -> torch.Tensor:
    """Test points, `(M, N)`: for each kind, rows of `N` points (one per parameter row).

    Kinds: `normal` (scale B), `knots` (the knots of either axis, -2 to +2 ulp off),
    `bounds` (`+-B`) and `far` (`+-1e6`, `+-1e30`).
    """
    b = bound if bound is not None else 5.0
    rows = []
    if "normal" in kinds:
        rows += [b * torch.randn(4, N, generator=gen, dtype=torch.float64).to(dtype)]
    table = _knot_table(t, params)
    if "knots" in kinds and table is not None:
        for axis in (0, 1):
            knots = table[:, axis]
            x = knots[torch.arange(N), torch.randint(knots.shape[-1], (N,), generator=gen)]
            for direction in (-math.inf, math.inf):
                step = x
                for _ in range(3):
                    rows.append(step)
                    step = torch.nextafter(step, torch.tensor(direction, dtype=dtype))
    if "bounds" in kinds:
        rows += [torch.full((N,), b, dtype=dtype), torch.full((N,), -b, dtype=dtype)]
    if "far" in kinds:
        rows += [torch.full((N,), v, dtype=dtype) for v in (1e6, -1e6, 1e30, -1e30)]
    x = torch.cat([r.reshape(-1, N) for r in rows])
    if isinstance(t, CircularSpline):
        x = x.clamp(-math.pi, math.pi)
    return x


@st.composite
def configurations(draw, scales=(0.1, 1.0, 2.0, 5.0, 1e7)):
    kind = draw(st.sampled_from(["spline", "circular", "affine"]))
    bins = draw(st.integers(1, 10))
    bound = draw(st.sampled_from([0.5, 1.0, 3.0, 5.0, 100.0]))
    dtype = draw(DTYPES)
    scale = draw(st.sampled_from(scales))
    seed = draw(st.integers(0, 2**16))
    return kind, bins, bound, dtype, scale, seed


def _setup(config, kinds=("normal", "knots", "bounds", "far")):
    kind, bins, bound, dtype, scale, seed = config
    gen = torch.Generator().manual_seed(seed)
    t, b = _transformer(kind, bins, bound)
    params = (scale * torch.randn(N, t.params_per_element, generator=gen, dtype=torch.float64)).to(dtype)
    x = _points(t, params, b, dtype, gen, kinds)
    return t, b, params.expand(x.shape[0], -1, -1), x


@SETTINGS
@given(configurations(), st.booleans())
def test_values_and_gradients_are_finite(config, inverse):
    t, _, params, x = _setup(config)
    x = x.clone().requires_grad_(True)
    params = params.clone().requires_grad_(True)
    y, ladj = (t.inverse if inverse else t.forward)(x, params)
    assert torch.isfinite(y).all() and torch.isfinite(ladj).all()
    for grad in torch.autograd.grad((y * torch.randn_like(y)).sum() + ladj.sum(), (x, params)):
        assert torch.isfinite(grad).all()


def _round_trip_error(t, x: torch.Tensor, back: torch.Tensor) -> torch.Tensor:
    err = back - x
    if isinstance(t, CircularSpline):
        err = torch.remainder(err + math.pi, 2 * math.pi) - math.pi
    return err.abs()


@SETTINGS
@given(configurations(scales=(0.1, 1.0, 2.0, 5.0)))
def test_round_trip_within_the_stated_tolerance(config):
    t, b, params, x = _setup(config, ("normal", "knots", "bounds"))
    dtype = config[3]
    with torch.no_grad():
        y, ladj = t(x, params)
        back, ladj_inv = t.inverse(y, params)
    scale = max(1.0, b if b is not None else 1.0) * torch.maximum(x.abs(), torch.ones_like(x))
    err = _round_trip_error(t, x, back) * ladj.exp().clamp(max=1)
    assert (err <= TOL[dtype] * scale).all(), f"round trip error {(err / scale).max():.2e}"


@SETTINGS
@given(configurations(scales=(0.1, 1.0, 2.0, 5.0)).filter(lambda c: c[0] != "affine"))
def test_inverse_then_forward_returns_onto_the_point(config):
    # y -> x -> y: the error is the forward's rounding at the solved point, at most slope * ulp(x);
    # bounded by the same tolerance where the slope is at most 1, scaled by it above.
    t, b, params, y = _setup(config, ("normal", "knots", "bounds"))
    dtype = config[3]
    with torch.no_grad():
        x, ladj_inv = t.inverse(y, params)
        y_back, _ = t(x, params)
    err = _round_trip_error(t, y, y_back) * ladj_inv.exp().clamp(max=1)
    assert (err <= TOL[dtype] * max(1.0, b) * torch.maximum(y.abs(), torch.ones_like(y))).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_the_fuzz_job_runs_and_finds_nothing_unexplained(seed):
    # Thirty configurations of bench/fuzz.py (the full job: python bench/fuzz.py --minutes 3).
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "fuzz.py"
    spec = importlib.util.spec_from_file_location("bench_fuzz", path)
    fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)
    # A fixed number of configurations (not seconds): the same ones on a loaded machine as on a quiet one.
    result = fuzz.fuzz(minutes=5, seed=seed, configurations=30)
    assert result["counts"]["configurations"] == 30
    assert not result["classes"]["exceptions"]
    # Splines and couplings: nothing unexplained. (Affine autoregressive inverses of heavily
    # randomised MAFs are not all explained by the fuzz's rounding bound yet.)
    spline = ("transformer", "preset NSF", "case SplineCoupling", "case CircularSpline", "case MaskedSpline")
    unexplained = [e for e in result["examples"] if e.get("class") == "unexplained" and e["config"].startswith(spline)]
    assert not unexplained, unexplained[:3]
