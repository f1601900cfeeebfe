"""The checks must be able to fail: broken bijectors are caught."""

import math

import pytest
import torch

import flowkit
from flowkit.bijectors import AffineCoupling, Bijector, Chain, Invert, LULinear, Permutation, SplineCoupling
from flowkit.cli import main
from flowkit.testing import check_bijector, randomize


class _WrongLadj(Bijector):
    def __init__(self):
        super().__init__()
        self.event_shape = torch.Size([2])

    def forward(self, x, context=None):
        return 2 * x, x.new_zeros(x.shape[:-1])  # true ladj is 2 log 2

    def inverse(self, z, context=None):
        return z / 2, z.new_zeros(z.shape[:-1])


class _WrongInverse(_WrongLadj):
    def forward(self, x, context=None):
        return 2 * x, x.new_full(x.shape[:-1], 2 * torch.log(torch.tensor(2.0)).item())

    def inverse(self, z, context=None):
        return z / 3, -z.new_full(z.shape[:-1], 2 * torch.log(torch.tensor(2.0)).item())


class _Mixing(_WrongLadj):
    def forward(self, x, context=None):
        z = x + x.mean(0)  # couples points of a batch
        return z, x.new_zeros(x.shape[:-1])

    def inverse(self, z, context=None):
        return z - z.mean(0) / 2, z.new_zeros(z.shape[:-1])


class _NaNGradientFarOut(_WrongLadj):
    """The identity, whose gradient is NaN far out: where() with an unused branch that overflows."""

    def forward(self, x, context=None):
        # exp(x^2) is inf beyond |x| ~ 26.6; its zero cotangent then back-propagates as 0 * inf = NaN.
        z = torch.where(x.abs() < 1e6, x, torch.exp(x * x))
        return z, x.new_zeros(x.shape[:-1])

    def inverse(self, z, context=None):
        return z, z.new_zeros(z.shape[:-1])


def test_non_finite_gradients_far_out_are_caught():
    report = check_bijector(_NaNGradientFarOut(), raise_on_failure=False)
    failures = [f for f in report.failures]
    assert failures and all("far outside" in f for f in failures), report.failures
    assert check_bijector(_NaNGradientFarOut(), far=10.0, raise_on_failure=False).passed


def test_wrong_ladj_is_caught():
    with pytest.raises(AssertionError, match="autograd Jacobian"):
        check_bijector(_WrongLadj())


def test_wrong_inverse_is_caught():
    with pytest.raises(AssertionError, match="round trip"):
        check_bijector(_WrongInverse())


def test_batch_dependence_is_caught():
    report = check_bijector(_Mixing(), raise_on_failure=False)
    assert not report.passed
    assert any("batch independence" in f for f in report.failures)


def test_report_lists_passing_checks():
    report = check_bijector(Chain(randomize(LULinear(3))))
    assert report.passed
    assert {c for c, _, _ in report.results} >= {
        "round trip inverse(forward(x)) = x",
        "ladj = log|det| of the autograd Jacobian",
        "inverse ladj = -forward ladj",
        "batch independence",
    }


class _OffLadj(Bijector):
    """Doubles its input, with a log-determinant 1e-3 too large (and a consistent inverse)."""

    def __init__(self, features: int = 4):
        super().__init__()
        self.event_shape = torch.Size([features])

    def forward(self, x, context=None):
        return 2 * x, x.new_full(x.shape[:-1], x.shape[-1] * math.log(2) + 1e-3)

    def inverse(self, z, context=None):
        return z / 2, z.new_full(z.shape[:-1], -(z.shape[-1] * math.log(2) + 1e-3))


