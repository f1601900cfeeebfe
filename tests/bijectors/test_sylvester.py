"""Householder reflections and Sylvester flows: orthogonality, log-determinant, back-substitution inverse, bad input."""

import pytest
import torch

from flowkit.bijectors import Householder, Sylvester
from flowkit.root_finding import ConvergenceError
from flowkit.testing import check_bijector, randomize


@pytest.mark.parametrize("reflections", [1, 2, 3, 4])
def test_householder_is_orthogonal_with_determinant_of_sign_minus_one_to_the_k(reflections):
    layer = Householder(4, reflections).double()
    q = layer.matrix().detach()
    torch.testing.assert_close(q @ q.mT, torch.eye(4, dtype=torch.float64))
    assert round(float(torch.linalg.det(q))) == (-1) ** reflections
    x = torch.randn(5, 4, dtype=torch.float64)
    z, ladj = layer(x)
    torch.testing.assert_close(z, x @ q.mT)
    assert layer.ladj_is_constant and (ladj == 0).all()


@pytest.mark.parametrize("reflections", [0, 5, -1])
def test_householder_refuses_no_reflection_and_more_reflections_than_features(reflections):
    with pytest.raises(ValueError, match="reflections must be an integer from 1 to features = 4"):
        Householder(4, reflections)


@pytest.mark.parametrize(
    "options",
    [{"variant": "orthogonal"}, {"variant": "orthogonal", "columns": 1}, {"variant": "householder", "reflections": 3}],
)
def test_q_has_orthonormal_columns(options):
    q = randomize(Sylvester(4, **options), scale=1.0).double().q()
    torch.testing.assert_close(q.mT @ q, torch.eye(q.shape[1], dtype=torch.float64))


@pytest.mark.parametrize("variant", ["orthogonal", "householder", "triangular"])
def test_the_layer_stays_invertible_at_extreme_diagonals(variant):
    # Diagonals far into tanh's saturation: R_ii R~_ii near -1 or 1, a flat or steep map; the solve still holds.
    layer = randomize(Sylvester(3, variant=variant), scale=1.0).double()
    with torch.no_grad():
        layer.r_diagonal.copy_(torch.tensor([8.0, -8.0, 3.0]))
        layer.r_tilde_diagonal.copy_(torch.tensor([-8.0, 8.0, 3.0]))
    r, r_tilde = layer.triangles()
    assert float((torch.diagonal(r) * torch.diagonal(r_tilde)).min()) > -1
    check_bijector(layer, 2 * torch.randn(8, 3, dtype=torch.float64))


def test_log_determinant_is_the_triangular_formula():
    layer = randomize(Sylvester(4, columns=3), scale=1.0).double()
    x = torch.randn(6, 4, dtype=torch.float64)
    _, ladj = layer(x)
    jacobians = torch.stack([torch.autograd.functional.jacobian(lambda v: layer(v)[0], point) for point in x])
    torch.testing.assert_close(ladj, torch.linalg.slogdet(jacobians)[1], rtol=1e-10, atol=1e-10)


def test_an_unfinished_inverse_raises():
    layer = randomize(Sylvester(3, iterations=1), scale=2.0).double()
    with pytest.raises(ConvergenceError, match="Sylvester.inverse"):
        layer.inverse(3 * torch.randn(20, 3, dtype=torch.float64))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"variant": "lower"}, "variant must be one of orthogonal, householder, triangular"),
        ({"columns": 0}, "columns must be an integer from 1 to features = 3"),
        ({"columns": 4}, "columns must be an integer from 1 to features = 3"),
        ({"variant": "householder", "reflections": 4}, "reflections must be an integer from 1 to features = 3"),
        ({"variant": "householder", "reflections": 0}, "reflections must be"),
        ({"variant": "triangular", "columns": 2}, "columns is an option of the 'orthogonal' variant"),
        ({"variant": "orthogonal", "reflections": 2}, "reflections is an option of the 'householder' variant"),
        ({"reverse": True}, "reverse is an option of the 'triangular' variant"),
    ],
)
def test_bad_input_is_a_value_error(options, message):
    with pytest.raises(ValueError, match=message):
        Sylvester(3, **options)
