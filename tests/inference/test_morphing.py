"""Unpaired morphing: the toy, the MMD estimator, the KL flow's density, bad input, and the acceptance run.

The acceptance run compares morphed MC with held-out data: per-feature KS p-values and the correlation matrix.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import ks_2samp

from flowkit.flows import NSF
from flowkit.inference import DiphotonToy, MMDToData, UnpairedMorphing, mmd2, morphing_flow
from flowkit.testing import check_bijector

F64 = torch.float64


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- the toy


def test_the_toy_data_are_the_distorted_mc_and_differ_from_it() -> None:
    toy = DiphotonToy()
    x, c = toy.sample_mc(50_000, _generator(1), dtype=F64)
    y, c_data = toy.sample_data(50_000, _generator(1), dtype=F64)  # the same draws: the data are the distorted MC
    assert torch.equal(c, c_data) and torch.equal(y, toy.distort(x, c))
    assert bool((x[:, 0] >= x[:, 1]).all()) and bool((x[:, 1] > 25).all()) and bool((x[:, 2:].abs() < 2.2).all())
    # the distortion as written: the energy scale at zero pile-up, the eta shift, the cross-talk
    at_zero = toy.distort(torch.tensor([[50.0, 40.0, 0.0, 0.5]], dtype=F64), torch.zeros(1, 1, dtype=F64))
    assert torch.allclose(at_zero, torch.tensor([[51.0, 40.8, 0.05, 0.5]], dtype=F64))
    # MC and data are told apart: every feature by KS, the eta correlation by more than 0.05
    fresh, _ = toy.sample_data(50_000, _generator(2), dtype=F64)
    assert all(ks_2samp(x[:, i].numpy(), fresh[:, i].numpy()).pvalue < 1e-6 for i in range(4))
    corr = np.corrcoef(x.numpy().T)[2, 3], np.corrcoef(fresh.numpy().T)[2, 3]
    assert corr[1] - corr[0] > 0.05


def test_the_invariant_mass_of_back_to_back_photons() -> None:
    x = torch.tensor([[50.0, 40.0, 0.3, 0.3], [60.0, 30.0, 1.0, -0.5]], dtype=F64)
    # equal rapidities, back to back: m = 2 sqrt(pT1 pT2)
    m = DiphotonToy.invariant_mass(x)
    assert m[0].item() == pytest.approx(2 * math.sqrt(2000.0))
    assert m[1].item() == pytest.approx(math.sqrt(2 * 60 * 30 * (math.cosh(1.5) + 1)))


def test_the_toy_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="n"):
        DiphotonToy().sample_mc(0)
    with pytest.raises(ValueError, match="crosstalk"):
        DiphotonToy(crosstalk=2.0)
    with pytest.raises(ValueError, match="shape"):
        DiphotonToy().distort(torch.zeros(3, 3), torch.zeros(3, 1))
    with pytest.raises(ValueError, match="non-finite"):
        DiphotonToy.invariant_mass(torch.full((2, 4), math.nan))


# ---- the MMD


def _mmd2_by_loops(x: torch.Tensor, y: torch.Tensor, widths) -> float:
    def k(a, b):
        return sum(math.exp(-float((a - b).square().sum()) / (2 * w * w)) for w in widths)

    n, m = len(x), len(y)
    xx = sum(k(x[i], x[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    yy = sum(k(y[i], y[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    xy = sum(k(x[i], y[j]) for i in range(n) for j in range(m)) / (n * m)
    return xx + yy - 2 * xy


def test_mmd2_is_the_unbiased_estimator_with_a_sum_of_gaussian_kernels() -> None:
    g = _generator(3)
    x, y = torch.randn(7, 3, generator=g, dtype=F64), torch.randn(5, 3, generator=g, dtype=F64) + 0.3
    widths = (0.5, 1.0, 3.0)
    assert mmd2(x, y, widths).item() == pytest.approx(_mmd2_by_loops(x, y, widths), rel=1e-12)
    assert mmd2(x, y, widths).item() == pytest.approx(mmd2(y, x, widths).item(), rel=1e-12)


def test_mmd2_averages_to_zero_on_one_distribution_and_grows_with_a_shift() -> None:
    g = _generator(4)
    same = torch.stack([mmd2(torch.randn(64, 2, generator=g), torch.randn(64, 2, generator=g)) for _ in range(200)])
    assert abs(same.mean().item()) < 3 * same.std().item() / math.sqrt(200)  # unbiased
    shifts = [mmd2(torch.randn(2000, 2, generator=g), torch.randn(2000, 2, generator=g) + s).item() for s in (0.1, 0.3)]
    assert 0 < shifts[0] < shifts[1]


def test_mmd2_refuses_bad_samples() -> None:
    with pytest.raises(ValueError, match="N >= 2"):
        mmd2(torch.zeros(1, 2), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="shape"):
        mmd2(torch.zeros(4, 2), torch.zeros(4, 3))
    with pytest.raises(ValueError, match="dtype"):
        mmd2(torch.zeros(4, 2), torch.zeros(4, 2, dtype=F64))
    with pytest.raises(ValueError, match="bandwidth"):
        mmd2(torch.zeros(4, 2), torch.zeros(4, 2), bandwidths=(1.0, -1.0))
    with pytest.raises(ValueError, match="non-finite"):
        mmd2(torch.zeros(4, 2), torch.full((4, 2), math.inf))


# ---- the KL flow and the MMD constraint


def test_the_morphing_flow_is_the_data_density_of_the_morphed_events_times_the_jacobian() -> None:
    torch.manual_seed(0)
    data_flow = NSF(4, transforms=2, hidden=(8,), context=1, start="random").double()
    morph = NSF(4, transforms=1, hidden=(8,), context=1, start="random").double().bijector
    flow = morphing_flow(morph, data_flow)
    assert not any(p.requires_grad for p in data_flow.parameters())
    assert all(p.requires_grad for p in morph.parameters())
    x, c = torch.randn(16, 4, dtype=F64), torch.randn(16, 1, dtype=F64)
    y, ladj = morph(x, c)
    assert torch.allclose(flow.log_prob(x, c), data_flow.log_prob(y, c) + ladj, atol=1e-10)
    with pytest.raises(ValueError, match="Bijector"):
        morphing_flow(torch.nn.Linear(4, 4), data_flow)
    with pytest.raises(ValueError, match="Flow"):
        morphing_flow(morph, morph)


def test_the_mmd_constraint_compares_the_morphed_batch_with_a_data_batch() -> None:
    toy = DiphotonToy()
    mc, data = toy.sample_mc(6000, _generator(5)), toy.sample_data(6000, _generator(6))
    identity = morphing_flow(NSF(4, transforms=1, hidden=(8,), context=1, start="identity").bijector,
                             NSF(4, transforms=1, hidden=(8,), context=1))  # fmt: skip
    constraint = MMDToData(*data)
    torch.manual_seed(0)
    with torch.no_grad():  # batches of 1500: MMD tells MC from data by a few spreads (at 500 by about two)
        mc_to_data = torch.stack([constraint(identity, (mc[0][i::4], mc[1][i::4])) for i in range(4)])
        other = toy.sample_data(6000, _generator(7))
        data_to_data = torch.stack([constraint(identity, (other[0][i::4], other[1][i::4])) for i in range(4)])
    spread = constraint.null_spread(1500, repeats=20, generator=_generator(8))
    assert data_to_data.abs().max() < 3 * spread < mc_to_data.min()  # the identity leaves MC unlike data
    with pytest.raises(ValueError, match="both"):
        constraint(identity, mc[0][:10])
    with pytest.raises(ValueError, match="N >= 4"):
        MMDToData(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="context"):
        MMDToData(data[0], data[1][:10])


def test_the_morph_starts_as_moment_matching_and_is_a_correct_bijector() -> None:
    toy = DiphotonToy()
    mc, data = toy.sample_mc(2000, _generator(9), dtype=F64), toy.sample_data(2000, _generator(10), dtype=F64)
    model = UnpairedMorphing(4, context=1, transforms=1, hidden=(8,), morph_transforms=1, morph_hidden=(8,)).double()
    model.fit(mc, data, data_steps=1, morph_steps=1, lr=1e-12, batch_size=64, seed=0, progress=False)
    moved = model(*mc)
    assert torch.allclose(moved.mean(0), model.data_flow.bijector[0].loc, atol=1e-6)
    check_bijector(model.morph, x=mc[0][:8], context=mc[1][:8])


def test_unpaired_morphing_refuses_bad_input() -> None:
    toy = DiphotonToy()
    mc, data = toy.sample_mc(256, _generator(11)), toy.sample_data(256, _generator(12))
    model = UnpairedMorphing(4, context=1, transforms=1, hidden=(8,), morph_transforms=1, morph_hidden=(8,))
    options = dict(data_steps=1, morph_steps=1, batch_size=64, progress=False)
    with pytest.raises(ValueError, match="call fit first"):
        model(*mc)
    with pytest.raises(ValueError, match="context"):
        model.fit(mc[0], data, **options)
    with pytest.raises(ValueError, match="shape"):
        model.fit((mc[0][:, :3], mc[1]), data, **options)
    with pytest.raises(ValueError, match="dtype"):
        model.fit((mc[0].double(), mc[1]), data, **options)
    with pytest.raises(ValueError, match="non-finite"):
        model.fit(mc, (torch.full_like(data[0], math.nan), data[1]), **options)
    with pytest.raises(ValueError, match="contexts"):
        model.fit(mc, (data[0], data[1][:10]), **options)
    with pytest.raises(ValueError, match="mmd_bound"):
        model.fit(mc, data, mmd_bound="tight", **options)
    with pytest.raises(ValueError, match="without context"):
        UnpairedMorphing(4, transforms=1, hidden=(8,)).fit(mc, data, **options)


# ---- the acceptance run


def _correlation_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest absolute difference between the two samples' Pearson correlation matrices."""
    return float(np.abs(np.corrcoef(a.numpy().T) - np.corrcoef(b.numpy().T)).max())


