"""``flowkit boltzmann alanine-dipeptide``: a tiny run on cached MD writes a model that loads, metrics and plots."""

import json

import pytest

pytest.importorskip("openmm")

import torch  # noqa: E402

import flowkit  # noqa: E402
from flowkit.cli import main  # noqa: E402


def test_boltzmann_alanine_dipeptide(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWKIT_DATA", str(tmp_path / "data"))
    out = tmp_path / "aldp"
    args = ["boltzmann", "alanine-dipeptide", "--temperature", "800", "--md-ns", "0.004", "--steps", "3"]
    args += ["--batch-size", "8", "--transforms", "2", "--hidden", "8", "--eval-samples", "64", "--imh-steps", "8"]
    assert main([*args, "--out", str(out), "--no-progress", "--threads", "1"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["target"] == "alanine-dipeptide" and metrics["temperature"] == 800.0 and metrics["steps"] == 3
    assert 0 <= metrics["p_phi_positive_raw"] <= 1 and 0 <= metrics["mirror_fraction"] <= 1
    # The last 10% of the MD frames are held out; the weights kept are those of the best held-out NLL.
    frames = flowkit.data.alanine_dipeptide_md(800.0, 0.004, 0)
    assert metrics["validation_samples"] == max(1, int(0.1 * frames.shape[0]))
    assert 1 <= metrics["best_step"] <= 3
    with torch.no_grad():
        held_out = flow_nll_of(flowkit.io.load(out / "model"), frames[-metrics["validation_samples"] :].float())
    assert held_out == pytest.approx(metrics["best_val_nll"], rel=1e-5)
    assert {"ramachandran.png", "history.csv"} <= {p.name for p in out.iterdir()}
    assert list((tmp_path / "data" / "alanine_dipeptide").glob("md_T800_vacuum_ns0.004_*.npy"))
    flow = flowkit.io.load(out / "model")
    assert flow.sample((2,)).shape == (2, 66)
    assert main(["boltzmann", "alanine-dipeptide", "--temperature", "-5", "--steps", "1", "--out", str(out)]) == 2


def flow_nll_of(flow, x):
    return -flow.log_prob(x).mean().item()
