"""``flowkit boltzmann TARGET --objective fab``: FAB from the energy alone, its target evaluations counted."""

import json

from flowkit.cli import main

_SMALL = ["--transforms", "2", "--hidden", "16", "--eval-samples", "300", "--imh-steps", "30", "--no-progress"]


def test_boltzmann_fab_on_the_mixture_counts_its_target_evaluations(tmp_path):
    out = tmp_path / "gmm"
    argv = ["boltzmann", "gmm", "--objective", "fab", "--steps", "6", "--batch-size", "32", "--ais-steps", "2"]
    # --samples would feed the ML term of --objective kl; FAB uses the energy alone.
    assert main([*argv, "--samples", "500", "--no-plots", *_SMALL, "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["objective"] == "fab" and metrics["steps"] == 6
    assert metrics["train_target_evaluations"] == 6 * 32 * (1 + 2 * 5)  # one AIS run a step, 5 leapfrog steps each
    assert 0 < metrics["ess"] <= 1


def test_boltzmann_fab_with_a_replay_buffer_on_a_rigid_body(tmp_path):
    """Rigid bodies on S^3: the AIS kernel is a random walk on the manifold (HMC would be refused)."""
    out = tmp_path / "fisher"
    argv = ["boltzmann", "matrix-fisher", "--aux", "0", "--objective", "fab", "--steps", "8", "--batch-size", "16"]
    assert main([*argv, "--ais-steps", "2", "--replay-buffer", "64", "--no-plots", *_SMALL, "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    # Two AIS runs (steps 1 and 5 of 8, one per 4 steps), each 16 points at 1 + 2 random-walk moves.
    assert metrics["train_target_evaluations"] == 2 * 16 * 3
    kl = tmp_path / "kl"
    assert (
        main(
            ["boltzmann", "double-well", "--steps", "3", "--batch-size", "16", *_SMALL, "--no-plots", "--out", str(kl)]
        )
        == 0
    )
    assert json.loads((kl / "metrics.json").read_text())["train_target_evaluations"] == 3 * 16


def test_boltzmann_fab_refuses_bad_settings(tmp_path, capsys, usage_error):
    base = ["boltzmann", "double-well", "--objective", "fab", "--steps", "1", "--out", str(tmp_path)]
    assert "argument --ais-steps: must be a positive integer" in usage_error([*base, "--ais-steps", "0"])
    assert main([*base, "--ais-step-size", "nan"]) == 2
    assert "step sizes must be finite and positive" in capsys.readouterr().err
    assert main([*base, "--replay-buffer", "8", "--batch-size", "32"]) == 2
    assert "fewer than a batch of 32" in capsys.readouterr().err
