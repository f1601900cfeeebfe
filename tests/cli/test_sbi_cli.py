"""`flowkit sbi TASK` end to end (flowkit/cli/sbi.py)."""

import json

import pytest

import flowkit
from flowkit.cli import main
from flowkit.cli.sbi import TASK_NAMES
from flowkit.inference import TASKS


def test_the_command_lists_the_tasks_of_the_library():
    assert tuple(TASKS) == TASK_NAMES


@pytest.mark.slow
def test_sbi_writes_model_metrics_and_plots(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["sbi", "two_moons", "--simulations", "300", "--out", str(out), "--flow", "maf", "--transforms", "1",
            "--hidden", "16", "--epochs", "2", "--posterior-samples", "200", "--calibration", "30",
            "--calibration-samples", "20", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    assert "C2ST" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "two_moons" and metrics["reference"] == "analytic"
    assert 0.4 <= metrics["c2st_mean"] <= 1 and 0 <= metrics["tarp_coverage_error"] <= 1
    for name in ("corner.png", "coverage.png", "sbc.png", "history.csv"):
        assert (out / name).stat().st_size > 0, name
    posterior = flowkit.io.load(out / "model")
    assert posterior.sample(3, flowkit.inference.TwoMoons().observation(0)[1]).shape == (3, 2)
    assert main(argv) == 2  # a run is there: --force is needed
    assert "--force" in capsys.readouterr().err


def test_sbi_refuses_an_unknown_task_and_flow(usage_error, tmp_path, capsys):
    assert "invalid choice: 'moons'" in usage_error(["sbi", "moons"])
    code = main(["sbi", "two_moons", "--simulations", "20", "--flow", "nope", "--out", str(tmp_path / "x")])
    assert code == 2 and "unknown flow 'nope'" in capsys.readouterr().err


@pytest.mark.slow
def test_sbi_regression_on_the_linear_transit_toy(tmp_path):
    out = tmp_path / "run"
    argv = ["sbi", "transit_linear", "--simulations", "10000", "--out", str(out), "--flow", "maf", "--transforms", "1",
            "--hidden", "16", "--epochs", "1", "--posterior-samples", "300", "--calibration", "30",
            "--calibration-samples", "20", "--no-progress", "--no-plots", "--regression"]  # fmt: skip
    assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["regression"] is True
    # the regression whitening is the exact posterior's standardisation here: one epoch keeps C2ST near 0.5
    assert metrics["c2st_mean"] < 0.6
