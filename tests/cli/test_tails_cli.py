"""`flowkit fit --model tail-adaptive|comet` and `--base student-t` on a small heavy-tailed CSV file."""

import json

import numpy as np
import pytest

import flowkit
from flowkit.cli import main

SMALL = ["--steps", "5", "--batch-size", "128", "--transforms", "1", "--hidden", "8", "--bins", "3", "--no-plots"]


@pytest.fixture(scope="module")
def csv(tmp_path_factory):
    rng = np.random.default_rng(0)
    x = np.stack([rng.standard_normal(1500), rng.standard_t(2, 1500), rng.standard_normal(1500)], 1)
    path = tmp_path_factory.mktemp("data") / "heavy.csv"
    np.savetxt(path, x, delimiter=",")
    return path


@pytest.mark.parametrize(
    ("options", "kind"),
    [
        (["--model", "tail-adaptive"], "TailAdaptive"),
        (["--model", "comet"], "COMET"),
        (["--flow", "nsf", "--base", "student-t", "--df", "4"], "Flow"),
    ],
)
def test_fit_heavy_tailed_models(csv, tmp_path, options, kind):
    out = tmp_path / "run"
    assert main(["fit", str(csv), *options, "--out", str(out), "--no-progress", *SMALL]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert np.isfinite(metrics["test_nll"])
    model = flowkit.io.load(out / "model")
    assert type(model).__name__ == kind
    base = model.base
    if "--base" in options:
        assert type(base).__name__ == "StudentT" and base.df_raw.requires_grad
    if options[1] == "tail-adaptive":
        assert type(base).__name__ == "TailAdaptiveBase" and base.heavy.tolist() == [False, False, True]  # light first


def test_fit_robust_standardize_uses_the_median_and_quartiles(csv, tmp_path):
    out = tmp_path / "robust"
    options = ["--flow", "nsf", "--base", "student-t", "--robust-standardize", "--out", str(out), "--no-progress"]
    assert main(["fit", str(csv), *options, *SMALL]) == 0
    assert json.loads((out / "metrics.json").read_text())["robust_standardized"] is True
    scaling = flowkit.io.load(out / "model").bijector[0]
    train = flowkit.data.load(str(csv), seed=0).train.double().numpy()
    np.testing.assert_allclose(scaling.loc.numpy(), np.median(train, 0), rtol=1e-5)


def test_fit_robust_and_no_standardize_exclude_each_other(csv, tmp_path, capsys):
    argv = ["fit", str(csv), "--robust-standardize", "--no-standardize", "--out", str(tmp_path / "x"), *SMALL]
    assert main(argv) == 2
    assert "--robust-standardize and --no-standardize exclude each other" in capsys.readouterr().err
