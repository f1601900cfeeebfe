"""Stochastic normalizing flows: path weights of Metropolis and Langevin blocks against exact answers."""

import math

import pytest
import torch
from cases import STOCHASTIC_BLOCKS, missing_cases

import flowkit
from flowkit.bijectors import AffineCoupling, Invert, LULinear
from flowkit.distributions import DiagNormal, StandardNormal
from flowkit.flows import LangevinBlock, MetropolisBlock, RealNVP, StochasticBlock, StochasticFlow
from flowkit.targets import energy_of
from flowkit.testing import randomize


class GaussianEnergy:
    """Unnormalised diagonal Gaussian energy 0.5 |(x - mean) / std|^2, with its exact log Z."""

    def __init__(self, mean, std):
        self.mean = torch.as_tensor(mean, dtype=torch.float64)
        self.std = torch.as_tensor(std, dtype=torch.float64)
        self.event_shape = self.mean.shape
        self.log_Z = float(torch.log(self.std * math.sqrt(2 * math.pi)).sum())

    def energy(self, x):
        return 0.5 * ((x - self.mean) / self.std).square().sum(-1)


TARGET = GaussianEnergy([1.0, -0.5], [0.6, 1.4])


def standard_normal_flow(*layers):
    return StochasticFlow(layers, StandardNormal(2)).double()


def weighted_estimates(x, log_w):
    """Self-normalised mean and variance per dimension and log mean w, each with its standard error."""
    log_w = log_w.double()
    n = log_w.shape[0]
    w = torch.softmax(log_w, 0)[:, None]
    mean = (w * x).sum(0)
    se_mean = (w.square() * (x - mean).square()).sum(0).sqrt()
    sq = (x - mean).square()
    var = (w * sq).sum(0)
    se_var = (w.square() * (sq - var).square()).sum(0).sqrt()
    log_z = torch.logsumexp(log_w, 0) - math.log(n)
    scaled = torch.exp(log_w - log_w.max())
    se_log_z = scaled.std() / scaled.mean() / math.sqrt(n)
    return mean, se_mean, var, se_var, log_z, se_log_z


def assert_exact_within_3_se(x, log_w, target):
    mean, se_mean, var, se_var, log_z, se_log_z = weighted_estimates(x, log_w)
    assert torch.all((mean - target.mean).abs() < 3 * se_mean), (mean, target.mean, se_mean)
    assert torch.all((var - target.std.square()).abs() < 3 * se_var), (var, target.std.square(), se_var)
    assert abs(log_z - target.log_Z) < 3 * se_log_z, (float(log_z), target.log_Z, float(se_log_z))
    return se_log_z


SCHEDULES = {
    "one block at lam=1": [1.0],
    "lam 1/3, 2/3, 1": [1 / 3, 2 / 3, 1.0],
    "lam 0.5, then 0 (ends at the prior)": [0.5, 0.0],
}
CASES = [
    (MetropolisBlock, 0.1, "one block at lam=1"),
    (MetropolisBlock, 0.5, "lam 1/3, 2/3, 1"),
    (MetropolisBlock, 2.0, "lam 0.5, then 0 (ends at the prior)"),
    (LangevinBlock, 0.02, "lam 1/3, 2/3, 1"),
    (LangevinBlock, 0.1, "one block at lam=1"),
    (LangevinBlock, 0.3, "lam 0.5, then 0 (ends at the prior)"),
]


@pytest.mark.parametrize("block,step_size,schedule", CASES, ids=[f"{b.__name__}-{s}-{k}" for b, s, k in CASES])
def test_blocks_alone_give_exact_weighted_estimates(block, step_size, schedule):
    # sampling runs the chain backwards: the first layer listed is the last applied (data side)
    layers = [block(TARGET, lam, n_steps=4, step_size=step_size) for lam in reversed(SCHEDULES[schedule])]
    flow = standard_normal_flow(*layers)
    with torch.no_grad():
        x, log_w = flowkit.sampling.sample_with_log_weights(flow, 40_000, TARGET)
    assert x.shape == (40_000, 2) and log_w.shape == (40_000,)
    assert_exact_within_3_se(x, log_w, TARGET)


