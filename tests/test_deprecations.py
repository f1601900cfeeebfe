"""Names that moved keep working from their old homes, with a DeprecationWarning naming the new one."""

import importlib

import pytest
import torch

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
