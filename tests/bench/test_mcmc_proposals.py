"""bench/mcmc_proposals.py at a tiny size: both studies run and report their rows."""

import json


def test_mcmc_proposals_script_reports_mode_weights_and_ess(script, tmp_path, capsys):
    module = script("mcmc_proposals")
    out = tmp_path / "m.json"
    argv = ["--dims", "2", "--funnel-dims", "3", "--betas", "0.5,1", "--steps", "3", "--n-train", "300"]
    argv += ["--chains", "4", "--chain-steps", "30", "--burn-in", "5", "--warmup", "20", "--out", str(out)]
    assert module.main(argv) == 0
    assert "| 2 |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    (row,) = result["bimodal"]
    assert 0 <= row["imh_weight"] <= 1 and row["imh_se"] >= 0 and 0 <= row["neutra_weight"] <= 1
    assert 0.5 < row["side_probability"] < 2 / 3 and 0 <= row["neutra_chains_that_crossed"] <= 1
    (four,) = result["four_modes"]  # the paper's four-mode mixture: each chain's nearest-mode fractions sum to 1
    assert four["dim"] == 2 and four["fit_steps"] == 3 and four["chain_steps"] == 30
    assert abs(sum(four["imh_weights"]) - 1) < 1e-9 and abs(sum(four["neutra_weights"]) - 1) < 1e-9
    assert 0 <= four["neutra_chains_that_crossed"] <= 1 and four["latent_distance"] > 0
    half, exact = result["funnel"]
    assert half["dim"] == 3 and half["beta"] == 0.5 and exact["beta"] == 1.0
    assert half["neutra_step_size"] > 0 and half["imh_ess_per_step"] >= 0 and half["neutra_ess_per_step"] >= 0
    assert exact["imh_acceptance"] > 0.99  # the exact transport: every IMH proposal has weight 1
