"""Path-gradient estimators: the fast recursion against autograd, and the exact identities of Vaitl et al."""

import copy

import pytest
import torch
from cases import BIJECTORS, MISMATCH, mismatched_free_form

import flowkit
from flowkit.bijectors import ActNorm, Chain, LULinear, Permutation, Reshape
from flowkit.distributions import DiagNormal, StandardNormal
from flowkit.targets import Energy, ManyWell, Phi4
from flowkit.testing import randomize
from flowkit.train import ForwardKLPathGradient, MaximumLikelihood, PathGradientVI, fit
from flowkit.train.pathgrad import reverse_kl_loss, sample_with_score
from flowkit.train.score_rules import (
    forward_with_score,
    generic_forward_with_score,
    generic_inverse_with_score,
    has_score_rule,
    inverse_with_score,
)


def _realnvp(dim=4):
    return randomize(flowkit.flows.RealNVP(dim, transforms=4, hidden=(16,)), scale=0.1).double()


def _nsf(dim=4):
    return randomize(flowkit.flows.NSF(dim, transforms=4, hidden=(16,), coupling=True), scale=0.3).double()


def _mixed(dim=4):
    """Layers with the generic autograd rule (ActNorm) between specialised ones."""
    actnorm = ActNorm(dim)
    actnorm(torch.randn(64, dim) * 1.5 + 0.5)  # data-dependent initialisation, before the estimators run
    layers = [LULinear(dim), actnorm, flowkit.bijectors.AffineCoupling(dim, hidden=(16,)), Permutation(dim, seed=0)]
    return flowkit.Flow(randomize(Chain(*layers), scale=0.1), StandardNormal(dim)).double()


FLOWS = {"RealNVP": _realnvp, "NSF(coupling)": _nsf, "mixed": _mixed}


def _grads(flow, loss):
    flow.zero_grad()
    loss.backward()
    return torch.cat([p.grad.flatten() for p in flow.parameters()])


@pytest.mark.parametrize("make", FLOWS.values(), ids=FLOWS.keys())
def test_fast_and_standard_path_gradients_agree(make):
    flow, target = make(), ManyWell(4).double()
    z = flow.base.sample((16,))
    fast, values_fast = reverse_kl_loss(flow, target, z, "fast")
    standard, values_standard = reverse_kl_loss(flow, target, z, "standard")
    reparam, _ = reverse_kl_loss(flow, target, z, "reparam")
    torch.testing.assert_close(fast, standard)
    torch.testing.assert_close(fast, reparam)
    torch.testing.assert_close(values_fast, values_standard)
    g_fast, g_standard, g_reparam = _grads(flow, fast), _grads(flow, standard), _grads(flow, reparam)
    scale = g_standard.abs().max()
    assert float((g_fast - g_standard).abs().max() / scale) < 1e-5
    assert float((g_fast - g_reparam).abs().max() / scale) > 1e-3  # a different estimator on the same z


