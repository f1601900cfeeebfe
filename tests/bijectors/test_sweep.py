"""One sweep over every registered bijector: the float64 checks and a float32 round trip."""

import copy

import pytest
import torch

from flowkit.testing import check_bijector, examples

EXAMPLES = list(examples())
IDS = [name for name, _, _ in EXAMPLES]
# Stochastic blocks have no inverse to round-trip; their weights are tested in tests/test_stochastic.py.
INVERTIBLE = [e for e in EXAMPLES if not e[1].stochastic]


def test_registry_is_not_empty_and_names_are_unique():
    assert len(EXAMPLES) >= 10
    assert len(set(IDS)) == len(IDS)


@pytest.mark.parametrize("name,bijector,x", EXAMPLES, ids=IDS)
def test_check_bijector_float64(name, bijector, x):
    report = check_bijector(bijector, x)
    assert report.passed, str(report)


@pytest.mark.parametrize("name,bijector,x", INVERTIBLE, ids=[e[0] for e in INVERTIBLE])
def test_round_trip_float32(name, bijector, x):
    b = copy.deepcopy(bijector).float().eval()
    x = x.float()
    ctx = torch.randn(x.shape[0], b.context_features) if b.context_features else None
    z, ladj = b(x, ctx)
    x_back, ladj_inv = b.inverse(z, ctx)
    assert z.dtype == torch.float32 and ladj.dtype == torch.float32
    torch.testing.assert_close(x_back, x, atol=1e-5, rtol=0)
    torch.testing.assert_close(ladj_inv, -ladj, atol=1e-5, rtol=0)
