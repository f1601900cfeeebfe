"""bench/tarflow.py in-process at tiny sizes: every part runs and writes its figures."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_tarflow", BENCH / "tarflow.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_tarflow", module)
    spec.loader.exec_module(module)
    return module


def test_frechet_distance_of_gaussians(bench):
    torch.manual_seed(0)
    a = torch.randn(20000, 2, dtype=torch.float64)
    b = torch.randn(20000, 2, dtype=torch.float64) * 2 + torch.tensor([1.0, 0.0], dtype=torch.float64)
    # ||mu_a - mu_b||^2 + tr(I + 4 I - 2 * 2 I) = 1 + 2
    assert bench.frechet(a, b) == pytest.approx(3.0, abs=0.1)
    assert bench.frechet(a, a) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.slow
def test_every_part_runs_at_tiny_sizes(bench, tmp_path):
    out = tmp_path / "tarflow.json"
    tiny = ["--seeds", "1", "--budget", "0.5", "--classifier-budget", "0.5", "--align-steps", "2"]
    tiny += ["--latent-steps", "2", "--label-steps", "1", "--label-points", "5", "--rounds", "1"]
    tiny += ["--cache-batch", "2", "--test-points", "50", "--blocks", "2", "--layers", "1", "--glow-hidden", "8"]
    assert bench.main([*tiny, "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["cache"]["patches"] == 49 and results["cache"]["max_abs_difference"] < 1e-4
    models = {run["model"] for run in results["bpd_digits"]["runs"]}
    assert {"glow", "tarflow"} <= models
    ratio = [r["parameters"] for r in results["bpd_digits"]["runs"] if r["model"] == "tarflow"][0] / [
        r["parameters"] for r in results["bpd_digits"]["runs"] if r["model"] == "glow"
    ][0]
    assert 0.8 < ratio < 1.25  # equal parameter counts, within the width grid's step
    assert {r["model"] for r in results["classifier_digits"]["runs"]} == {"cnn", "tarflow-classifier"}
    assert len(results["align_digits"]["runs"]) == 2
    assert len(results["latent_digits"]["runs"]) == 3
    assert all(r["feature_frechet_distance"] >= 0 for r in results["latent_digits"]["runs"])