def test_without_the_path_increments_the_estimates_are_wrong():
    """The same paths weighted as if the blocks had no dS: log Z misses by many standard errors."""
    flow = standard_normal_flow(MetropolisBlock(TARGET, 1.0, n_steps=4), MetropolisBlock(TARGET, 0.5, n_steps=4))
    z = torch.randn(40_000, 2, dtype=torch.float64)
    with torch.no_grad():
        x, log_w_with_d_s = flowkit.sampling.log_weights_at(flow, z, TARGET)
    log_w = -TARGET.energy(x) - flow.base.log_prob(z)
    d_s = log_w_with_d_s - log_w
    *_, log_z, se = weighted_estimates(x, log_w + d_s)
    assert abs(log_z - TARGET.log_Z) < 3 * se
    *_, log_z_naive, se_naive = weighted_estimates(x, log_w)
    assert abs(log_z_naive - TARGET.log_Z) > 10 * se_naive


def test_mixed_chain_of_bijections_and_blocks_gives_log_z():
    layers = [
        MetropolisBlock(TARGET, 1.0, n_steps=3, step_size=0.4),
        randomize(AffineCoupling(2, hidden=(8,)), scale=0.2, seed=1),
        LangevinBlock(TARGET, 0.5, n_steps=3, step_size=0.05),
        randomize(LULinear(2), scale=0.2, seed=2),
    ]
    flow = standard_normal_flow(*layers)
    with torch.no_grad():
        x, log_w = flowkit.sampling.sample_with_log_weights(flow, 40_000, TARGET)
    assert_exact_within_3_se(x, log_w, TARGET)


def test_metropolis_weights_telescope_when_base_equals_target():
    # target = the standard normal energy 0.5|x|^2 (unnormalised): u_lambda is the same for all lambda
    same = GaussianEnergy([0.0, 0.0], [1.0, 1.0])
    flow = standard_normal_flow(*[MetropolisBlock(same, lam, n_steps=5, step_size=0.8) for lam in (1.0, 0.5, 0.0)])
    with torch.no_grad():
        x, log_w = flowkit.sampling.sample_with_log_weights(flow, 2000, same)
    torch.testing.assert_close(log_w, torch.full_like(log_w, same.log_Z), atol=1e-10, rtol=0)
    assert x.std(0).min() > 0.5  # the chain did move

    # an explicit base equal to the target, and the flow's base the same distribution
    base = DiagNormal(2, loc=0.5, scale=1.5, trainable=False).double()
    flow = StochasticFlow([MetropolisBlock(base, lam, n_steps=5, base=base) for lam in (1.0, 0.3)], base)
    with torch.no_grad():
        _, log_w = flowkit.sampling.sample_with_log_weights(flow, 2000, base)
    torch.testing.assert_close(log_w, torch.zeros_like(log_w), atol=1e-10, rtol=0)


def test_langevin_increment_is_the_log_ratio_of_transition_densities():
    block = LangevinBlock(TARGET, lam=0.7, n_steps=1, step_size=0.2)
    y = torch.randn(500, 2, dtype=torch.float64)
    y_new, d_s = block.inverse(y)
    eps = block.step_size

    def grad_u(v):  # u_lambda = 0.3 * 0.5|v|^2 + 0.7 * target, by hand
        return 0.3 * v + 0.7 * (v - TARGET.mean) / TARGET.std.square()

    def log_kernel(a, b):  # log q(a -> b) of the Langevin step
        return torch.distributions.Normal(a - eps * grad_u(a), math.sqrt(2 * eps)).log_prob(b).sum(-1)

    torch.testing.assert_close(d_s, log_kernel(y_new, y) - log_kernel(y, y_new), atol=1e-10, rtol=0)
    # the data -> latent direction uses the same rule
    back, d_s_back = block(y_new)
    torch.testing.assert_close(d_s_back, log_kernel(back, y_new) - log_kernel(y_new, back), atol=1e-10, rtol=0)


