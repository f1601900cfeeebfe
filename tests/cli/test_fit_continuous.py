"""`flowkit fit DATA --model cnf` with --regularize and --train flow-matching."""

import json

import numpy as np
import pytest

from flowkit.cli import main
from flowkit.cli.fit import _regularizers
from flowkit.data.toy import toy


@pytest.fixture
def small_csv(tmp_path):
    path = tmp_path / "moons.csv"
    np.savetxt(path, toy("moons", 300, seed=0), delimiter=",")
    return path


@pytest.mark.parametrize(
    "options,objective",
    [
        (["--regularize", "kinetic,jacobian=0.05"], "RegularizedLikelihood"),
        (["--train", "flow-matching"], "FlowMatching"),
    ],
)
def test_fit_cnf_writes_exact_nlls(small_csv, tmp_path, options, objective):
    out = tmp_path / "run"
    argv = ["fit", str(small_csv), "--model", "cnf", "--hidden", "8", "--steps", "3", "--batch-size", "64"]
    assert main([*argv, *options, "--out", str(out), "--no-plots", "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["flow"] == "cnf" and metrics["objective"] == objective
    assert np.isfinite(metrics["test_nll"])
    history = (out / "history.csv").read_text().splitlines()[0].split(",")
    if objective == "RegularizedLikelihood":
        assert {"nfe", "t1", "kinetic", "jacobian"} <= set(history)


def test_regularize_parsing_and_errors(small_csv, tmp_path, capsys):
    assert _regularizers("kinetic,jacobian=0.05") == {"kinetic": 0.01, "jacobian": 0.05}
    assert _regularizers(None) == {}
    for bad, message in [("speed", "unknown regulariser 'speed'"), ("kinetic=-1", "finite and >= 0")]:
        with pytest.raises(ValueError, match=message):
            _regularizers(bad)
    argv = ["fit", str(small_csv), "--steps", "1", "--out", str(tmp_path / "r"), "--no-plots", "--no-progress"]
    assert main([*argv, "--model", "maf", "--regularize", "kinetic"]) != 0
    assert "need a continuous flow (--model cnf)" in capsys.readouterr().err
    assert main([*argv, "--model", "cnf", "--train", "flow-matching", "--regularize", "kinetic"]) != 0
    assert "--regularize applies to --train likelihood" in capsys.readouterr().err
