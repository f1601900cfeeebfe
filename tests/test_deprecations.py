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
        ("flowkit.stochastic", "StochasticFlow", "flowkit.flows"),
        ("flowkit.stochastic", "MetropolisBlock", "flowkit.flows"),
        ("flowkit.stochastic", "LangevinBlock", "flowkit.flows"),
        ("flowkit.stochastic", "StochasticBlock", "flowkit.flows"),
        ("flowkit.stochastic", "energy_of", "flowkit.targets"),
        ("flowkit.train.dependent", "Kinship", "flowkit.distributions"),
        ("flowkit.train.dependent", "EquicorrelatedGroups", "flowkit.distributions"),
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


@pytest.mark.parametrize("alias", ["mcmc", "stochastic"])
def test_deprecated_modules_are_still_attributes_of_the_package(alias):
    module = getattr(flowkit, alias)
    assert module.__name__ == f"flowkit.{alias}"
    with pytest.raises(AttributeError, match="no attribute"):
        _ = module.not_a_sampler
