"""Simulators: exact likelihoods against closed forms, compensators, and the rates they simulate."""

import math

import numpy as np
import pytest
from scipy import integrate

from flowkit.events import SIMULATORS, Hawkes, MarkovModulatedPoisson, Renewal, SelfCorrecting, simulate, simulator


def test_poisson_nll_is_the_closed_form():
    process = Hawkes(mu=2.0, alpha=0.0, beta=1.0)
    seqs = process.sample(20, t_end=10.0, seed=0)
    n, total_time = seqs.num_events, 20 * 10.0
    exact = -(n * math.log(2.0) - 2.0 * total_time) / n
    assert process.nll_per_event(seqs) == pytest.approx(exact, rel=1e-12)
    # a Markov-modulated process with equal rates is the same Poisson process
    mmpp = MarkovModulatedPoisson([2.0, 2.0], [[0, 0.3], [0.5, 0]])
    assert mmpp.nll_per_event(seqs) == pytest.approx(exact, rel=1e-10)
    # so is a gamma renewal process of shape 1
    assert Renewal("gamma", shape=1.0, scale=0.5).nll_per_event(seqs) == pytest.approx(exact, rel=1e-10)


@pytest.mark.parametrize("name", ["hawkes", "hawkes-multi", "self-correcting", "renewal-gamma", "mmpp"])
def test_log_likelihood_is_log_intensities_minus_the_integral(name):
    # log p = sum log lambda*(t_i) + log p(mark) - int lambda*, with its own intensity and quadrature
    process = simulator(name)
    seq = process.sample(1, t_end=15.0, seed=4)[0]
    knots = np.concatenate([[0.0], seq.times, [seq.t_end]])
    integral = sum(
        integrate.quad(lambda t: process.intensity(seq, np.array([t]))[0], a, b, limit=200, epsabs=1e-11)[0]
        for a, b in zip(knots[:-1], knots[1:], strict=True)
    )
    ground = process.intensity(seq, seq.times - 1e-12)  # left limits at the events
    log_marks = 0.0
    if isinstance(process, Hawkes):
        rates = process._rates_before_events(seq)
        log_marks = np.log(rates[np.arange(len(seq)), seq.marks] / rates.sum(1)).sum()
    expected = np.log(ground).sum() + log_marks - integral
    assert process.sequence_log_likelihood(seq) == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_hawkes_compensator_closed_form_and_rate():
    process = Hawkes(mu=0.5, alpha=0.6, beta=2.0)
    seq = process.sample(1, t_end=30.0, seed=1)[0]
    numeric = integrate.quad(lambda t: process.intensity(seq, np.array([t]))[0], 0, 30.0, limit=500,
                             points=seq.times.tolist())[0]  # fmt: skip
    assert process.compensator(seq, 30.0).sum() == pytest.approx(numeric, rel=1e-6)
    seqs = process.sample(200, t_end=50.0, seed=2)
    assert seqs.num_events / (200 * 50.0) == pytest.approx(0.5 / (1 - 0.6), rel=0.05)


def test_self_correcting_and_renewal_rates():
    sc = SelfCorrecting(mu=1.0, alpha=1.0).sample(50, t_end=100.0, seed=0)
    assert sc.num_events / 5000 == pytest.approx(1.0, rel=0.05)
    r = Renewal("lognormal", shape=1.0, scale=math.exp(-0.5)).sample(50, t_end=100.0, seed=0)
    assert r.num_events / 5000 == pytest.approx(1.0, rel=0.1)


def test_simulate_sizes_and_bad_parameters():
    for name in SIMULATORS:
        seqs, process = simulate(name, 1000, seed=0)
        assert 500 < seqs.num_events < 2000 and math.isfinite(process.nll_per_event(seqs))
    with pytest.raises(ValueError, match="spectral radius"):
        Hawkes(mu=1.0, alpha=1.2)
    with pytest.raises(ValueError, match="unknown simulator"):
        simulator("nope")
