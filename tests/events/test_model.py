"""Event models: closed-form means, normalisation, survival, exact batching with masks, sampling, save/load."""

import numpy as np
import pytest
import torch
from scipy import integrate

import flowkit
from flowkit.events import (
    EventLikelihood,
    EventModel,
    Exponential,
    FlowInterEvent,
    Gamma,
    LogNormalMixture,
    Weibull,
    gamma_log_survival,
    ks_test,
    rescaled_residuals,
    simulate,
)

DISTRIBUTIONS = {
    "lognormmix": lambda: LogNormalMixture(history=3, components=4),
    "flow-spline": lambda: FlowInterEvent(history=3, transforms=2),
    "flow-sigmoidal": lambda: FlowInterEvent(history=3, transforms=1, transformer="sigmoidal"),
    "exponential": lambda: Exponential(history=3),
    "weibull": lambda: Weibull(history=3),
    "gamma": lambda: Gamma(history=3),
}


def _randomised(name, seed=0):
    torch.manual_seed(seed)
    d = DISTRIBUTIONS[name]().double()
    with torch.no_grad():  # a non-trivial conditional law (the flow starts as the identity)
        for p in d.conditioner.parameters():
            p.add_(0.3 * torch.randn_like(p))
        d.log_tau_mean.fill_(-0.3)
        d.log_tau_std.fill_(1.2)
    return d


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n.startswith("flow") else n for n in sorted(DISTRIBUTIONS)]
)
def test_density_integrates_to_one_and_matches_the_survival(name):
    d = _randomised(name)
    h = torch.randn(1, 3, dtype=torch.float64)
    # over log tau (tau = e^u, d tau = e^u du), on a fine grid: Simpson's rule
    u = torch.linspace(-40, 40, 400_001, dtype=torch.float64)
    with torch.no_grad():
        mass = (d.log_prob(u.exp(), h) + u).exp().numpy()
        assert integrate.simpson(mass, x=u.numpy()) == pytest.approx(1.0, abs=1e-6)
        for tau in (0.3, 1.0, 4.0):
            upper = u.numpy() >= np.log(tau)
            tail = integrate.simpson(mass[upper], x=u.numpy()[upper])
            grid_start = float(u[upper][0].exp())  # the grid's first point at or above tau
            survival = float(d.log_survival(torch.tensor([grid_start], dtype=torch.float64), h).exp())
            assert survival == pytest.approx(tail, abs=1e-6)


@pytest.mark.parametrize("name", ["lognormmix", "flow-spline", "exponential", "weibull", "gamma"])
def test_mean_equals_the_monte_carlo_mean_of_samples(name):
    # a spread in log time where 1e5 draws pin the mean to 1% (a coefficient of variation below about 1)
    d = _randomised(name, seed=1)
    with torch.no_grad():
        d.log_tau_std.fill_(0.4)
        if name in ("weibull", "gamma"):  # shape parameters above 1
            d.conditioner.last.bias[0] += 1.0
    h = torch.randn(1, 3, dtype=torch.float64).expand(100_000, 3)
    torch.manual_seed(2)
    with torch.no_grad():
        draws, mean = d.sample(h), float(d.mean(h[:1]))
    se = float(draws.std()) / len(draws) ** 0.5
    assert float(draws.mean()) == pytest.approx(mean, rel=0.01)
    assert abs(float(draws.mean()) - mean) < 4 * se
    # the draws follow the density: their survival values are uniform
    u = d.log_survival(draws[:20_000], h[:20_000]).exp().detach().numpy()
    assert np.abs(np.sort(u) - np.linspace(0, 1, len(u))).max() < 0.015


