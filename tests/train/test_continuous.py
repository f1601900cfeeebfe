"""RNODE integrals against closed forms, TO-FLOW's end time at its known optimum, flow matching's paths."""

import math

import pytest
import torch
from torch import nn

import flowkit
from flowkit.bijectors import Chain, ContinuousFlow, Invert, Standardization
from flowkit.bijectors.continuous import trajectory_integrals
from flowkit.distributions import StandardNormal
from flowkit.flows import Flow
from flowkit.nn import VectorField
from flowkit.train import fit
from flowkit.train.continuous import FlowMatching, LearnEndTime, RegularizedLikelihood, _ot_pairing


class LinearField(nn.Module):
    def __init__(self, a: torch.Tensor, trainable: bool = True) -> None:
        super().__init__()
        self.a = nn.Parameter(a, requires_grad=trainable)
        self.unused = nn.Parameter(torch.zeros((), dtype=a.dtype))  # something for the optimiser to hold

    def forward(self, x, context=None, *, t):
        return x @ self.a.T + 0 * self.unused


def test_kinetic_and_jacobian_integrals_of_a_scaled_identity_field():
    a, t1, d = 0.6, 0.8, 3
    flow = ContinuousFlow(LinearField(a * torch.eye(d, dtype=torch.float64)), d, t1=t1, atol=1e-10, rtol=1e-10).double()
    x = torch.randn(5, d, dtype=torch.float64)
    z, ladj, records = flow.forward_with_integrals(x, names=("kinetic", "jacobian"))
    # x(t) = exp(a t) x0: int |a x(t)|^2 dt = a |x0|^2 (exp(2 a T) - 1) / 2, and |A|_F^2 = d a^2 at all times.
    kinetic = a * x.square().sum(-1) * (math.exp(2 * a * t1) - 1) / 2
    assert len(records) == 1
    torch.testing.assert_close(records[0]["kinetic"], kinetic, atol=1e-7, rtol=1e-7)
    torch.testing.assert_close(records[0]["jacobian"], torch.full((5,), t1 * d * a**2, dtype=torch.float64))
    torch.testing.assert_close(z, x * math.exp(a * t1), atol=1e-8, rtol=1e-8)  # the state is still the flow's map
    torch.testing.assert_close(ladj, torch.full((5,), d * a * t1, dtype=torch.float64))
    assert flow.forward_with_integrals(x)[2] == []  # no names: no integrals
    with pytest.raises(ValueError, match="unknown integrals"):
        flow.forward_with_integrals(x, names=["speed"])


def test_forward_with_integrals_of_a_chain_is_its_forward_with_each_solve_s_integrals():
    torch.manual_seed(0)
    blocks = [ContinuousFlow(VectorField(2, hidden=(8,)), 2, atol=1e-6, rtol=1e-6).double() for _ in range(2)]
    chain = Chain(Standardization([1.0, -1.0], [2.0, 0.5]), *blocks).double()
    x = torch.randn(6, 2, dtype=torch.float64)
    z, ladj, records = chain.forward_with_integrals(x)
    expected_z, expected_ladj = chain(x)
    assert torch.equal(z, expected_z) and torch.equal(ladj, expected_ladj) and records == []
    z, ladj, records = chain.forward_with_integrals(x, names=("kinetic",))
    y, total = chain[0](x)
    for block, record in zip(blocks, records, strict=True):  # one dict a solve, in the chain's order
        y, block_ladj, (expected,) = block.forward_with_integrals(y, names=("kinetic",))
        total = total + block_ladj
        assert torch.equal(record["kinetic"], expected["kinetic"])
    assert torch.equal(z, y) and torch.equal(ladj, total)


def test_deprecated_trajectory_integrals_records_the_solves_in_its_block():
    a, d = 0.6, 2
    flow = ContinuousFlow(LinearField(a * torch.eye(d, dtype=torch.float64)), d, atol=1e-9, rtol=1e-9).double()
    x = torch.randn(4, d, dtype=torch.float64)
    with pytest.warns(DeprecationWarning, match="forward_with_integrals"), trajectory_integrals(flow) as records:
        z, _ = flow(x)
        flow.inverse(z)
    assert [sorted(r) for r in records] == [["jacobian", "kinetic"]] * 2  # the forward and the inverse solve
    assert torch.equal(
        records[0]["kinetic"], flow.forward_with_integrals(x, names=("kinetic", "jacobian"))[2][0]["kinetic"]
    )
    flow(x)  # outside the block nothing is recorded, and the layer is itself again
    assert len(records) == 2 and "forward" not in vars(flow)


