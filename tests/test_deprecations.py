"""Names that moved keep working from their old homes."""

import importlib

import pytest


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
        ("flowkit.transformers.smooth", "solve_monotone", "flowkit.root_finding"),
        ("flowkit.transformers.smooth", "implicit_newton_step", "flowkit.root_finding"),
        ("flowkit.bijectors.activations", "monotone_inverse", "flowkit.root_finding"),
        ("flowkit.distributions.base", "as_shape", "flowkit.utils"),
    ],
)
def test_moved_helpers_import_from_their_old_modules(old, name, new):
    assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize("name", ["segment_slices", "quaternion_to_matrix", "matrix_to_quaternion"])
def test_the_quaternion_geometry_moved_to_domains(name):
    with pytest.warns(DeprecationWarning, match="flowkit.domains"):
        value = getattr(importlib.import_module("flowkit.distributions.sphere"), name)
    assert value is getattr(importlib.import_module("flowkit.domains"), name)


@pytest.mark.parametrize(
    ("old", "name"),
    [("flowkit", "mcmc"), ("flowkit", "tails"), ("flowkit.targets.alanine", "internal_coordinate_flow")],
)
def test_removed_aliases_are_gone(old, name):
    # Deprecated in 0.1 and removed: `flowkit.sampling`, `flowkit.stats` and `flowkit.flows` are their homes.
    with pytest.raises((AttributeError, ModuleNotFoundError)):
        getattr(importlib.import_module(old), name)