@pytest.mark.parametrize("make", FLOWS.values(), ids=FLOWS.keys())
def test_recursion_score_equals_autograd_through_log_prob(make):
    flow = make()
    z = flow.base.sample((9,))
    x, log_q, score = sample_with_score(flow, z)
    leaf = x.detach().requires_grad_(True)
    log_prob = flow.log_prob(leaf)
    (expected,) = torch.autograd.grad(log_prob.sum(), leaf)
    torch.testing.assert_close(score, expected, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(log_q, log_prob)
    assert not score.requires_grad


class _ConstantDensity(StandardNormal):
    """A base whose log_prob does not depend on its input (no graph), as a uniform base's may not."""

    def log_prob(self, x):
        return torch.full(x.shape[:-1], -1.5, dtype=x.dtype)


def test_recursion_with_a_base_density_that_ignores_its_input():
    flow = _nsf()
    flow.base = _ConstantDensity(4).double()
    z = torch.randn(7, 4, dtype=torch.float64)
    x, log_q, score = sample_with_score(flow, z)
    leaf = x.detach().requires_grad_(True)
    (expected,) = torch.autograd.grad(flow.log_prob(leaf).sum(), leaf)
    torch.testing.assert_close(score, expected, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(log_q, flow.log_prob(x.detach()))


def test_recursion_on_a_lattice_flow_with_reshapes():
    L = 3
    inner = randomize(flowkit.flows.RealNVP(L * L, transforms=3, hidden=(8,)), scale=0.2).bijector
    flow = flowkit.Flow(
        Chain(Reshape((L, L), (L * L,)), inner, Reshape((L * L,), (L, L))), StandardNormal((L, L))
    ).double()
    z = flow.base.sample((5,))
    x, _, score = sample_with_score(flow, z)
    leaf = x.detach().requires_grad_(True)
    (expected,) = torch.autograd.grad(flow.log_prob(leaf).sum(), leaf)
    torch.testing.assert_close(score, expected)


def _build(name):
    """``(name, bijector, x)`` of a case of tests/cases.py, built under a fixed seed."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return (name, *BIJECTORS[name]())


EXAMPLES = [e for e in map(_build, BIJECTORS) if has_score_rule(type(e[1]))]


@pytest.mark.parametrize("name,bijector,x", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_specialised_score_rules_match_the_generic_rule(name, bijector, x):
    b, x = copy.deepcopy(bijector).double(), x.double()
    context = torch.randn(x.shape[0], b.context_features, dtype=torch.float64) if b.context_features else None
    score_x = torch.randn_like(x)
    z, ladj, score_z = forward_with_score(b, x, score_x, context)
    _, ladj_ref, score_ref = generic_forward_with_score(b, x, score_x, context)
    torch.testing.assert_close(score_z, score_ref)
    torch.testing.assert_close(ladj, ladj_ref)
    score_z = torch.randn_like(z)
    x_back, _, score_back = inverse_with_score(b, z, score_z, context)
    torch.testing.assert_close(score_back, generic_inverse_with_score(b, z, score_z, context)[2])
    torch.testing.assert_close(x_back, x)


CONDITIONAL = [e for e in EXAMPLES if e[1].context_features]


@pytest.mark.parametrize("name,bijector,x", CONDITIONAL, ids=[e[0] for e in CONDITIONAL])
def test_specialised_score_rules_broadcast_a_point_against_its_context(name, bijector, x):
    b, x = copy.deepcopy(bijector).double(), x[:1].double()
    context = torch.randn(5, b.context_features, dtype=torch.float64)
    score_x = torch.randn(5, *x.shape[1:], dtype=torch.float64)
    z, _, score_z = forward_with_score(b, x, score_x, context)
    assert z.shape == score_z.shape == score_x.shape
    torch.testing.assert_close(score_z, generic_forward_with_score(b, x, score_x, context)[2])
    z1 = z[:1]
    torch.testing.assert_close(
        inverse_with_score(b, z1, score_z, context)[2], generic_inverse_with_score(b, z1, score_z, context)[2]
    )


def test_score_entry_points_check_their_inputs():
    b = copy.deepcopy(EXAMPLES[0][1])
    x = EXAMPLES[0][2]
    with pytest.raises(ValueError, match="score has shape"):
        forward_with_score(b, x, torch.randn(1, *x.shape[1:]))
    with pytest.raises(ValueError, match="non-finite"):
        inverse_with_score(b, x, torch.full_like(x, float("nan")))
    with pytest.raises(ValueError, match="non-finite"):
        forward_with_score(b, torch.full_like(x, float("nan")), torch.randn_like(x))


def _target_equal_to(flow):
    frozen = copy.deepcopy(flow).requires_grad_(False)
    return Energy(lambda x: -frozen.log_prob(x), frozen.event_shape)


def test_path_gradient_vanishes_per_sample_when_q_equals_p():
    flow = _nsf(3)
    target = _target_equal_to(flow)
    z = flow.base.sample((12,))
    x, _, score = sample_with_score(flow, z)
    per_sample = score - target.force(x.detach())
    # Zero up to the spline inversion's round-off (the target evaluates log q at the sample by the forward map).
    assert float(per_sample.abs().max()) < 1e-8 * float(score.abs().max())
    reparam = _grads(flow, PathGradientVI(target, "reparam").loss(flow, z)).abs().max()
    assert float(reparam) > 1e-3
    for estimator in ("fast", "standard"):
        path = _grads(flow, PathGradientVI(target, estimator).loss(flow, z))
        assert float(path.abs().max()) < 1e-8 * float(reparam)


def test_forward_kl_path_gradient_equals_the_drop_in_gdreg_estimator():
    flow, target = _realnvp(4), ManyWell(4).double()
    x = target.sample(32, generator=torch.Generator().manual_seed(0)).double()
    fast = ForwardKLPathGradient(target).loss(flow, x)
    torch.testing.assert_close(fast, -flow.log_prob(x).mean())
    # GDReG (Vaitl et al. 2024, Alg. 3): grad_x (log q + u) at x, pulled back along the sampling map at z = f(x).
    leaf = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad((flow.log_prob(leaf) + target.energy(leaf)).sum(), leaf)
    z = flow.bijector(x)[0].detach()
    x_again = flow.bijector.inverse(z)[0]
    t = (x_again * g).sum() / x.shape[0]
    g_fast = _grads(flow, fast)
    assert float((g_fast - _grads(flow, t)).abs().max()) < 1e-8 * float(g_fast.abs().max())
    via_ml = MaximumLikelihood(target=target).loss(flow, x)
    torch.testing.assert_close(_grads(flow, via_ml), g_fast)


def test_forward_kl_path_gradient_vanishes_when_q_equals_p():
    flow = _realnvp(3)
    target = _target_equal_to(flow)
    x = flow.sample((10,))
    assert float(_grads(flow, ForwardKLPathGradient(target).loss(flow, x)).abs().max()) < 1e-10


@pytest.mark.slow
def test_phi4_free_field_log_Z_after_a_short_run():
    L = 4
    torch.manual_seed(1)
    target = Phi4(L, m2=1.0, lam=0.0)
    n = L * L
    couplings = [flowkit.bijectors.AffineCoupling(n, parity=i % 2, hidden=(32,)) for i in range(4)]
    flow = flowkit.Flow(Chain(Reshape((L, L), (n,)), *couplings, Reshape((n,), (L, L))), StandardNormal((L, L)))
    fit(flow, PathGradientVI(target, "fast"), steps=400, batch_size=256, lr=1e-2, progress=False)
    log_w = flowkit.sampling.log_weights(flow, target, 20_000)
    estimate, error = flowkit.sampling.log_Z(log_w)
    assert abs(estimate - target.log_Z) < 0.05
    assert error < 0.02


def test_bad_configurations_are_errors():
    target = ManyWell(2)
    with pytest.raises(ValueError, match="estimator"):
        PathGradientVI(target, "score-function")
    with pytest.raises(ValueError, match="Target"):
        PathGradientVI(lambda x: x, "fast")
    flow = flowkit.Flow(flowkit.bijectors.AffineCoupling(2), DiagNormal(2))
    with pytest.raises(ValueError, match="trainable parameters"):
        PathGradientVI(target).loss(flow, 8)
    with pytest.raises(ValueError, match="event shape"):
        PathGradientVI(ManyWell(4)).loss(flowkit.flows.RealNVP(2, transforms=1), 8)
    with pytest.raises(ValueError, match="conditional"):
        PathGradientVI(target).loss(flowkit.flows.RealNVP(2, transforms=1, context=1), 8)


@pytest.mark.parametrize("direction", ["forward", "inverse"])
def test_affine_params_cotangent_is_autograds(direction):
    from flowkit.train.score_rules import params_cotangent
    from flowkit.transformers import Affine

    g = torch.Generator().manual_seed(3)
    t = Affine(clamp=2.0)
    x = torch.randn(7, 3, generator=g, dtype=torch.float64)
    params = (2 * torch.randn(7, 3, 2, generator=g, dtype=torch.float64)).requires_grad_(True)
    w = torch.randn(7, 3, generator=g, dtype=torch.float64)
    out, ladj = getattr(t, direction)(x, params)
    (expected,) = torch.autograd.grad((out, ladj), params, (w, torch.ones_like(ladj)))
    got = params_cotangent(t, direction, params.detach(), out.detach(), ladj.detach(), w)
    torch.testing.assert_close(got, expected)


def test_path_gradient_vi_refuses_a_flow_whose_samples_do_not_follow_its_density():
    # Issue 38 (3): the reverse KL weights the flow's own samples; a FreeFormFlow's are its decoder's.
    model, target = mismatched_free_form()
    for estimator in ("fast", "standard", "reparam"):
        with pytest.raises(ValueError, match=f"PathGradientVI: {MISMATCH}"):
            PathGradientVI(target, estimator).loss(model, 16)
