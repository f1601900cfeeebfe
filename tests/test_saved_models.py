"""Models saved by the main of 2026-12-01 (commit 5144f5d) still load and give the same numbers.

The fixtures in ``tests/fixtures/main_2026_12_01`` were written by that commit, with the
log-densities it computed on fixed inputs (``expected.json``); they are never rewritten.
Log-densities of models with splines agree to float32 rounding (relative 5e-7 at most), not
bit for bit: the fused spline path sums its terms in another order. A weight that failed
to load would move them by far more.
"""

import json
from pathlib import Path

import pytest
import torch

import flowkit

FIXTURES = Path(__file__).parent / "fixtures" / "main_2026_12_01"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
DENSITY_MODELS = sorted(name for name in EXPECTED if name != "snf")


@pytest.mark.parametrize("name", DENSITY_MODELS)
def test_saved_model_loads_with_identical_log_prob(name):
    model = flowkit.io.load(FIXTURES / name).eval()
    record = EXPECTED[name]
    x = torch.tensor(record["x"])
    context = None if record["context"] is None else torch.tensor(record["context"])
    torch.testing.assert_close(
        model.log_prob(x, context).detach(), torch.tensor(record["log_prob"])
    )  # float32 rounding


def test_saved_stochastic_flow_loads_with_identical_samples_and_weights():
    model = flowkit.io.load(FIXTURES / "snf")
    record = EXPECTED["snf"]
    target = flowkit.distributions.DiagNormal(2, loc=1.0, scale=0.5, trainable=False)
    torch.manual_seed(record["seed"])
    x, log_w = flowkit.sampling.sample_with_log_weights(model, record["n"], target)
    # The same random draws and accept/reject decisions as the recording; the values to float32 rounding,
    # not bit for bit: the recording came from another CPU, whose vector unit may fuse multiply-adds that
    # this one rounds twice. Two couplings and three Metropolis steps are some hundred float32 operations,
    # each off by half an ulp (6e-8 relative), so 1e-5 relative (1e-6 absolute near zero) bounds their
    # sum. A flipped decision or a weight that failed to load moves a sample by O(1).
    torch.testing.assert_close(x, torch.tensor(record["x"]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(log_w, torch.tensor(record["log_w"]), rtol=1e-5, atol=1e-6)