@pytest.mark.slow
def test_morphed_mc_matches_held_out_data_per_feature_and_in_its_correlations() -> None:
    """50,000 training events of each; the comparison on 50,000 fresh MC events, morphed, and 50,000 held-out data.

    At that size the correlation error of two independent data samples is about 0.01, so the bound 0.02 tells a
    wrong correlation from noise, and a KS test resolves differences in the CDFs of about 0.009.
    """
    toy = DiphotonToy()
    g = _generator(0)
    mc, data = toy.sample_mc(50_000, g), toy.sample_data(50_000, g)
    test_mc, test_data = toy.sample_mc(50_000, g), toy.sample_data(50_000, g)
    # before: each feature and the correlations tell MC from data
    assert max(ks_2samp(test_mc[0][:, i], test_data[0][:, i]).pvalue for i in range(4)) < 1e-6
    assert _correlation_error(test_mc[0], test_data[0]) > 0.05
    torch.manual_seed(0)
    model = UnpairedMorphing(4, context=1)
    model.fit(mc, data, data_steps=1500, morph_steps=1000, seed=0, progress=False)
    with torch.no_grad():
        morphed = model(*test_mc)
    p_values = [ks_2samp(morphed[:, i], test_data[0][:, i]).pvalue for i in range(4)]
    assert min(p_values) > 0.05, p_values
    assert _correlation_error(morphed, test_data[0]) < 0.02
