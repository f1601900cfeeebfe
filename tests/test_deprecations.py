"""Names that moved keep working from their old homes, with a DeprecationWarning naming the new one."""

import importlib

import pytest

import flowkit


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
        ("flowkit.mcmc", "hmc", "flowkit.sampling"),
        ("flowkit.mcmc", "independent_metropolis", "flowkit.sampling"),
        ("flowkit.mcmc", "integrated_autocorrelation_time", "flowkit.sampling"),
        ("flowkit.targets.alanine", "internal_coordinate_flow", "flowkit.flows"),
        ("flowkit.tails", "estimate_tails", "flowkit.stats"),
    ],
)
def test_moved_names_warn_and_are_the_same_object(old, name, new):
    with pytest.warns(DeprecationWarning, match=new):
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), name)


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


def test_flowkit_mcmc_is_still_an_attribute_of_the_package():
    assert flowkit.mcmc.__name__ == "flowkit.mcmc"
    with pytest.raises(AttributeError, match="no attribute"):
        _ = flowkit.mcmc.not_a_sampler