def test_metropolis_increment_is_the_interpolated_energy_difference():
    block = MetropolisBlock(TARGET, lam=0.25, n_steps=1, step_size=0.7)
    y = torch.randn(2000, 2, dtype=torch.float64)
    y_new, d_s = block.inverse(y)

    def u_lam(v):
        return 0.75 * 0.5 * v.square().sum(-1) + 0.25 * TARGET.energy(v)

    moved = (y_new != y).any(-1)
    torch.testing.assert_close(d_s, u_lam(y_new) - u_lam(y), atol=1e-12, rtol=0)
    assert torch.all(d_s[~moved] == 0)
    # acceptance rate of one step matches E[min(1, exp(-du))] over proposals (within 5 standard errors)
    proposals = y + 0.7 * torch.randn_like(y)
    expected = torch.exp(-(u_lam(proposals) - u_lam(y))).clamp(max=1).mean()
    rate = moved.double().mean()
    assert abs(rate - expected) < 5 * math.sqrt(expected * (1 - expected) / len(y))


def test_metropolis_block_leaves_its_distribution_invariant():
    """Exact samples of u_lambda (a Gaussian) stay distributed as u_lambda after the block."""
    lam = 0.6
    precision = (1 - lam) + lam / TARGET.std.square()
    mean = lam * TARGET.mean / TARGET.std.square() / precision
    y = mean + torch.randn(40_000, 2, dtype=torch.float64) / precision.sqrt()
    y_new, _ = MetropolisBlock(TARGET, lam, n_steps=5, step_size=1.0).inverse(y)
    se_mean = (1 / precision / len(y)).sqrt()
    assert torch.all((y_new.mean(0) - mean).abs() < 3 * se_mean)
    se_var = (2 / precision.square() / len(y)).sqrt()
    assert torch.all((y_new.var(0) - 1 / precision).abs() < 3 * se_var)


def test_metropolis_gradient_treats_the_accept_indicator_as_constant():
    """Reparameterised Metropolis: d y_end / d y_start = I and d dS / d y_start = grad u(y_end) - grad u(y_start)."""
    block = MetropolisBlock(TARGET, lam=0.4, n_steps=6, step_size=0.5)
    y = torch.randn(500, 2, dtype=torch.float64, requires_grad=True)
    y_new, d_s = block.inverse(y)
    assert (y_new != y).any(-1).float().mean() > 0.3  # the moves are not all rejected
    direction = torch.randn_like(y_new)
    (grad_y,) = torch.autograd.grad((y_new * direction).sum(), y, retain_graph=True)
    torch.testing.assert_close(grad_y, direction, atol=1e-12, rtol=0)
    (grad_s,) = torch.autograd.grad(d_s.sum(), y)

    def grad_u(v):
        v = v.detach().requires_grad_(True)
        return torch.autograd.grad(block.energy(v).sum(), v)[0]

    torch.testing.assert_close(grad_s, grad_u(y_new) - grad_u(y), atol=1e-12, rtol=0)


def test_deterministic_flow_weights_and_path_likelihood_match_exact_density():
    flow = randomize(RealNVP(2, transforms=2, hidden=(8,)), scale=0.2).double()
    x, log_w = flowkit.sampling.sample_with_log_weights(flow, 100, TARGET)
    torch.testing.assert_close(log_w, -TARGET.energy(x) - flow.log_prob(x), atol=1e-10, rtol=0)
    data = torch.randn(50, 2, dtype=torch.float64)
    torch.testing.assert_close(flow.path_log_likelihood(data), flow.log_prob(data), atol=0, rtol=0)
    assert log_w.requires_grad  # reparameterised


def test_stochastic_flow_refuses_log_prob_and_gives_path_likelihood():
    flow = standard_normal_flow(MetropolisBlock(TARGET, 1.0), LangevinBlock(TARGET, 0.5))
    assert isinstance(flow, StochasticFlow)
    x = torch.randn(10, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="stochastic flow.*sample_with_log_weights"):
        flow.log_prob(x)
    assert flow.path_log_likelihood(x).shape == (10,)
    assert flow.sample(7).shape == (7, 2)  # sampling works without gradients, Langevin forces included
    with pytest.raises(ValueError, match="MetropolisBlock is not a flowkit Bijector"):
        Invert(MetropolisBlock(TARGET, 1.0))


