"""Names that moved keep working from their old homes."""

import importlib

import pytest
import torch

import flowkit


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
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


def test_the_deprecated_stochastic_module_is_still_an_attribute_of_the_package():
    module = flowkit.stochastic
    assert module.__name__ == "flowkit.stochastic"
    with pytest.raises(AttributeError, match="no attribute"):
        _ = module.not_a_sampler


@pytest.mark.parametrize("stochastic", [False, True], ids=["Flow", "StochasticFlow"])
def test_models_weight_methods_warn_and_give_the_sampling_functions_numbers(stochastic):
    from flowkit.flows import MetropolisBlock, StochasticFlow

    target = flowkit.targets.DoubleWell()
    layers = [flowkit.bijectors.AffineCoupling(2), MetropolisBlock(target, lam=0.5)][: 1 + stochastic]
    flow = StochasticFlow(layers, flowkit.distributions.StandardNormal(2))
    if not stochastic:
        flow = flowkit.flows.Flow(layers[0], flow.base)
    z = torch.randn(8, 2)
    torch.manual_seed(1)
    with pytest.warns(DeprecationWarning, match="flowkit.sampling.log_weights_at"):
        old = flow.log_weights_at(z, target)
    torch.manual_seed(1)
    new = flowkit.sampling.log_weights_at(flow, z, target)
    torch.manual_seed(2)
    with pytest.warns(DeprecationWarning, match="flowkit.sampling.sample_with_log_weights"):
        old_drawn = flow.sample_with_log_weights(5, target)
    torch.manual_seed(2)
    new_drawn = flowkit.sampling.sample_with_log_weights(flow, 5, target)
    for a, b in zip((*old, *old_drawn), (*new, *new_drawn), strict=True):
        torch.testing.assert_close(a, b)


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
