"""The MAF and NSF presets: shapes, correctness checks, save/load and torch.compile."""

import pytest
import torch

import flowkit
from flowkit.flows import MAF, NSF
from flowkit.testing import check_bijector, check_flow, randomize


def test_one_dimensional_nsf_passes_check_flow_and_integrates_to_one():
    report = check_flow(randomize(NSF(1, transforms=2, bins=6, hidden=(16,), bound=3.0), 0.1))
    assert report.passed, str(report)


@pytest.mark.parametrize(
    "flow",
    [
        NSF(3, transforms=2, bins=6, hidden=(16,), bound=3.0, context=2),
        NSF(3, transforms=3, bins=6, hidden=(16,), bound=3.0, coupling=True, context=2),
        MAF(3, transforms=2, hidden=(16,), residual=True, context=2),
    ],
    ids=["nsf-ar", "nsf-coupling", "maf"],
)
def test_presets_pass_check_bijector(flow):
    x = 2 * torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    report = check_bijector(randomize(flow, 0.1).bijector, x)
    assert report.passed, str(report)


def test_conditional_presets_sample_with_context():
    flows = (
        NSF(3, 2, hidden=(8,), context=2),
        NSF(3, 2, hidden=(8,), context=2, coupling=True),
        MAF(3, 2, (8,), context=2),
    )
    for flow in flows:
        context = torch.randn(4, 2)
        x, log_q = flow.sample_and_log_prob((5,), context)
        assert x.shape == (5, 4, 3) and log_q.shape == (5, 4)
        torch.testing.assert_close(flow.log_prob(x, context.expand(5, 4, 2)), log_q, atol=1e-4, rtol=1e-4)


def test_layers_and_permutations():
    flow = NSF(4, transforms=3, coupling=True)
    kinds = [b._get_name() for b in flow.bijector]  # the layer names shown in reprs and errors
    assert kinds == ["SplineCoupling", "Permutation", "SplineCoupling", "Permutation", "SplineCoupling"]
    flow = MAF(4, transforms=2)
    kinds = [b._get_name() for b in flow.bijector]
    assert kinds == ["MaskedAffineAutoregressive", "Reverse", "MaskedAffineAutoregressive"]
    with pytest.raises(ValueError, match="residual"):
        NSF(4, coupling=True, residual=True)


def test_save_and_load_round_trip(tmp_path):
    flow = randomize(NSF(3, transforms=2, hidden=(8,), residual=True))
    path = flowkit.io.save(flow, tmp_path / "nsf")
    loaded = flowkit.io.load(path)
    x = torch.randn(6, 3)
    torch.testing.assert_close(loaded.log_prob(x), flow.log_prob(x))


