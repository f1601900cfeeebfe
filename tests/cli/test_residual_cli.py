"""`flowkit fit DATA --model residual|planar`: the presets by name from the command line, saved and reloaded."""

import json

import pytest

import flowkit
from flowkit.cli import main


@pytest.mark.parametrize("model,layer", [("residual", "Residual"), ("planar", "Planar")])
def test_fit_model_residual_and_planar(model, layer, tmp_path):
    out = tmp_path / model
    args = ["fit", "moons", "--model", model, "--steps", "30", "--out", str(out), "--no-progress"]
    assert main([*args, "--transforms", "2", "--hidden", "16,16", "--batch-size", "128"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["flow"] == model and metrics["test_nll"] < 5
    flow = flowkit.io.load(out / "model")
    assert any(type(b).__name__ == layer for b in flow.bijector.layers[-1])
