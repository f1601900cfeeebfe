"""`flowkit boltzmann matrix-fisher|octupole|dipoles`: a tiny run writes a model, metrics and the orientation plot."""

import json

import pytest

from flowkit.cli import main


@pytest.mark.parametrize("target", ["matrix-fisher", "octupole", "dipoles"])
def test_boltzmann_rigid_targets(tmp_path, target):
    out = tmp_path / target
    args = ["boltzmann", target, "--steps", "2", "--batch-size", "32", "--eval-samples", "200"]
    args += ["--imh-steps", "20", "--transforms", "1", "--hidden", "8", "--no-progress", "--out", str(out)]
    assert main(args) in (0, None)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["target"] == target and metrics["ess"] > 0
    if target != "dipoles":
        assert metrics["log_Z_exact"] is not None
    assert (out / "orientations.png").exists() and (out / "model").exists()


def test_boltzmann_octupole_with_metropolis_samples(tmp_path):
    out = tmp_path / "octupole"
    args = ["boltzmann", "octupole", "--steps", "2", "--batch-size", "32", "--eval-samples", "200", "--samples", "64"]
    args += [
        "--imh-steps",
        "20",
        "--transforms",
        "1",
        "--hidden",
        "8",
        "--no-progress",
        "--no-plots",
        "--out",
        str(out),
    ]
    assert main(args) in (0, None)
    assert json.loads((out / "metrics.json").read_text())["ml_samples"] == 64
