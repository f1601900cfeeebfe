"""Training with flowkit's fit loop: near the exact NLL of a simulator; the time-rescaling test tells models apart."""

import pytest
import torch

from flowkit.events import EventModel, evaluate, fit_events, ks_test, rescaled_residuals, simulate


@pytest.mark.slow
def test_trained_model_reaches_the_exact_nll_and_passes_the_ks_test_where_poisson_fails(tmp_path):
    torch.manual_seed(0)
    sequences, hawkes = simulate("hawkes", 8000, seed=0)
    train, val, test = sequences.split((0.6, 0.2, 0.2), seed=0)
    exact = hawkes.nll_per_event(test)
    model = EventModel(distribution="lognormmix", hidden=32).double()
    history = fit_events(model, train, val, epochs=15, batch_size=16, lr=1e-2, progress=False, seed=0,
                         checkpoint_dir=tmp_path)  # fmt: skip
    assert (tmp_path / "model" / "config.json").exists() and len(history.val_loss) > 0
    metrics = evaluate(model, test)
    assert metrics["nll_per_event"] - exact < 0.05, (metrics, exact)
    assert metrics["ks_pvalue"] > 0.01, metrics
    # a homogeneous Poisson process (no history, exponential times) fitted to the same data
    poisson = EventModel(distribution="exponential", encoder="none", hidden=4).double()
    fit_events(poisson, train, steps=300, batch_size=16, lr=5e-2, progress=False, seed=0)
    rate = train.num_events / sum(s.t_end - s.t_start for s in train)
    mean_interval, _ = poisson.predict(test.subset([0]))
    assert float(mean_interval[0, 0]) == pytest.approx(1 / rate, rel=0.02)  # the maximum-likelihood rate
    statistic, pvalue = ks_test(rescaled_residuals(poisson, test))
    assert pvalue < 1e-6, statistic
    assert poisson.nll_per_event(test) > metrics["nll_per_event"] + 0.1