@pytest.mark.slow
def test_torch_compile_gives_the_same_outputs():
    # aot_eager traces forward and backward through the compiler stack without
    # generating C++ (inductor takes minutes on two cores). fullgraph=True fails
    # on any graph break, i.e. on a host synchronisation or data-dependent branch.
    flow = randomize(NSF(3, transforms=2, bins=4, hidden=(8,), bound=2.0), 0.2)
    flowkit.set_validation(False)
    try:
        x = 2 * torch.randn(16, 3)
        x[0] = torch.tensor([2.0, -2.0, 10.0])  # at the bounds and in the tail
        compiled = torch.compile(flow.log_prob, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(compiled(x), flow.log_prob(x))
        z = torch.randn(16, 3)
        inverse = torch.compile(flow.bijector.inverse, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(inverse(z)[0], flow.bijector.inverse(z)[0])
    finally:
        flowkit.set_validation(True)


def _presets_with_options():
    """Each preset with a non-default base, transformer and conditioner factory."""
    from functools import partial

    from flowkit.distributions import DiagNormal
    from flowkit.nn import MADE, MLP
    from flowkit.transformers import Affine, RationalQuadraticSpline

    spline = RationalQuadraticSpline(4, 3.0)
    return {
        "realnvp": flowkit.flows.RealNVP(
            3, 2, transformer=spline, conditioner=partial(MLP, hidden=(12,), activation="tanh"), base=DiagNormal(3)
        ),
        "maf": MAF(
            3, 2, transformer=spline, conditioner=partial(MADE, hidden=(12, 12), residual=True), base=DiagNormal(3)
        ),
        "nsf-ar": NSF(3, 2, transformer=Affine(2.0), conditioner=partial(MADE, hidden=(10,)), base=DiagNormal(3)),
        "nsf-coupling": NSF(3, 2, coupling=True, conditioner=partial(MLP, hidden=(10,)), base=DiagNormal(3, scale=2.0)),
    }


@pytest.mark.parametrize("name", ["realnvp", "maf", "nsf-ar", "nsf-coupling"])
def test_presets_take_base_transformer_and_conditioner_and_save(name, tmp_path):
    from flowkit.distributions import DiagNormal

    flow = randomize(_presets_with_options()[name], 0.1)
    assert isinstance(flow.base, DiagNormal)
    layers = [b for b in flow.bijector if hasattr(b, "conditioner")]
    hidden = {"realnvp": 12, "maf": 12, "nsf-ar": 10, "nsf-coupling": 10}[name]
    for layer in layers:
        first = getattr(layer.conditioner, "hidden_layers", layer.conditioner)[0]
        assert first.out_features == hidden
    assert len({id(layer.transformer) for layer in layers}) == len(layers)  # a copy per layer
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    report = check_bijector(flow.bijector, x)
    assert report.passed, str(report)
    loaded = flowkit.io.load(flowkit.io.save(flow, tmp_path / name))
    assert type(loaded) is type(flow) and flowkit.io.to_config(loaded) == flowkit.io.to_config(flow)
    assert torch.equal(loaded.log_prob(x), flow.log_prob(x))


def test_preset_defaults_are_unchanged_by_the_new_arguments():
    from flowkit.distributions import StandardNormal
    from flowkit.transformers import Affine, RationalQuadraticSpline

    flow = NSF(3, 2, bins=5, bound=2.0)
    assert type(flow.base) is StandardNormal
    assert all(
        isinstance(b.transformer, RationalQuadraticSpline) and b.transformer.bins == 5 for b in flow.bijector[::2]
    )
    flow = flowkit.flows.RealNVP(4, 2, hidden=(6,))
    assert all(isinstance(b.transformer, Affine) and b.conditioner[0].out_features == 6 for b in flow.bijector)


def test_presets_refuse_bad_options_by_name():
    from flowkit.nn import MLP

    with pytest.raises(ValueError, match="conditioner must be a factory"):
        flowkit.flows.RealNVP(4, conditioner=MLP(2, 4))
    with pytest.raises(ValueError, match="transformer must be a flowkit Transformer"):
        MAF(3, transformer="affine")
    with pytest.raises(ValueError, match="must be autoregressive"):
        MAF(3, conditioner=MLP)
    with pytest.raises(ValueError, match="event shape"):
        NSF(3, base=flowkit.distributions.StandardNormal(4))


def _transformed_features(flow):
    """For each coupling layer of `flow`, the set of input features (data coordinates) it transforms."""
    where = torch.arange(flow.event_shape[0])  # where[j]: the data feature at position j
    sets = []
    for b in flow.bijector:
        if isinstance(b, flowkit.bijectors.Permutation):
            where = where[b.perm]  # z_j = x_{perm[j]}
        else:
            sets.append(set(where[b.transformed_idx].tolist()))
    return sets


@pytest.mark.parametrize("features", [2, 3, 4, 5])
def test_coupling_nsf_transforms_every_feature_every_other_layer(features):
    sets = _transformed_features(NSF(features, transforms=4, hidden=(8,), coupling=True, permutations="alternate"))
    everything = set(range(features))
    for previous, current in zip(sets, sets[1:], strict=False):
        assert everything - previous <= current  # what one layer conditions on, the next transforms
    if features == 2:
        assert sets == [{1}, {0}, {1}, {0}]


def test_coupling_nsf_random_permutations_are_the_earlier_seeded_ones():
    flow = NSF(2, transforms=4, hidden=(8,), coupling=True, permutations="random")
    perms = [b.perm for b in flow.bijector if isinstance(b, flowkit.bijectors.Permutation)]
    for i, perm in enumerate(perms, start=1):
        assert torch.equal(perm, flowkit.bijectors.Permutation(2, seed=i).perm)
    # The defect they had at D = 2: one feature transformed by three of the four layers, the other by one.
    counts = [sum(j in s for s in _transformed_features(flow)) for j in range(2)]
    assert sorted(counts) == [1, 3]
    with pytest.raises(ValueError, match="permutations"):
        NSF(2, coupling=True, permutations="reverse")


def _last_layers(flow):
    return [b.conditioner.last for b in flow.bijector if hasattr(b, "conditioner")]


@pytest.mark.parametrize("coupling", [False, True])
def test_nsf_starts_exactly_near_or_randomly_around_the_identity(coupling):
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(0))
    exact = NSF(3, transforms=2, hidden=(16,), coupling=coupling, near_identity=False)
    torch.testing.assert_close(exact.log_prob(x), exact.base.log_prob(x))
    for options in ({"near_identity": True}, {"start": "near"}, {"near_identity": True, "start": "near"}):
        torch.manual_seed(0)
        flow = NSF(3, transforms=2, hidden=(16,), coupling=coupling, **options)
        assert not torch.allclose(flow.log_prob(x), flow.base.log_prob(x))
        for last, reference in zip(_last_layers(flow), _last_layers(exact), strict=True):
            assert torch.equal(last.weight, torch.zeros_like(last.weight))
            offset = last.bias - reference.bias  # the offsets of a fresh nn.Linear bias, U(-1/4, 1/4)
            assert offset.abs().max() <= 0.25 and offset.abs().max() > 0
    torch.manual_seed(0)
    flow = NSF(3, transforms=2, hidden=(16,), coupling=coupling, start="random")
    for last, reference in zip(_last_layers(flow), _last_layers(exact), strict=True):
        assert 0 < last.weight.abs().max() <= 0.25  # nn.Linear's U(-1/sqrt(16), 1/sqrt(16))
        assert 0 < (last.bias - reference.bias).abs().max() <= 0.25
    assert torch.equal(NSF(3, 2, hidden=(16,), coupling=coupling, start="identity").log_prob(x), exact.log_prob(x))
    with pytest.raises(ValueError, match="disagree"):
        NSF(3, coupling=coupling, near_identity=False, start="near")
    with pytest.raises(ValueError, match="start must be one of"):
        NSF(3, coupling=coupling, start="zero")


@pytest.mark.parametrize(
    ("coupling", "features", "start"),
    [
        (False, 2, "near"),
        (False, 5, "near"),
        (True, 2, "random"),
        (True, 3, "identity"),
        (True, 6, "identity"),
    ],
)
def test_nsf_default_start_is_the_measured_one(coupling, features, start):
    # Issue 38 (docs/benchmarks.md): autoregressive layers near the identity; coupling layers where zuko's
    # start at D = 2, where they alternate as zuko's do, and exactly at the identity above.
    torch.manual_seed(3)
    default = NSF(features, transforms=3, hidden=(8,), coupling=coupling)
    torch.manual_seed(3)
    explicit = NSF(features, transforms=3, hidden=(8,), coupling=coupling, start=start)
    for a, b in zip(default.state_dict().values(), explicit.state_dict().values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("features", [2, 3, 4, 5])
def test_coupling_nsf_default_permutations_alternate_at_two_features_and_are_random_above(features):
    flow = NSF(features, transforms=4, hidden=(8,), coupling=True)
    perms = [b.perm for b in flow.bijector if isinstance(b, flowkit.bijectors.Permutation)]
    if features == 2:  # a random permutation of two features is the identity or the swap, which cancels
        assert all(torch.equal(perm, torch.arange(2)) for perm in perms)
        assert _transformed_features(flow) == [{1}, {0}, {1}, {0}]
    else:  # the earlier default, unchanged
        for i, perm in enumerate(perms, start=1):
            assert torch.equal(perm, flowkit.bijectors.Permutation(features, seed=i).perm)


@pytest.mark.parametrize("coupling", [False, True])
@pytest.mark.parametrize("features", [2, 4])
def test_nsf_saved_before_the_new_defaults_loads_bit_for_bit(coupling, features, tmp_path):
    # A config written before `permutations`, `near_identity` and `start` existed names none: the new defaults
    # build the same modules, and the saved permutations (buffers) and weights replace what they drew.
    import json

    torch.manual_seed(1)
    flow = randomize(
        NSF(features, transforms=4, hidden=(8,), coupling=coupling, permutations="random", near_identity=False), 0.3
    )
    path = flowkit.io.save(flow, tmp_path / "old")
    config = json.loads((path / "config.json").read_text())
    for key in ("permutations", "near_identity", "start"):
        del config["model"]["args"][key]
    (path / "config.json").write_text(json.dumps(config))
    loaded = flowkit.io.load(path)
    x = torch.randn(9, features, generator=torch.Generator().manual_seed(2))
    assert torch.equal(loaded.log_prob(x), flow.log_prob(x))
    for a, b in zip(loaded.state_dict().values(), flow.state_dict().values(), strict=True):
        assert torch.equal(a, b)
