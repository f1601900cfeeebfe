"""Base distributions (tests/cases.py DISTRIBUTIONS): samples, log densities and normalisation."""

import pytest
from cases import DISTRIBUTIONS, missing_cases

from flowkit.bijectors import Reshape
from flowkit.distributions import Distribution
from flowkit.flows import Flow
from flowkit.testing import check_flow


def test_every_public_distribution_has_a_case():
    missing = missing_cases(Distribution, DISTRIBUTIONS)
    assert not missing, f"add a case to tests/cases.py DISTRIBUTIONS for: {', '.join(missing)}"


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_check_flow_on_the_distribution_alone(name):
    base = DISTRIBUTIONS[name]()
    identity = Reshape(base.event_shape, base.event_shape)
    report = check_flow(Flow(identity, base))
    assert "density integrates to 1" in {check for check, _, _ in report.results}
    assert report.passed, str(report)
