"""bench/images.py in-process: its bits/dim accounting and the digits part (no Fashion-MNIST needed)."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from flowkit.data import bits_per_dim
from flowkit.flows import Glow
from flowkit.flows.images import Dequantized

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_images", BENCH / "images.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_images", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_bits_per_dim_of_counts_and_of_dequantised_images_agree(bench):
    # A Dequantized model is scored on the counts (D log K inside its log_prob), a flow on the dequantised
    # images (bits_per_dim adds D log K): for the same noise, the bench's two branches give the same bits/dim.
    torch.manual_seed(0)
    shape, levels, dims = (1, 4, 4), 17, 16
    flow = Glow(shape, 2, 1, hidden=(4,)).double()
    counts = torch.randint(levels, (30, *shape)).double()
    torch.manual_seed(1)
    noise = torch.rand(counts.shape, dtype=torch.float64)  # the draw Dequantized makes after the same seed
    task = bench.Task("t", shape, levels, counts, (counts + noise) / levels)
    assert torch.equal(task.test_counts(), counts)
    as_density = bench.evaluate(flow, task)
    torch.manual_seed(1)
    as_counts = bench.evaluate(Dequantized(flow, levels), task)
    assert as_counts["test_bits_per_dim"] == pytest.approx(as_density["test_bits_per_dim"], rel=1e-12)
    direct = bits_per_dim(flow.log_prob(task.test), dims, levels).mean()
    assert as_density["test_bits_per_dim"] == pytest.approx(float(direct), rel=1e-12)


def test_digits_part_runs_and_summarises_over_seeds(bench, tmp_path, capsys):
    out = tmp_path / "images.json"
    argv = ["--parts", "digits", "--digits-budget", "0.05", "--seeds", "2", "--hidden", "4", "--flat-hidden", "8"]
    assert bench.main([*argv, "--steps-per-level", "1", "--clock", "wall", "--out", str(out)]) == 0
    result = json.loads(out.read_text())["digits"]
    names = {"glow", "eiw", "glow-vdeq", "realnvp", "nsf"}
    assert {r["model"] for r in result["runs"]} == names and len(result["runs"]) == 10
    for name, summary in result["summary"].items():
        values = [r["test_bits_per_dim"] for r in result["runs"] if r["model"] == name]
        assert summary["mean"] == pytest.approx(sum(values) / 2)
        assert all(math.isfinite(v) and v > 0 for v in values)
    assert "| glow-vdeq |" in capsys.readouterr().out
