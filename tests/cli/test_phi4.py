"""`flowkit boltzmann phi4 --flow lattice`: model, observables with errors against HMC, plots."""

import json

from flowkit import io
from flowkit.cli import main
from flowkit.flows import LatticeFlow


def test_boltzmann_phi4_lattice_flow_writes_observables_and_plots(tmp_path):
    out = tmp_path / "phi4"
    argv = ["boltzmann", "phi4", "--L", "4", "--m2", "-4", "--lam", "8", "--flow", "lattice", "--z2"]
    argv += ["--transforms", "2", "--hidden", "4", "--steps", "3", "--batch-size", "16", "--eval-samples", "200"]
    argv += ["--imh-steps", "200", "--hmc-steps", "100", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    names = {p.name for p in out.iterdir()}
    assert {"configurations.png", "magnetization.png", "autocorrelation.png", "metrics.json"} <= names
    observables = json.loads((out / "metrics.json").read_text())["observables"]
    assert set(observables) == {"imh", "hmc"}
    for entry in observables.values():
        value, error = entry["chi2"]
        assert value > 0 and error >= 0 and entry["tau_int_abs_M"] > 0
    assert 0 < observables["hmc"]["acceptance"] <= 1
    assert isinstance(io.load(out / "model"), LatticeFlow)


def test_lattice_flow_needs_a_lattice(tmp_path, capsys):
    assert main(["boltzmann", "double-well", "--flow", "lattice", "--steps", "1", "--out", str(tmp_path)]) == 2
    assert "needs a lattice target" in capsys.readouterr().err