def test_langevin_path_gradient_matches_finite_differences():
    """Reparameterised gradient through Langevin steps (double backward) against central differences."""
    layer = randomize(AffineCoupling(2, hidden=(4,)), scale=0.3).double()
    flow = StochasticFlow([LangevinBlock(TARGET, 1.0, n_steps=3, step_size=0.05), layer], StandardNormal(2)).double()
    param = next(p for p in flow.parameters() if p.dim() == 2)

    def objective():
        torch.manual_seed(5)
        return -flowkit.sampling.sample_with_log_weights(flow, 64, TARGET)[1].mean()

    objective().backward()
    analytic = param.grad[0, 0].item()
    h = 1e-5
    with torch.no_grad():
        param[0, 0] += h
        up = objective().item()
        param[0, 0] -= 2 * h
        down = objective().item()
        param[0, 0] += h
    assert analytic != 0
    assert abs(analytic - (up - down) / (2 * h)) < 1e-6 * max(1.0, abs(analytic))


def _train(flow, loss_fn, steps, lr=1e-2):
    optimiser = torch.optim.Adam(flow.parameters(), lr=lr)
    for _ in range(steps):
        optimiser.zero_grad()
        loss = loss_fn()
        loss.backward()
        optimiser.step()


def _snf():
    torch.manual_seed(1)
    return StochasticFlow(
        [
            MetropolisBlock(TARGET, 1.0, n_steps=2, step_size=0.3),
            AffineCoupling(2, parity=0, hidden=(16,)),
            LangevinBlock(TARGET, 0.5, n_steps=2, step_size=0.02),
            AffineCoupling(2, parity=1, hidden=(16,)),
        ],
        StandardNormal(2),
    ).double()


def _mean_over_seeds(fn, seeds=range(4)):
    values = []
    for seed in seeds:
        torch.manual_seed(100 + seed)
        values.append(fn().item())
    return sum(values) / len(values)


@pytest.mark.parametrize("objective", ["reverse KL on path space", "maximum likelihood backwards"])
def test_snf_training_decreases_the_loss(objective):
    flow = _snf()
    data = TARGET.mean + TARGET.std * torch.randn(4000, 2, dtype=torch.float64)
    if objective == "reverse KL on path space":

        def loss_fn():
            return -flowkit.sampling.sample_with_log_weights(flow, 512, TARGET)[1].mean()

    else:

        def loss_fn():
            return -flow.path_log_likelihood(data[torch.randint(len(data), (512,))]).mean()

    with torch.no_grad():
        before = _mean_over_seeds(loss_fn)
    _train(flow, loss_fn, steps=60, lr=2e-2)
    with torch.no_grad():
        after = _mean_over_seeds(loss_fn)
    # lower bounds: the reverse path KL >= -log Z; the backward path NLL >= entropy of the data
    floor = -TARGET.log_Z if objective.startswith("reverse") else TARGET.log_Z + 1.0
    assert after < before - 0.3, (before, after)
    assert after > floor - 0.05, (after, floor)


def test_float32_sampling_with_weights():
    target = DiagNormal(2, loc=1.0, scale=0.5, trainable=False)
    flow = StochasticFlow(
        [MetropolisBlock(target, 1.0, n_steps=3), LangevinBlock(target, 0.5, n_steps=2)], StandardNormal(2)
    )
    x, log_w = flowkit.sampling.sample_with_log_weights(flow, 100, target)
    assert x.dtype == torch.float32 and log_w.dtype == torch.float32 and torch.isfinite(log_w).all()


def test_save_and_load_round_trip(tmp_path):
    target = DiagNormal(2, loc=1.0, scale=0.5, trainable=False)
    flow = StochasticFlow(
        [MetropolisBlock(target, 0.7, n_steps=3, step_size=0.4), AffineCoupling(2, hidden=(4,))], StandardNormal(2)
    )
    flowkit.io.save(flow, tmp_path / "snf")
    loaded = flowkit.io.load(tmp_path / "snf")
    block = loaded.layers[0]
    assert isinstance(block, MetropolisBlock) and (block.lam, block.n_steps, block.step_size) == (0.7, 3, 0.4)
    torch.manual_seed(3)
    a = flowkit.sampling.sample_with_log_weights(flow, 20, target)[1]
    torch.manual_seed(3)
    b = flowkit.sampling.sample_with_log_weights(loaded, 20, target)[1]
    torch.testing.assert_close(a, b)


