"""One sweep over the bijector cases (tests/cases.py): the float64 checks, a float32 round trip, completeness."""

import pytest
import torch
from cases import BIJECTORS, missing_cases

from flowkit.bijectors import Bijector
from flowkit.testing import check_bijector


def test_every_public_bijector_has_a_case():
    assert len(BIJECTORS) >= 10
    missing = missing_cases(Bijector, BIJECTORS)
    assert not missing, f"add a case to tests/cases.py BIJECTORS for: {', '.join(missing)}"


@pytest.mark.parametrize("name", BIJECTORS)
def test_check_bijector_float64(name):
    bijector, x = BIJECTORS[name]()
    report = check_bijector(bijector, x)
    assert report.passed, str(report)


@pytest.mark.parametrize("name", BIJECTORS)
def test_round_trip_float32(name):
    bijector, x = BIJECTORS[name]()
    b = bijector.float().eval()
    x = x.float()
    ctx = torch.randn(x.shape[0], b.context_features) if b.context_features else None
    z, ladj = b(x, ctx)
    x_back, ladj_inv = b.inverse(z, ctx)
    assert z.dtype == torch.float32 and ladj.dtype == torch.float32
    torch.testing.assert_close(x_back, x, atol=1e-5, rtol=0)
    torch.testing.assert_close(ladj_inv, -ladj, atol=1e-5, rtol=0)
