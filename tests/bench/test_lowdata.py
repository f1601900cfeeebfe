"""bench/lowdata.py at a small size: the models on the same points, the paired difference, the table and JSON."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def lowdata(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_lowdata", BENCH / "lowdata.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lowdata_pairs_every_model_with_the_mlp_flow_seed_by_seed(lowdata, tmp_path, capsys):
    out = tmp_path / "lowdata.json"
    argv = ["--datasets", "moons", "--sizes", "40", "--seeds", "2", "--steps", "3", "--transforms", "2"]
    argv += ["--inducing", "4", "--hidden", "8", "--n-test", "200", "--out", str(out)]
    assert lowdata.main(argv) == 0
    assert "| moons | 40 | kernel |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["threads"] == 1 and len(result["runs"]) == 6
    rows = {row["model"]: row for row in result["summary"]}
    by = {(r["model"], r["seed"]): r["test_nll"] for r in result["runs"]}
    for model in ("kernel", "shared", "mlp"):
        expected = sum(by[(model, s)] - by[("mlp", s)] for s in (0, 1)) / 2
        assert rows[model]["difference"] == pytest.approx(expected)
    assert rows["mlp"]["difference"] == 0
    assert rows["kernel"]["parameters"] == 2 * (4 * (1 + 2) + 1 + 2)  # M (d + P) + L + P per layer
    assert rows["mlp"]["parameters"] == 2 * ((1 * 8 + 8) + (8 * 2 + 2))


def test_the_gaussian_mixture_reports_its_exact_nll_and_the_tabular_sets_skip_sizes_beyond_their_pool(lowdata):
    train, test, log_prob = lowdata.dataset("gmm8", 50, 400, seed=0)
    assert train.shape == (50, 8) and test.shape == (400, 8)
    mixture = lowdata.gaussian_mixture()
    # The exact density is the sampler's: its mean log-density on its own samples is minus its entropy, which a
    # Gaussian of the same mean and covariance (the maximum-entropy density) cannot beat.
    many = mixture.sample((20_000,))
    gaussian = torch.distributions.MultivariateNormal(many.mean(0), torch.cov(many.T))
    assert float(mixture.log_prob(many).mean()) > float(gaussian.log_prob(many).mean()) + 0.5
    assert torch.equal(log_prob(test), mixture.log_prob(test.double()))
    train, test, exact = lowdata.dataset("wine", 100, 0, seed=1)
    assert train.shape == (100, 13) and test.shape == (178 - 124, 13) and exact is None
    assert lowdata.dataset("wine", 200, 0, seed=1) is None
