"""Student-t bases: densities against scipy, samples (also at small df), the df floor, every preset's base=."""

import numpy as np
import pytest
import torch
from scipy import stats

import flowkit
from flowkit.distributions import StudentT, TailAdaptiveBase


def test_student_t_log_prob_matches_scipy():
    base = StudentT(3, df=[1.2, 2.0, 7.5]).double()
    x = torch.randn(50, 3, dtype=torch.float64) * 10
    expected = stats.t.logpdf(x.numpy(), df=[1.2, 2.0, 7.5]).sum(-1)
    np.testing.assert_allclose(base.log_prob(x).numpy(), expected, rtol=1e-6)
    torch.testing.assert_close(base.df, torch.tensor([1.2, 2.0, 7.5], dtype=torch.float64), rtol=1e-6, atol=0)


def test_tail_adaptive_base_log_prob_matches_scipy():
    base = TailAdaptiveBase([None, 2.0, None, 3.0]).double()
    x = torch.randn(40, 4, dtype=torch.float64) * 5
    x_np = x.numpy()
    expected = stats.norm.logpdf(x_np[:, [0, 2]]).sum(-1) + stats.t.logpdf(x_np[:, [1, 3]], df=[2.0, 3.0]).sum(-1)
    np.testing.assert_allclose(base.log_prob(x).numpy(), expected, rtol=1e-6)
    assert base.df[0] == float("inf") and base.heavy.tolist() == [False, True, False, True]


@pytest.mark.parametrize("df", [1.05, 2.0, 3.0])
def test_student_t_samples_follow_the_distribution(df):
    torch.manual_seed(0)
    base = StudentT(1, df=df, min_df=1.0)
    z = base.sample((20000,)).squeeze(-1)
    assert bool(torch.isfinite(z).all())
    assert stats.kstest(z.numpy(), stats.t(df).cdf).pvalue > 1e-3


def test_samples_stay_finite_in_float32_at_small_df():
    torch.manual_seed(0)
    base = StudentT(4, df=0.3, min_df=0.2)
    z = base.sample((50000,))
    assert z.dtype == torch.float32 and bool(torch.isfinite(z).all())


def test_mixed_samples_follow_their_marginals():
    torch.manual_seed(1)
    z = TailAdaptiveBase([None, 2.0]).sample((20000,))
    assert stats.kstest(z[:, 0].numpy(), stats.norm.cdf).pvalue > 1e-3
    assert stats.kstest(z[:, 1].numpy(), stats.t(2.0).cdf).pvalue > 1e-3


def test_learnt_df_gets_gradients_from_log_prob_and_rsample():
    base = StudentT(2, df=3.0, learn_df=True)
    (base.log_prob(torch.randn(8, 2) * 3).sum() + base.rsample((8,)).square().mean()).backward()
    assert base.df_raw.grad is not None and bool(torch.isfinite(base.df_raw.grad).all())
    mixed = TailAdaptiveBase([None, 2.0], learn_df=True)
    (mixed.log_prob(torch.randn(8, 2) * 3).sum() + mixed.rsample((8,)).sum()).backward()
    assert mixed.df_raw.grad[0] == 0 and mixed.df_raw.grad[1] != 0


def test_df_stays_above_its_floor():
    base = StudentT(1, df=2.0, learn_df=True, min_df=1.5)
    with torch.no_grad():
        base.df_raw.fill_(-200.0)
    assert float(base.df.detach()) >= 1.5


@pytest.mark.parametrize(
    "build",
    [
        lambda: StudentT(2, df=0.0),
        lambda: StudentT(2, df=-1.0),
        lambda: StudentT(2, df=1.0),  # not above the default floor 1
        lambda: StudentT(2, df=float("nan")),
        lambda: StudentT(2, df=3.0, min_df=0.0),
        lambda: StudentT(3, df=[2.0, 3.0]),
        lambda: TailAdaptiveBase([]),
        lambda: TailAdaptiveBase([None, -2.0]),
        lambda: TailAdaptiveBase("abc"),
        lambda: StudentT(0),
        lambda: StudentT((2, 0)),
        lambda: StudentT(2, df=torch.ones(2, 2) * 3),
    ],
)
def test_bad_arguments_are_value_errors(build):
    with pytest.raises(ValueError):
        build()


