"""The `flowkit` command end to end, in-process through flowkit.cli.main (one subprocess for `python -m flowkit`)."""

import json
import math
import os
import stat
import subprocess
import sys

import numpy as np
import pytest
import torch

import flowkit
from flowkit.cli import main

SMALL = ["--transforms", "1", "--hidden", "8,8", "--batch-size", "128", "--no-progress"]


@pytest.fixture(scope="module")
def moons_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "moons"
    code = main(["fit", "moons", "--steps", "40", "--out", str(out), *SMALL])
    assert code == 0
    return out


def test_python_m_flowkit_help():
    result = subprocess.run([sys.executable, "-m", "flowkit", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    for command in ("fit", "sample", "check", "bench"):
        assert command in result.stdout


@pytest.mark.parametrize(
    "argv, words",
    [
        (["fit", "moons", "--steps", "-5"], "argument --steps: must be a positive integer, got '-5'"),
        (["fit", "moons", "--lr", "0"], "argument --lr: must be a positive number, got '0'"),
        (["sample", "runs/x", "-n", "0"], "argument -n: must be a positive integer"),
        (["boltzmann", "phi4", "--imh-steps", "1"], "argument --imh-steps: must be an integer of at least 2"),
    ],
)
def test_bad_option_values_are_refused_before_torch_is_imported(argv, words):
    """Issue 38: `flowkit fit moons --steps -5` imported torch first and took 5-20 s to say so."""
    code = (
        "import sys\n"
        "from flowkit.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 2, exit.code\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert words in result.stderr.strip().splitlines()[-1]


def test_a_one_dimensional_fit_writes_marginal_png_and_files_anyone_can_read(tmp_path):
    """Issue 38: the 1-D plot was named pairwise.png; weights and checkpoints were 0600, the other outputs 0644."""
    csv, out = tmp_path / "x.csv", tmp_path / "run"
    csv.write_text("x\n" + "\n".join(f"{v:.6f}" for v in np.random.default_rng(0).standard_normal(200)) + "\n")
    umask = os.umask(0o022)
    try:
        assert main(["fit", str(csv), "--steps", "2", "--out", str(out), *SMALL]) == 0
    finally:
        os.umask(umask)
    assert (out / "marginal.png").stat().st_size > 0 and not (out / "pairwise.png").exists()
    written = ["model/weights.safetensors", "model/config.json", "checkpoint.safetensors", "metrics.json"]
    modes = {name: oct(stat.S_IMODE((out / name).stat().st_mode)) for name in [*written, "marginal.png"]}
    assert set(modes.values()) == {"0o644"}, modes


def test_fit_writes_model_metrics_history_and_plots(moons_run, capsys):
    for name in ("metrics.json", "history.csv", "training_curves.png", "density.png", "samples.png"):
        assert (moons_run / name).stat().st_size > 0, name
    metrics = json.loads((moons_run / "metrics.json").read_text())
    assert metrics["dataset"] == "moons" and metrics["flow"] == "nsf" and metrics["steps"] == 40
    # the reported NLL is the saved model's NLL on the test split, in the data's units
    model = flowkit.io.load(moons_run / "model")
    test = flowkit.data.load("moons").test
    with torch.no_grad():
        assert metrics["test_nll"] == pytest.approx(-model.log_prob(test).double().mean().item(), abs=1e-4)
    assert isinstance(model.bijector[0], flowkit.bijectors.Standardization)
    assert len((moons_run / "history.csv").read_text().strip().splitlines()) == 41


def test_sample_to_npy_and_csv(moons_run, tmp_path):
    assert main(["sample", str(moons_run / "model"), "-n", "50", "--out", str(tmp_path / "s.npy"), "--seed", "1"]) == 0
    assert main(["sample", str(moons_run / "model"), "-n", "50", "--out", str(tmp_path / "s.csv"), "--seed", "1"]) == 0
    a, b = np.load(tmp_path / "s.npy"), flowkit.data.read_array(tmp_path / "s.csv")
    assert a.shape == (50, 2) and np.isfinite(a).all()
    np.testing.assert_allclose(a, b, rtol=1e-6)  # same seed, same draw


def test_check_passes_on_a_fitted_model_and_fails_on_a_broken_one(moons_run, tmp_path, capsys):
    assert main(["check", str(moons_run / "model"), "-n", "200"]) == 0
    assert "PASS" in capsys.readouterr().out
    broken = flowkit.flows.RealNVP(2, transforms=1, hidden=(4,))
    with torch.no_grad():
        broken.bijector[0].conditioner.last.bias.fill_(1e15)  # finite (and loadable), but the round trip loses x
    flowkit.io.save(broken, tmp_path / "broken")
    assert main(["check", str(tmp_path / "broken"), "-n", "50"]) == 1
    assert "FAIL" in capsys.readouterr().out
    with torch.no_grad():
        broken.bijector[0].conditioner.last.bias.fill_(float("nan"))
    flowkit.io.save(broken, tmp_path / "nan")
    assert main(["check", str(tmp_path / "nan"), "-n", "50"]) == 2
    assert "non-finite" in capsys.readouterr().err


def test_fit_a_csv_file_and_digits_bits_per_dim(tmp_path):
    x = np.random.default_rng(0).normal(size=(300, 3)) * [1, 10, 100]
    lines = ["a,b,c"] + [",".join(map(str, row)) for row in x]
    (tmp_path / "d.csv").write_text("\n".join(lines))
    assert (
        main(
            [
                "fit",
                str(tmp_path / "d.csv"),
                "--flow",
                "maf",
                "--steps",
                "5",
                "--out",
                str(tmp_path / "r"),
                "--no-plots",
                *SMALL,
            ]
        )
        == 0
    )
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert metrics["features"] == 3 and "test_bits_per_dim" not in metrics
    assert (
        main(["fit", "digits", "--flow", "realnvp", "--steps", "3", "--out", str(tmp_path / "g"), "--no-plots", *SMALL])
        == 0
    )
    metrics = json.loads((tmp_path / "g" / "metrics.json").read_text())
    expected = (metrics["test_nll"] + 64 * math.log(17)) / (64 * math.log(2))
    assert metrics["test_bits_per_dim"] == pytest.approx(expected)


def _error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    return err


def test_bad_input_gives_one_line_errors_and_exit_code_2(tmp_path, capsys, moons_run, usage_error):
    out = ["--out", str(tmp_path / "o"), "--steps", "1", "--no-plots", "--no-progress"]
    assert "no such data file" in _error(capsys, ["fit", str(tmp_path / "missing.csv"), *out])
    (tmp_path / "ragged.csv").write_text("1,2\n3\n")
    assert "bad CSV: line 2 has 1 fields, expected 2" in _error(capsys, ["fit", str(tmp_path / "ragged.csv"), *out])
    (tmp_path / "words.csv").write_text("x,y\n1,2\n3,four\n")
    assert "column 'y' is not numeric" in _error(capsys, ["fit", str(tmp_path / "words.csv"), *out])
    (tmp_path / "nan.csv").write_text("1,2\n3,nan\n")
    assert "non-finite" in _error(capsys, ["fit", str(tmp_path / "nan.csv"), *out])
    assert "unknown dataset 'mooons'" in _error(capsys, ["fit", "mooons", *out])
    assert "argument --flow: invalid choice: 'glow'" in usage_error(["fit", "moons", "--flow", "glow", *out])
    assert "no preset maf-coupling" in _error(capsys, ["fit", "moons", "--flow", "maf", "--coupling", *out])
    assert "hidden sizes must be integers" in _error(capsys, ["fit", "moons", "--hidden", "a,b", *out])
    assert "hidden sizes must be integers" in _error(capsys, ["fit", "moons", "--hidden", "12,x", *out])
    assert "argument --steps: must be a positive integer" in usage_error(["fit", "moons", *out, "--steps", "0"])
    assert "missing power/data.npy" in _error(capsys, ["fit", "power", "--root", str(tmp_path), *out]).replace(
        str(tmp_path) + "/", ""
    )
    model = str(moons_run / "model")
    assert "--out must end in .npy or .csv" in _error(capsys, ["sample", model, "--out", str(tmp_path / "s.txt")])
    assert "argument -n: must be a positive integer" in usage_error(
        ["sample", model, "-n", "0", "--out", str(tmp_path / "s.npy")]
    )
    assert "no such model directory" in _error(
        capsys, ["sample", str(tmp_path / "nomodel"), "--out", str(tmp_path / "s.npy")]
    )
    assert "no such model directory" in _error(capsys, ["check", str(tmp_path / "nomodel")])
    assert "unknown model 'torch-nsf'" in _error(capsys, ["bench", "likelihood", "--models", "torch-nsf"])
    assert "no datasets to run" in _error(
        capsys, ["bench", "likelihood", "--datasets", "tabular", "--root", str(tmp_path)]
    )
    assert "unknown dataset 'nosuch'" in _error(
        capsys, ["bench", "likelihood", "--datasets", "moons,nosuch", "--steps", "1"]
    )
    assert "argument --threads: must be a positive integer" in usage_error(["bench", "likelihood", "--threads", "-1"])
    assert "argument --atol: must be a positive number" in usage_error(["check", model, "--atol", "-1"])
    assert "argument --mass-tol: must be a positive number" in usage_error(["check", model, "--mass-tol", "nan"])
    (tmp_path / "a_file").write_text("")
    assert "a_file" in _error(
        capsys,
        ["fit", "moons", "--steps", "1", "--no-plots", "--no-progress", "--out", str(tmp_path / "a_file" / "run")],
    )
    assert "a_file" in _error(capsys, ["sample", model, "-n", "2", "--out", str(tmp_path / "a_file" / "s.npy")])


def test_fit_out_an_existing_file_is_a_clean_error(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    argv = ["fit", "moons", "--steps", "1", "--no-plots", "--no-progress", *SMALL]
    err = _error(capsys, [*argv, "--out", str(tmp_path / "a_file")])
    assert f"--out {tmp_path / 'a_file'} is an existing file; --out names a directory" in err
    assert "Errno" not in err
    err = _error(capsys, [*argv, "--out", str(tmp_path / "a_file" / "run")])
    assert f"is inside {tmp_path / 'a_file'}, which is an existing file" in err and "Errno" not in err


def test_bench_likelihood_writes_valid_json_with_one_seed(tmp_path):
    out = tmp_path / "b.json"
    argv = [
        "bench",
        "likelihood",
        "--datasets",
        "moons",
        "--models",
        "flowkit-maf",
        "--steps",
        "2",
        "--seeds",
        "1",
        "--n-train",
        "200",
        "--transforms",
        "1",
        "--hidden",
        "4",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    text = out.read_text()
    assert "NaN" not in text
    assert json.loads(text)["summary"][0]["test_nll_2se_seeds"] is None  # one seed: no spread over seeds


def test_fit_kernel_coupling_puts_the_inducing_points_on_the_standardised_training_data(tmp_path):
    x = np.random.default_rng(0).normal(size=(200, 3)) * [1, 10, 100]
    np.save(tmp_path / "d.npy", x)
    argv = ["fit", str(tmp_path / "d.npy"), "--model", "kernel-coupling", "--steps", "1", "--lr", "1e-12"]
    assert main([*argv, "--out", str(tmp_path / "r"), "--no-plots", "--no-progress", "--transforms", "2"]) == 0
    flow = flowkit.io.load(tmp_path / "r" / "model")
    standardization = flow.bijector[0]
    z = standardization(torch.as_tensor(x, dtype=torch.float32))[0]
    modules = flow.bijector.modules()
    first = next(m for m in modules if isinstance(getattr(m, "conditioner", None), flowkit.nn.KernelMachine))
    points = first.conditioner.inducing_points.detach()
    rows = z[:, first.identity_idx]
    distance = torch.cdist(points, rows).min(dim=1).values  # each point is a row of the data it sees
    assert float(distance.max()) < 1e-4