def test_hutchinson_frobenius_estimate_is_unbiased():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(3, 3, generator=gen, dtype=torch.float64)
    flow = ContinuousFlow(LinearField(a), 3, t1=0.5, trace="hutchinson", atol=1e-8, rtol=1e-8).double()
    torch.manual_seed(0)
    with torch.no_grad():
        _, _, records = flow.forward_with_integrals(
            torch.randn(1, 3, dtype=torch.float64).expand(10_000, 3), names=["jacobian"]
        )
    estimates = records[0]["jacobian"]
    se = estimates.std().item() / math.sqrt(estimates.numel())
    assert abs(estimates.mean().item() - 0.5 * a.square().sum().item()) < 3 * se


def test_regularized_likelihood_adds_the_weighted_integrals_and_reports_nfe():
    torch.manual_seed(0)
    flow = Flow(ContinuousFlow(VectorField(2, hidden=(8,)), 2, atol=1e-6, rtol=1e-6), StandardNormal(2))
    x = torch.randn(16, 2)
    plain = RegularizedLikelihood()
    nll = plain.loss(flow, x)
    assert set(plain.metrics()) == {"nll", "nfe", "t1"} and plain.metrics()["nfe"] > 0
    torch.testing.assert_close(nll, -flow.log_prob(x).mean())
    objective = RegularizedLikelihood(kinetic=0.3, jacobian=0.2)
    total = objective.loss(flow, x)
    m = objective.metrics()
    torch.testing.assert_close(total.item(), m["nll"] + 0.3 * m["kinetic"] + 0.2 * m["jacobian"], rtol=1e-5, atol=1e-5)
    assert abs(m["nll"] - nll.item()) < 1e-3  # the extra states barely move the solve


def test_regularized_likelihood_refuses_a_flow_that_does_not_pass_the_integrals_on():
    field = ContinuousFlow(VectorField(2, hidden=(8,)), 2, atol=1e-6, rtol=1e-6)
    flow = Flow(Invert(field), StandardNormal(2))  # Invert's forward is the field's inverse solve: no integrals
    with pytest.raises(ValueError, match="integrals of 0 of its 1 ContinuousFlow"):
        RegularizedLikelihood(kinetic=1.0).loss(flow, torch.randn(8, 2))
    RegularizedLikelihood().loss(flow, torch.randn(8, 2))  # plain maximum likelihood needs none


def test_learn_end_time_converges_to_the_optimum_of_the_regularised_likelihood():
    # f(x) = x and data N(0, m I): z = exp(T) x, and NLL(T) + alpha T is smallest at
    # exp(2T) = (1 - alpha / D) / m, with m the data's mean square.
    torch.manual_seed(0)
    d, alpha = 2, 0.2
    data = torch.randn(256, d, dtype=torch.float64) * math.exp(-0.5)
    m = data.square().mean().item()
    flow = Flow(
        ContinuousFlow(LinearField(torch.eye(d, dtype=torch.float64), trainable=False), d, atol=1e-7, rtol=1e-7),
        StandardNormal(d),
    ).double()
    learner = LearnEndTime(flow, lr=0.1, penalty=alpha, clip=0.5)
    history = fit(flow, RegularizedLikelihood(), data, steps=40, batch_size=256, callbacks=[learner], progress=False)
    optimum = 0.5 * math.log((1 - alpha / d) / m)
    assert abs(learner.history[-1] - optimum) < 1e-3
    assert abs(history.metrics["t1"][0] - 1.0) < 1e-12  # reported, and started at T = 1
    assert not flow.bijector.t1.requires_grad  # handed back fixed


def test_learn_end_time_clips_and_projects():
    flow = Flow(ContinuousFlow(LinearField(torch.eye(2)), 2), StandardNormal(2))
    learner = LearnEndTime(flow, lr=1.0, penalty=0.0, clip=0.25, bounds=(0.5, 2.0))
    layer = flow.bijector

    class State:
        last = type("Outcome", (), {"skipped": None})()

    learner.on_start(State())
    layer.t1.grad = torch.tensor(100.0)
    learner.on_step_end(State())
    assert layer.t1.item() == pytest.approx(0.75)  # one clipped step of 0.25
    layer.t1.grad = torch.tensor(100.0)
    learner.on_step_end(State())
    assert layer.t1.item() == pytest.approx(0.5)  # projected onto T_min


class _ExactConditionalField(nn.Module):
    """The field whose velocity is the conditional target when all data sit at one point c."""

    def __init__(self, c: torch.Tensor, sigma: float) -> None:
        super().__init__()
        self.c, self.sigma = c, sigma
        self.unused = nn.Parameter(torch.zeros(()))

    def forward(self, x, context=None, *, t):
        s = t.unsqueeze(-1)
        z = (x - (1 - s) * self.c) / (self.sigma + (1 - self.sigma) * s)
        return (1 - self.sigma) * z - self.c + 0 * self.unused


