"""Checks shared by the tests of flows on manifolds: normalisation by uniform Monte Carlo, antipodal equivariance."""

import torch

from flowkit.testing import _uniform_mass


def assert_integrates_to_one(flow, domain, n, seed, max_err):
    """vol(M) E_{U(M)}[p] = 1 within 3 standard errors, and the standard error below `max_err` (informative)."""
    mass, err = _uniform_mass(flow, domain, n, seed)
    assert abs(mass - 1) < 3 * err, (mass, err)
    assert err < max_err, (mass, err)


def assert_antipodally_equivariant(bijector, x, slices):
    """Flipping the quaternion in each slice flips it in the output and leaves the log-determinant unchanged."""
    z, ladj = bijector(x)
    for sl in slices:
        flipped = x.clone()
        flipped[:, sl] = -flipped[:, sl]
        z_f, ladj_f = bijector(flipped)
        expected = z.clone()
        expected[:, sl] = -expected[:, sl]
        torch.testing.assert_close(z_f, expected, atol=1e-10, rtol=0)
        torch.testing.assert_close(ladj_f, ladj, atol=1e-10, rtol=0)