def test_gamma_survival_gradients():
    alpha = torch.tensor([0.4, 1.0, 3.0], dtype=torch.float64, requires_grad=True)
    x = torch.tensor([0.2, 2.0, 1.5], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(gamma_log_survival, (alpha, x), eps=1e-6, atol=1e-5)


CONFIGS = [
    dict(distribution=d, encoder=e)
    for d in ("lognormmix", "flow", "exponential", "weibull", "gamma")
    for e in ("gru", "transformer", "none")
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c['distribution']}-{c['encoder']}")
def test_batch_loss_is_the_sum_of_the_sequences_alone(config):
    torch.manual_seed(0)
    seqs, _ = simulate("hawkes-multi", 300, seed=1)
    model = EventModel(num_marks=2, hidden=8, **config).double().standardize_(seqs)
    with torch.no_grad():
        together = model.log_prob(seqs)
        alone = torch.cat([model.log_prob(seqs.subset([i])) for i in range(len(seqs))])
        assert torch.allclose(together, alone, rtol=0, atol=1e-10)
        loss = EventLikelihood().loss(model, seqs.as_fit_data())
    assert float(loss) == pytest.approx(-float(alone.sum()) / seqs.num_events, abs=1e-10)


def test_survival_term_of_the_open_interval():
    model = EventModel(distribution="exponential", encoder="none").double()
    with torch.no_grad():
        model.distribution.conditioner.last.bias.fill_(np.log(2.0))  # rate 2 (log-time mean 0)
    seqs = flowkit.events.EventSequences([{"times": [0.5, 1.0], "t_end": 3.0}])
    # two events at rate 2: 2 log 2 - 2 * 1.0, then survival exp(-2 * 2.0) of the open interval
    expected = 2 * np.log(2.0) - 2.0 - 4.0
    assert float(model.log_prob(seqs).detach()) == pytest.approx(expected, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("encoder, t_end", [("gru", 1000.0), ("transformer", 3000.0)])
def test_ancestral_samples_pass_the_model_s_own_time_rescaling_test(encoder, t_end):
    # long windows: the censored last interval of each sequence (which biases the residuals low) is a small part
    torch.manual_seed(3)
    seqs, _ = simulate("hawkes-multi", 200, seed=0)
    model = EventModel(num_marks=2, encoder=encoder, hidden=8).double().standardize_(seqs)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    samples = model.sample(32, t_end=t_end, seed=5)
    assert samples.num_marks == 2 and samples.num_events > 40 * len(samples)
    statistic, pvalue = ks_test(rescaled_residuals(model, samples))
    assert pvalue > 1e-3, statistic


def test_predict_shapes_and_marks():
    seqs, _ = simulate("hawkes-multi", 200, seed=0)
    model = EventModel(num_marks=2, hidden=8, marks_on_time=True).double().standardize_(seqs)
    mean, marks = model.predict(seqs)
    assert mean.shape == marks.shape == seqs.batch().tau.shape
    assert bool((mean > 0).all()) and set(marks.unique().tolist()) <= {0, 1}


def test_save_and_load_round_trip(tmp_path):
    seqs, _ = simulate("hawkes-multi", 200, seed=0)
    model = EventModel(num_marks=2, distribution="flow", encoder="transformer", hidden=8).double()
    model.standardize_(seqs)
    flowkit.io.save(model, tmp_path / "m")
    loaded = flowkit.io.load(tmp_path / "m")
    assert torch.equal(loaded.log_prob(seqs), model.log_prob(seqs))


def test_bad_model_arguments():
    with pytest.raises(ValueError, match="distribution must be one of"):
        EventModel(distribution="poisson")
    with pytest.raises(ValueError, match="encoder must be one of"):
        EventModel(encoder="lstm")
    seqs, _ = simulate("hawkes-multi", 100, seed=0)
    with pytest.raises(ValueError, match="2 marks, the model 1"):
        EventModel().double().log_prob(seqs)


def test_length_buckets_cover_every_sequence_once_with_less_padding():
    from flowkit.events import LengthBucketSampler

    lengths = np.random.default_rng(0).integers(1, 200, size=1000)
    sampler = LengthBucketSampler(lengths.tolist(), batch_size=16, seed=1)
    batches = list(sampler.index_batches())
    assert len(batches) == len(sampler) == 63
    assert sorted(torch.cat(batches).tolist()) == list(range(1000))
    padded = sum(len(b) * lengths[b.numpy()].max() for b in batches)
    assert padded < 1.1 * lengths.sum()  # random batches of 16 pad to about 1.8 times
    sampler.set_epoch(0, skip=60)
    assert [b.tolist() for b in sampler.index_batches()] == [b.tolist() for b in batches[60:]]
    sampler.set_epoch(1)
    assert [b.tolist() for b in sampler.index_batches()] != [b.tolist() for b in batches]
