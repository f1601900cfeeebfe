"""`flowkit fit DATA --model free-form`: trained by free-form maximum likelihood, standardised, saved and reloaded."""

import json

import numpy as np
import pytest
import torch

import flowkit
from flowkit.cli import main

SMALL = ["--hidden", "16,16", "--batch-size", "128", "--no-progress"]


@pytest.mark.slow
def test_fit_model_free_form(tmp_path):
    out = tmp_path / "ff"
    args = ["fit", "moons", "--model", "free-form", "--steps", "300", "--lr", "3e-3", "--out", str(out), *SMALL]
    assert main(args) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["flow"] == "free-form" and metrics["objective"] == "FreeFormLikelihood"
    # the untrained pair is the identity: the Gaussian fit to the standardised data (3.4 nats); training beats it
    data = flowkit.data.load("moons", seed=0)
    gaussian = flowkit.data.standardize(flowkit.flows.build_flow("free-form", 2, hidden=(16, 16)), data.train)
    assert metrics["test_nll"] < float(-gaussian.log_prob(data.test).detach().mean()) - 0.1
    assert (out / "density.png").exists() and (out / "samples.png").exists()
    model = flowkit.io.load(out / "model")
    assert isinstance(model, flowkit.flows.FreeFormFlow)
    assert type(model.preprocessing).__name__ == "Standardization"  # trained on standardised data
    nll = -model.log_prob(data.test).detach().mean()
    assert abs(float(nll) - metrics["test_nll"]) < 1e-4
    samples = tmp_path / "s.npy"
    assert main(["sample", str(out / "model"), "-n", "50", "--out", str(samples), "--seed", "1"]) == 0
    assert np.load(samples).shape == (50, 2)
    torch.manual_seed(0)
    assert model.sample((1000,)).std(0).min() > 0.2  # decoded in data units (moons spread over about 1)


def test_free_form_refuses_what_does_not_apply(tmp_path, capsys):
    base = ["fit", "moons", "--model", "free-form", "--steps", "2", "--no-plots", *SMALL]
    for extra, message in (
        (["--transforms", "2"], "--transforms does not apply"),
        (["--base", "student-t"], "student-t applies to the bijective presets: FreeFormFlow is not a bijector"),
        (["--beta", "-1"], "beta must be"),
    ):
        assert main([*base, *extra, "--out", str(tmp_path / extra[0][2:])]) != 0
        assert message in capsys.readouterr().err