def _deep_chain(broken_at: int | None = None, features: int = 4, layers: int = 24, scale: float = 1.0) -> Chain:
    """LULinear, spline coupling, permutation and affine coupling in turn, randomised at a large scale."""
    torch.manual_seed(0)
    build = [
        lambda i: LULinear(features),
        lambda i: SplineCoupling(features, hidden=(8,), parity=i // 4 % 2),
        lambda i: Permutation(features, seed=i),
        lambda i: AffineCoupling(features, hidden=(8,), parity=i // 4 % 2),
    ]
    chain = randomize(Chain(*[build[i % 4](i) for i in range(layers)]), scale)
    if broken_at is not None:
        chain.layers[broken_at] = _OffLadj(features)
    return chain


def _x(features: int = 4) -> torch.Tensor:
    return torch.randn(4, features, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_a_deep_ill_conditioned_chain_passes_layer_by_layer():
    # Every layer agrees with its autograd Jacobian to ~1e-12, but the chain's Jacobian has a condition
    # number near 1e20: checking the whole chain at once (as before) failed it, round trip and
    # log-determinant off by O(1) to O(100) in float64.
    chain = _deep_chain()
    report = check_bijector(chain, _x())
    assert report.passed, str(report)
    assert len(report.layers) == 24 and all(layer.passed for layer in report.layers)
    assert report.layers[5].name == "layer 5 (Coupling)"
    details = dict((check, detail) for check, _, detail in report.results)
    assert "24 layers" in details["ladj = log|det| of the autograd Jacobian"]
    assert "whole chain not compared, ill-conditioned" in details["ladj = log|det| of the autograd Jacobian"]
    assert "not compared" in details["round trip inverse(forward(x)) = x"]
    assert details["chain = its layers in turn (z, and ladj = sum of the layers' ladjs)"] == "max error 0.00e+00"


def test_a_well_conditioned_chain_is_also_compared_as_a_whole():
    report = check_bijector(_deep_chain(layers=8, scale=0.1), _x())
    assert report.passed, str(report)
    details = dict((check, detail) for check, _, detail in report.results)
    assert "whole chain: max error" in details["ladj = log|det| of the autograd Jacobian"]
    assert "not compared" not in str(report)


def test_a_wrong_ladj_deep_inside_a_chain_is_caught_and_named():
    report = check_bijector(_deep_chain(broken_at=17), _x(), raise_on_failure=False)
    assert not report.passed
    assert len(report.failures) == 1, report.failures
    assert report.failures[0].startswith(
        "ladj = log|det| of the autograd Jacobian: layer 17 (_OffLadj): max error 1.00e-03"
    )
    assert [layer.name for layer in report.layers if not layer.passed] == ["layer 17 (_OffLadj)"]
    assert "  layer 17 (_OffLadj): FAIL\n    [FAIL] ladj = log|det| of the autograd Jacobian" in str(report)
    with pytest.raises(AssertionError, match=r"layer 17 \(_OffLadj\)"):
        check_bijector(_deep_chain(broken_at=17), _x())


def test_layers_of_nested_and_inverted_chains_are_named_by_their_path():
    inner = Chain(randomize(AffineCoupling(4, hidden=(8,))), _OffLadj(), LULinear(4))
    report = check_bijector(Chain(LULinear(4), Invert(inner)), _x(), raise_on_failure=False)
    assert [layer.name for layer in report.layers] == [
        "layer 0 (LULinear)",
        "layer 1.2 (Invert(LULinear))",
        "layer 1.1 (Invert(_OffLadj))",
        "layer 1.0 (Invert(Coupling))",
    ]
    assert [layer.name for layer in report.layers if not layer.passed] == ["layer 1.1 (Invert(_OffLadj))"]
    assert any("layer 1.1 (Invert(_OffLadj))" in f for f in report.failures)


def test_flowkit_check_names_the_failing_layer(monkeypatch, capsys):
    models = {"good": _deep_chain(), "broken": _deep_chain(broken_at=17)}
    monkeypatch.setattr(flowkit.io, "load", lambda path, **kwargs: models[str(path)])
    assert main(["check", "good"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["check", "broken"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "layer 17 (_OffLadj): FAIL" in out


# ---------------------------------------------------------------- check_flow on bounded domains


def _bounded_flows():
    from flowkit.bijectors import CircularSplineCoupling, Logit
    from flowkit.distributions import RigidBase, StandardNormal
    from flowkit.flows import NSF, Flow

    torch.manual_seed(0)

    def logit_normal(d):  # a flow on (0, 1)^d: the density lives on the box, not on the real line
        return Flow(Chain(Logit((d,), alpha=0.0), randomize(NSF(d, transforms=2, hidden=(8,)).bijector, 0.1)),
                    StandardNormal((d,)))  # fmt: skip

    torus = Flow(randomize(CircularSplineCoupling(2, bins=5, hidden=(16,)), 0.3), RigidBase(["angle", "angle"]))
    return {"interval 1-D": logit_normal(1), "interval 2-D": logit_normal(2), "torus": torus}


@pytest.mark.parametrize("name", ["interval 1-D", "interval 2-D", "torus"])
def test_check_flow_integrates_over_a_bounded_domain(name):
    from flowkit.testing import check_flow

    flow = _bounded_flows()[name]
    mass = dict((c, d) for c, _, d in check_flow(flow).results)["density integrates to 1"]
    assert "quadrature on" in mass

    class HalfMass(type(flow)):  # the same flow with half its density: the mass check must fail
        def log_prob(self, x, context=None):
            return super().log_prob(x, context) - math.log(2)

    half = HalfMass.__new__(HalfMass)
    half.__dict__ = flow.__dict__
    failed = [c for c, ok, _ in check_flow(half, raise_on_failure=False).results if not ok]
    assert "density integrates to 1" in failed