@pytest.mark.parametrize("sigma", [0.0, 0.1])
def test_flow_matching_loss_vanishes_at_the_exact_conditional_field(sigma):
    c = torch.tensor([1.5, -0.5], dtype=torch.float64)
    flow = Flow(ContinuousFlow(_ExactConditionalField(c, sigma), 2), StandardNormal(2)).double()
    data = c.expand(64, 2).clone()
    assert FlowMatching("gaussian", sigma=sigma).loss(flow, data).item() < 1e-20
    if sigma == 0.0:  # the OT path with sigma = 0 is the same straight line
        assert FlowMatching("ot", sigma=0.0).loss(flow, data).item() < 1e-20
    # A wrong field is penalised.
    flow.bijector.vector_field.c = c + 0.1
    assert FlowMatching("gaussian", sigma=sigma).loss(flow, data).item() > 1e-3


def test_minibatch_ot_pairing_beats_random_pairings():
    torch.manual_seed(0)
    x, z = torch.randn(32, 2), torch.randn(32, 2)
    best = (x - z[_ot_pairing(x, z)]).square().sum()
    for _ in range(100):
        assert best <= (x - z[torch.randperm(32)]).square().sum() + 1e-5
    assert sorted(_ot_pairing(x, z).tolist()) == list(range(32))


@pytest.mark.slow
def test_flow_matching_learns_a_gaussian_with_the_exact_likelihood_afterwards():
    torch.manual_seed(0)
    scale, loc = torch.tensor([0.5, 1.5]), torch.tensor([1.0, -1.0])
    data = torch.randn(4096, 2) * scale + loc
    entropy = (0.5 * torch.log(2 * math.pi * math.e * scale**2)).sum().item()
    field = VectorField(2, hidden=(32, 32), activation="silu", frequencies=0)
    flow = Flow(ContinuousFlow(field, 2, atol=1e-5, rtol=1e-5), StandardNormal(2))
    fit(flow, FlowMatching("ot"), data, steps=200, batch_size=256, lr=3e-3, progress=False)
    with torch.no_grad():
        nll = -flow.log_prob(torch.randn(1000, 2) * scale + loc).mean().item()
    assert abs(nll - entropy) < 0.1


def test_flow_matching_goes_through_a_fixed_standardization():
    torch.manual_seed(0)
    data = torch.randn(64, 2) * 3 + 2
    scaling = Standardization.from_data(data)
    flow = Flow(Chain(scaling, ContinuousFlow(VectorField(2, hidden=(8,)), 2)), StandardNormal(2))
    assert torch.isfinite(FlowMatching().loss(flow, data))


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="kinetic"):
        RegularizedLikelihood(kinetic=-1.0)
    with pytest.raises(ValueError, match="jacobian"):
        RegularizedLikelihood(jacobian=math.nan)
    with pytest.raises(ValueError, match="path"):
        FlowMatching(path="straight")
    with pytest.raises(ValueError, match="sigma"):
        FlowMatching(sigma=-0.1)
    realnvp = flowkit.flows.RealNVP(2, transforms=2, hidden=(8,))
    with pytest.raises(ValueError, match="ContinuousFlow"):
        LearnEndTime(realnvp)
    with pytest.raises(ValueError, match="ContinuousFlow"):
        FlowMatching().loss(realnvp, torch.randn(8, 2))
    with pytest.raises(ValueError, match="ContinuousFlow"):
        RegularizedLikelihood(kinetic=1.0).loss(realnvp, torch.randn(8, 2))
    cnf = Flow(ContinuousFlow(VectorField(2, hidden=(8,)), 2), StandardNormal(2))
    with pytest.raises(ValueError, match="bounds"):
        LearnEndTime(cnf, bounds=(2.0, 1.0))


def test_progress_bar_shows_the_objectives_progress_metrics():
    import io
    from types import SimpleNamespace

    from tqdm import tqdm

    from flowkit.train.callbacks import Progress

    progress = Progress(3, metrics=RegularizedLikelihood.progress_metrics)
    progress.bar = tqdm(total=3, file=io.StringIO(), disable=False)
    progress.on_step_end(SimpleNamespace(last=SimpleNamespace(loss=1.25, metrics={"nfe": 26.0, "t1": 1.0, "nll": 2})))
    assert progress.bar.postfix == "loss=1.25, nfe=26, t1=1"
