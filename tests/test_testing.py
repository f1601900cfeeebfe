"""The checks must be able to fail: broken bijectors are caught."""

import pytest
import torch

from flowkit.bijectors import Bijector, Chain, LULinear
from flowkit.testing import check_bijector, randomize


class _WrongLadj(Bijector):
    def __init__(self):
        super().__init__()
        self.event_shape = torch.Size([2])

    def forward(self, x, context=None):
        return 2 * x, x.new_zeros(x.shape[:-1])  # true ladj is 2 log 2

    def inverse(self, z, context=None):
        return z / 2, z.new_zeros(z.shape[:-1])


class _WrongInverse(_WrongLadj):
    def forward(self, x, context=None):
        return 2 * x, x.new_full(x.shape[:-1], 2 * torch.log(torch.tensor(2.0)).item())

    def inverse(self, z, context=None):
        return z / 3, -z.new_full(z.shape[:-1], 2 * torch.log(torch.tensor(2.0)).item())


class _Mixing(_WrongLadj):
    def forward(self, x, context=None):
        z = x + x.mean(0)  # couples points of a batch
        return z, x.new_zeros(x.shape[:-1])

    def inverse(self, z, context=None):
        return z - z.mean(0) / 2, z.new_zeros(z.shape[:-1])


class _NaNGradientFarOut(_WrongLadj):
    """The identity, whose gradient is NaN far out: where() with an unused branch that overflows."""

    def forward(self, x, context=None):
        # exp(x^2) is inf beyond |x| ~ 26.6; its zero cotangent then back-propagates as 0 * inf = NaN.
        z = torch.where(x.abs() < 1e6, x, torch.exp(x * x))
        return z, x.new_zeros(x.shape[:-1])

    def inverse(self, z, context=None):
        return z, z.new_zeros(z.shape[:-1])


def test_non_finite_gradients_far_out_are_caught():
    report = check_bijector(_NaNGradientFarOut(), raise_on_failure=False)
    failures = [f for f in report.failures]
    assert failures and all("far outside" in f for f in failures), report.failures
    assert check_bijector(_NaNGradientFarOut(), far=10.0, raise_on_failure=False).passed


def test_wrong_ladj_is_caught():
    with pytest.raises(AssertionError, match="autograd Jacobian"):
        check_bijector(_WrongLadj())


def test_wrong_inverse_is_caught():
    with pytest.raises(AssertionError, match="round trip"):
        check_bijector(_WrongInverse())


def test_batch_dependence_is_caught():
    report = check_bijector(_Mixing(), raise_on_failure=False)
    assert not report.passed
    assert any("batch independence" in f for f in report.failures)


def test_report_lists_passing_checks():
    report = check_bijector(Chain(randomize(LULinear(3))))
    assert report.passed
    assert {c for c, _, _ in report.results} >= {
        "round trip inverse(forward(x)) = x",
        "ladj = log|det| of the autograd Jacobian",
        "inverse ladj = -forward ladj",
        "batch independence",
    }
