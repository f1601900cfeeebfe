"""EmbeddedFlow: an embedding of the condition trained jointly with the flow, saved and loaded with it."""

from __future__ import annotations

import pytest
import torch

import flowkit
from flowkit.embeddings import Conv1dEmbedding, DeepSetEmbedding, MLPEmbedding
from flowkit.flows import NSF, EmbeddedFlow, build_flow
from flowkit.train import MaximumLikelihood, fit


def test_an_embedded_flow_saves_and_loads_with_its_embedding(tmp_path) -> None:
    torch.manual_seed(0)
    model = build_flow("realnvp", 2, transforms=2, hidden=(8,), embedding=Conv1dEmbedding(16, 3, channels=(2,)))
    assert isinstance(model, EmbeddedFlow) and model.flow.context_features == 3
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x, y = torch.randn(4, 2), torch.randn(4, 16)
    flowkit.io.save(model, tmp_path / "m")
    loaded = flowkit.io.load(tmp_path / "m")
    torch.testing.assert_close(loaded.log_prob(x, y), model.log_prob(x, y))
    assert not torch.allclose(model.log_prob(x, y), model.log_prob(x, y + 1))
    assert model.sample((3,), y).shape == (3, 4, 2)


def test_an_embedded_flow_refuses_a_missing_or_misshapen_condition() -> None:
    model = EmbeddedFlow(NSF(2, transforms=1, hidden=(8,), context=3), MLPEmbedding(5, 3, hidden=(8,)))
    with pytest.raises(ValueError, match="needs a condition"):
        model.log_prob(torch.randn(4, 2))
    with pytest.raises(ValueError, match="shape"):
        model.log_prob(torch.randn(4, 2), torch.randn(4, 3))
    with pytest.raises(ValueError, match="dtype"):
        model.sample((2,), torch.randn(4, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="context=3"):
        EmbeddedFlow(NSF(2, transforms=1, hidden=(8,), context=4), MLPEmbedding(5, 3))
    with pytest.raises(ValueError, match="differs"):
        flowkit.flows.PRESETS["maf"](2, context=2, embedding=MLPEmbedding(5, 3))


def _sets(m: int, largest: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Theta ~ N(0, 1) and sets of 1 to `largest` observations y_i ~ N(theta, 1), padded with NaN rows."""
    theta = torch.randn(m, 1)
    n = torch.randint(1, largest + 1, (m,))
    y = theta[:, None, :] + torch.randn(m, largest, 1)
    y[torch.arange(largest)[None, :] >= n[:, None]] = float("nan")
    return theta, y, n


@pytest.mark.slow
def test_a_set_embedding_trained_with_the_flow_learns_the_posterior_of_a_varying_number_of_observations() -> None:
    # theta ~ N(0, 1), y_1..n ~ N(theta, 1) with n from 1 to 8: the posterior is N(sum y / (n + 1), 1 / (n + 1)),
    # whose width depends on n, which the set embedding must learn from the padding.
    torch.manual_seed(0)
    theta, y, _ = _sets(20000)
    embedding = DeepSetEmbedding(1, 8, hidden=(32,), set_features=16)
    model = EmbeddedFlow(NSF(1, transforms=2, hidden=(32, 32), context=8), embedding)
    fit(model, MaximumLikelihood(), (theta, y), steps=500, batch_size=256, lr=3e-3, progress=False)
    theta, y, n = _sets(5000)
    total = torch.nan_to_num(y, 0.0).sum((1, 2))
    exact = torch.distributions.Normal(total / (n + 1), (1.0 / (n + 1)).sqrt()).log_prob(theta[:, 0]).mean()
    prior = torch.distributions.Normal(0.0, 1.0).log_prob(theta[:, 0]).mean()
    with torch.no_grad():
        learnt = model.log_prob(theta, y).mean()
    assert float(exact - learnt) < 0.05, (float(learnt), float(exact), float(prior))
    assert float(learnt - prior) > 0.5