def test_every_public_block_has_a_case():
    missing = missing_cases(StochasticBlock, STOCHASTIC_BLOCKS)
    assert not missing, f"add a case to tests/cases.py STOCHASTIC_BLOCKS for: {', '.join(missing)}"


@pytest.mark.parametrize("name", STOCHASTIC_BLOCKS)
def test_blocks_give_finite_outputs_both_ways_in_float64(name):
    block, x = STOCHASTIC_BLOCKS[name]()
    block, x = block.double(), x.double()
    for direction in (block.forward, block.inverse):
        y, d_s = direction(x)
        assert y.shape == x.shape and d_s.shape == x.shape[:1]
        assert torch.isfinite(y).all() and torch.isfinite(d_s).all()


class _BadEnergy:
    event_shape = (2,)

    def energy(self, x):
        return x.square()  # per element instead of per event


@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: MetropolisBlock(TARGET, lam=1.5), "lam must be a number in \\[0, 1\\]"),
        (lambda: LangevinBlock(TARGET, lam=0.5, n_steps=0), "n_steps must be a positive integer"),
        (lambda: LangevinBlock(TARGET, lam=0.5, step_size=-0.1), "step_size must be a positive"),
        (lambda: MetropolisBlock(object(), lam=0.5), "target must have an energy"),
        (lambda: MetropolisBlock(TARGET, lam=0.5, base=StandardNormal(3)), "base's event shape"),
        (lambda: MetropolisBlock(_BadEnergy(), lam=1.0)(torch.randn(4, 2)), "expected one energy per event"),
        (lambda: MetropolisBlock(TARGET, lam=1.0)(torch.randn(4, 3)), "event shape"),
    ],
)
def test_bad_input_raises_value_error(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_energy_of_calls_the_energy_method():
    x = torch.randn(5, 2, dtype=torch.float64)
    expected = 0.5 * (((x[:, 0] - 1.0) / 0.6) ** 2 + ((x[:, 1] + 0.5) / 1.4) ** 2)
    torch.testing.assert_close(energy_of(TARGET, x, 1), expected)


def test_energy_of_a_distribution_is_minus_its_log_density():
    x = torch.randn(5, 3, dtype=torch.float64)
    model = DiagNormal(3, loc=1.0, scale=0.5, trainable=False).double()
    expected = (0.5 * ((x - 1.0) / 0.5) ** 2 + math.log(0.5) + 0.5 * math.log(2 * math.pi)).sum(-1)
    torch.testing.assert_close(energy_of(model, x, 1), expected)


def test_energy_of_keeps_every_batch_dimension():
    x = torch.randn(3, 4, 2, 2, dtype=torch.float64)
    u = energy_of(StandardNormal((2, 2)).double(), x, 2)
    assert u.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            expected = 0.5 * float((x[i, j] ** 2).sum()) + 2 * math.log(2 * math.pi)
            assert float(u[i, j]) == pytest.approx(expected, rel=1e-12)


class _FixedEnergy:
    def __init__(self, value):
        self.value = value

    def energy(self, x):
        return self.value(x)


@pytest.mark.parametrize(
    "model,match",
    [
        (torch.distributions.Normal(0.0, 1.0), "where: Normal has no energy\\(x\\) method and is not a flowkit"),
        (object(), "where: object has no energy"),
        (
            _FixedEnergy(lambda x: x.square().sum()),
            "returned \\(\\) for inputs of shape \\(4, 2\\); expected one energy per event, of shape \\(4,\\)",
        ),
        (_FixedEnergy(lambda x: x.sum(-1, keepdim=True)), "returned \\(4, 1\\) .* of shape \\(4,\\)"),
        (_FixedEnergy(lambda x: x.square()), "returned \\(4, 2\\) .* of shape \\(4,\\)"),
        (_FixedEnergy(lambda x: 1.0), "returned float for inputs"),
    ],
)
def test_energy_of_refuses_models_without_an_energy_per_event(model, match):
    with pytest.raises(ValueError, match=match):
        energy_of(model, torch.randn(4, 2), 1, where="where")


def test_energy_of_refuses_events_of_the_wrong_shape_for_a_distribution():
    with pytest.raises(ValueError, match="event shape"):
        energy_of(StandardNormal(3), torch.randn(4, 2), 1)