@pytest.mark.parametrize(
    "preset",
    [
        lambda base: flowkit.flows.RealNVP(3, transforms=2, hidden=(8,), base=base),
        lambda base: flowkit.flows.MAF(3, transforms=2, hidden=(8,), base=base),
        lambda base: flowkit.flows.NSF(3, transforms=2, hidden=(8,), base=base),
        lambda base: flowkit.flows.NSF(3, transforms=2, hidden=(8,), coupling=True, base=base),
    ],
)
@pytest.mark.parametrize(
    "base", [lambda: StudentT(3, df=2.5, learn_df=True), lambda: TailAdaptiveBase([None, 2.0, 4.0], learn_df=True)]
)
def test_every_preset_takes_a_student_t_base_and_saves_it(preset, base, tmp_path):
    torch.manual_seed(0)
    flow = preset(base())
    x = torch.randn(6, 3)
    log_p = flow.log_prob(x)
    assert bool(torch.isfinite(log_p).all())
    assert flow.sample((5,)).shape == (5, 3)
    with torch.no_grad():
        flow.base.df_raw.add_(0.7)
    loaded = flowkit.io.load(flowkit.io.save(flow, tmp_path / "model"))
    torch.testing.assert_close(loaded.base.df, flow.base.df)
    torch.testing.assert_close(loaded.log_prob(x), flow.log_prob(x))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.int64])
def test_df_as_a_tensor_works_as_a_list(dtype, tmp_path):
    values = [2.5, 4.0, 30.0] if dtype.is_floating_point else [2, 4, 30]
    from_tensor = StudentT(3, df=torch.tensor(values, dtype=dtype)).double()
    from_list = StudentT(3, df=values).double()
    torch.testing.assert_close(from_tensor.df, from_list.df)
    x = torch.randn(7, 3, dtype=torch.float64) * 4
    np.testing.assert_allclose(from_tensor.log_prob(x).numpy(), stats.t.logpdf(x.numpy(), df=values).sum(-1), rtol=1e-6)
    scalar = StudentT(3, df=torch.tensor(2.5, dtype=dtype))
    torch.testing.assert_close(scalar.df, StudentT(3, df=2.5 if dtype.is_floating_point else 2).df)
    loaded = flowkit.io.load(
        flowkit.io.save(flowkit.flows.NSF(3, transforms=1, hidden=(4,), base=from_tensor.float()), tmp_path / "m")
    )
    torch.testing.assert_close(loaded.base.df, from_tensor.float().df)


def test_a_string_df_names_its_type():
    with pytest.raises(ValueError, match="df must be a number, a list of numbers or a tensor, got str"):
        StudentT(2, df="3")


DFS = [0.5, 0.9, 1.5, 3.0, 10.0, 29.0, 30.0, 31.0, 100.0, 1e3, 1e5, 1e7, 1e8]


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-6), (torch.float64, 1e-11)])
def test_log_prob_matches_scipy_from_small_to_huge_df(dtype, rtol):
    base = StudentT(len(DFS), df=DFS, min_df=0.1).to(dtype)
    x = torch.tensor([0.0, 0.3, -1.0, 2.0, 7.0, -40.0, 1e3, 1e8], dtype=dtype)[:, None].expand(-1, len(DFS))
    df = base.df.double().numpy()  # the degrees of freedom the model holds in this dtype
    expected = stats.t.logpdf(x.double().numpy(), df=df)
    one_at_a_time = [StudentT(1, df=d, min_df=0.1).to(dtype).log_prob(x[:, [j]]) for j, d in enumerate(DFS)]
    np.testing.assert_allclose(torch.stack(one_at_a_time, -1).double().numpy(), expected, rtol=rtol, atol=0)
    np.testing.assert_allclose(base.log_prob(x).double().numpy(), expected.sum(-1), rtol=rtol, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_prob_is_finite_far_out_and_matches_scipy(dtype):
    base = StudentT(3, df=[0.5, 3.0, 1e6], min_df=0.1, learn_df=True).to(dtype)
    x = torch.tensor([[1e20, -1e20, 1e20], [3e38, 1e19, -1e30], [1e10, 1e-30, 0.0]], dtype=dtype)
    x = x.clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).requires_grad_()
    log_p = base.log_prob(x)
    expected = stats.t.logpdf(x.detach().double().numpy(), df=base.df.detach().double().numpy()).sum(-1)
    np.testing.assert_allclose(
        log_p.detach().double().numpy(), expected, rtol=1e-6 if dtype == torch.float32 else 1e-12
    )
    log_p.sum().backward()
    assert bool(torch.isfinite(x.grad).all()) and bool(torch.isfinite(base.df_raw.grad).all())
