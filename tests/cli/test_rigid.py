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


def test_boltzmann_matrix_fisher_on_the_sphere_alone_with_convex_maps(tmp_path):
    import torch

    from flowkit import io
    from flowkit.bijectors import ConvexDoubleMoebius

    out = tmp_path / "mf"
    args = ["boltzmann", "matrix-fisher", "--aux", "0", "--components", "3", "--steps", "3", "--batch-size", "32"]
    args += ["--eval-samples", "200", "--imh-steps", "20", "--transforms", "2", "--no-progress", "--out", str(out)]
    assert main(args) in (0, None)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["event_shape"] == [4] and metrics["ess"] > 0
    assert abs(metrics["log_Z_exact"] - metrics["log_Z"]) < 10 * max(metrics["log_Z_error"], 0.05)
    flow = io.load(out / "model")
    assert [type(b) for b in flow.bijector] == [ConvexDoubleMoebius] * 2
    assert flow.sample((5,)).shape == torch.Size([5, 4])


@pytest.mark.parametrize("flag", [["--aux", "-1"], ["--components", "0"], ["--heads", "0"]])
def test_boltzmann_rigid_options_are_checked(tmp_path, capsys, flag):
    # refused by the parser (before torch is imported), with the usage and exit code 2
    with pytest.raises(SystemExit) as exit:
        main(["boltzmann", "matrix-fisher", *flag, "--steps", "1", "--no-progress", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit.value.code == 2 and err.startswith(f"flowkit boltzmann: error: argument {flag[0]}: must be"), err
